"""pytest-benchmark JSON files (``--benchmark-json``) read into benchmark records joinable by case id.

Each entry of ``benchmarks[]`` has ``stats`` (seconds: min, max, mean, stddev, median, iqr, q1,
q3, rounds, ...) and ``extra_info``; normconf's benchmarks put ``case_id``, ``backend``, ``bytes``,
``gbps``, ``roofline_fraction`` and optionally ``check`` (forward or backward) there. Entries
without a ``case_id`` (the copy benchmark that measures the roofline) are kept as auxiliary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKS: tuple[str, ...] = ("forward", "backward")


class BenchError(ValueError):
    """A benchmark file is unreadable or not pytest-benchmark JSON; the message names the file."""


@dataclass(frozen=True)
class Benchmark:
    """One timed backend x case x check; times in seconds, ``gbps`` in 1e9 bytes per second."""

    name: str
    case_id: str
    backend: str
    check: str
    median_s: float
    iqr_s: float
    stddev_s: float
    min_s: float
    rounds: int
    bytes: int | None
    gbps: float | None
    roofline_fraction: float | None
    # The kernels alone and what a call launches and copies (GPU records, docs/benchmarks.md); None on
    # the CPU and in files written before these fields.
    device_ms: float | None = None
    launches: float | None = None
    h2d_copies: float | None = None
    device_roofline_fraction: float | None = None

    @property
    def host_ms(self) -> float | None:
        """Wall time minus the kernels' time: what the call spent on the host."""
        return None if self.device_ms is None else self.median_s * 1e3 - self.device_ms

    @property
    def key(self) -> tuple[str, str, str]:
        return self.backend, self.case_id, self.check

    @property
    def noise(self) -> float:
        """Relative spread of the timings: IQR over median (0 when there is one round)."""
        return self.iqr_s / self.median_s if self.median_s > 0 else 0.0

    @property
    def roofline_gbps(self) -> float | None:
        if self.gbps is None or not self.roofline_fraction:
            return None
        return self.gbps / self.roofline_fraction


@dataclass(frozen=True)
class Auxiliary:
    """A benchmark without a case id (e.g. the copy benchmark): shown with its median and GB/s."""

    name: str
    median_s: float
    gbps: float | None


@dataclass(frozen=True)
class BenchFile:
    path: Path
    machine: Mapping[str, Any]
    datetime: str
    version: str
    benchmarks: tuple[Benchmark, ...]
    auxiliary: tuple[Auxiliary, ...]

    def by_key(self) -> dict[tuple[str, str, str], Benchmark]:
        return {b.key: b for b in self.benchmarks}


def read(path: str | Path) -> BenchFile:
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BenchError(f"{file}: cannot read benchmark JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise BenchError(f"{file}: not pytest-benchmark JSON: expected an object with a 'benchmarks' list")
    timed: list[Benchmark] = []
    auxiliary: list[Auxiliary] = []
    for i, entry in enumerate(data["benchmarks"]):
        parsed = _entry(f"{file}: benchmarks[{i}]", entry)
        if isinstance(parsed, Benchmark):
            timed.append(parsed)
        else:
            auxiliary.append(parsed)
    return BenchFile(
        path=file,
        machine=_mapping(data.get("machine_info")),
        datetime=str(data.get("datetime", "")),
        version=str(data.get("version", "")),
        benchmarks=tuple(timed),
        auxiliary=tuple(auxiliary),
    )


def _entry(where: str, entry: Any) -> Benchmark | Auxiliary:
    if not isinstance(entry, dict) or not isinstance(entry.get("stats"), dict):
        raise BenchError(f"{where}: expected an object with 'stats'")
    stats, extra = entry["stats"], entry.get("extra_info") or {}
    name = str(entry.get("fullname") or entry.get("name") or where)
    median = _number(where, "stats.median", stats.get("median"))
    if not isinstance(extra, dict):
        raise BenchError(f"{where}: extra_info={extra!r} is not allowed; allowed: an object")
    if "case_id" not in extra:
        return Auxiliary(name, median, _optional(where, "gbps", extra.get("gbps")))
    if not isinstance(extra.get("backend"), str) or not isinstance(extra["case_id"], str):
        raise BenchError(f"{where}: extra_info needs string 'case_id' and 'backend' to join the results")
    check = extra.get("check", "forward")
    if check not in CHECKS:
        raise BenchError(f"{where}: extra_info.check={check!r} is not allowed; allowed: {', '.join(CHECKS)}")
    size = extra.get("bytes")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise BenchError(f"{where}: extra_info.bytes={size!r} is not allowed; allowed: an integer >= 0")
    gbps = _optional(where, "gbps", extra.get("gbps"))
    if gbps is None and size is not None and median > 0:
        gbps = size / median / 1e9
    return Benchmark(
        name=name,
        case_id=extra["case_id"],
        backend=extra["backend"],
        check=check,
        median_s=median,
        iqr_s=_number(where, "stats.iqr", stats.get("iqr", 0.0)),
        stddev_s=_number(where, "stats.stddev", stats.get("stddev", 0.0)),
        min_s=_number(where, "stats.min", stats.get("min", median)),
        rounds=int(stats.get("rounds", 1)),
        bytes=size,
        gbps=gbps,
        roofline_fraction=_optional(where, "roofline_fraction", extra.get("roofline_fraction")),
        device_ms=_optional(where, "device_ms", extra.get("device_ms")),
        launches=_optional(where, "launches", extra.get("launches")),
        h2d_copies=_optional(where, "h2d_copies", extra.get("h2d_copies")),
        device_roofline_fraction=_optional(
            where, "device_roofline_fraction", extra.get("device_roofline_fraction")
        ),
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(where: str, name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise BenchError(f"{where}: {name}={value!r} is not allowed; allowed: a finite number >= 0")
    return float(value)


def _optional(where: str, name: str, value: Any) -> float | None:
    return None if value is None else _number(where, f"extra_info.{name}", value)
