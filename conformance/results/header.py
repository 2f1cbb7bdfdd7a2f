"""The header record: the run's environment, settings, rules files and backends, written first."""

from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from conformance.results import machine
from conformance.results.schema import SCHEMA_VERSION, figure, optional_int, string_field

PACKAGES: tuple[str, ...] = (
    "normconf",
    "numpy",
    "ml_dtypes",
    "pytest",
    "pytest-xdist",
    "torch",
    "triton",
    "onnx",
    "onnxruntime",
    "jax",
    "jaxlib",
    "flax",
    "keras",
    "onnxscript",
    "openvino",
    "transformers",
)


@dataclass(frozen=True)
class FileRef:
    """A rules file a run used (tolerances or ledger): where it was and its SHA-256."""

    path: str
    sha256: str

    @classmethod
    def from_dict(cls, raw: object) -> FileRef | None:
        if not isinstance(raw, Mapping):
            return None
        return cls(str(raw.get("path", "?")), str(raw.get("sha256", "")))


@dataclass(frozen=True)
class LedgerEntry:
    """A ledger entry as the run recorded it: what it matches, its band, reason and link."""

    index: int
    match: Mapping[str, tuple[str, ...]]
    band: tuple[float, float]
    reason: str
    link: str = ""
    training: bool | None = None
    measure: str = "worst_ratio"  # or "rounding": the band is in ulps of rounding bias
    # What the backend must have recorded in extra.info for the entry to apply (key -> allowed values).
    info: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    model: str = ""  # the executable model that explains it; "" for a band entry
    note: str = ""
    # The platform condition (device, cpu, not_cpu, versions) as recorded.
    platform: Mapping[str, Any] = field(default_factory=dict)
    file: str = ""

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LedgerEntry:
        band = raw.get("band")
        low, high = band if isinstance(band, list) and len(band) == 2 else (math.nan, math.nan)
        training = raw.get("training")
        return cls(
            optional_int(raw.get("index")) or 0,
            _table(raw.get("match")),
            (figure(low), figure(high)),
            string_field(raw, "reason"),
            string_field(raw, "link"),
            training if isinstance(training, bool) else None,
            string_field(raw, "measure", "worst_ratio"),
            _table(raw.get("info")),
            string_field(raw, "model"),
            string_field(raw, "note"),
            dict(where) if isinstance(where := raw.get("platform"), Mapping) else {},
            string_field(raw, "file"),
        )


def _indices(raw: Any) -> tuple[int, ...] | None:
    return tuple(i for i in raw if optional_int(i) is not None) if isinstance(raw, list) else None


def _table(raw: Any) -> dict[str, tuple[str, ...]]:
    """A ledger entry's key -> allowed values (match, info) as recorded: a value or a list of them."""
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): tuple(map(str, v if isinstance(v, list) else [v])) for k, v in raw.items()}


@dataclass(frozen=True)
class BackendInfo:
    """A backend as the header recorded it: its capabilities, or why it could not run (``broken``: a
    defect of the adapter, whose tests were errors, rather than an unavailability, whose were skipped)."""

    unavailable: str | None = None
    device: str = "?"
    device_name: str = ""
    ops: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    limits: Mapping[str, object] = field(default_factory=dict)
    broken: bool = False

    @classmethod
    def from_dict(cls, raw: object) -> BackendInfo:
        if not isinstance(raw, Mapping):
            return cls(device="?")
        if "unavailable" in raw:
            return cls(unavailable=str(raw["unavailable"]), broken=raw.get("broken") is True)
        limits = raw.get("limits") or {}
        return cls(
            None,
            string_field(raw, "device", "?"),
            string_field(raw, "device_name"),
            tuple(map(str, raw.get("ops") or [])),
            tuple(map(str, raw.get("dtypes") or [])),
            tuple(map(str, raw.get("features") or [])),
            dict(limits) if isinstance(limits, Mapping) else {},
        )


@dataclass(frozen=True)
class EnvironmentInfo:
    """Where a run ran: machine, platform, processor, CPUs, Python, package versions, git commit."""

    machine: str = ""
    platform: str = ""
    processor: str = ""
    cpu_count: int | None = None
    python: str = ""
    packages: Mapping[str, str | None] = field(default_factory=dict)
    git_commit: str | None = None
    # The CPU's vector features that libraries dispatch on (conformance.results.machine); None where
    # the file predates them.
    cpu_features: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, raw: object) -> EnvironmentInfo:
        if not isinstance(raw, Mapping):
            return cls()
        packages = raw.get("packages") or {}
        features = raw.get("cpu_features")
        return cls(
            string_field(raw, "machine"),
            string_field(raw, "platform"),
            string_field(raw, "processor"),
            optional_int(raw.get("cpu_count")),
            string_field(raw, "python"),
            {str(k): None if v is None else str(v) for k, v in packages.items()}
            if isinstance(packages, Mapping)
            else {},
            str(raw["git_commit"]) if raw.get("git_commit") else None,
            tuple(map(str, features)) if isinstance(features, list) else None,
        )


@dataclass(frozen=True)
class Header:
    """The first record of a results file: when, where, with what, and how the run ended.

    ``checks`` are the check names of the suite that wrote the file, in the order it runs them.
    ``ledger_entries`` are the ledger's entries as the run used them (None where the file does not
    carry them and they could not be recovered; ``ledger_note`` then says why).
    """

    schema: int
    time: str
    environment: EnvironmentInfo
    profile: str | None
    cases_file: str | None
    backends: Mapping[str, BackendInfo]
    tolerances: FileRef | None
    ledger: FileRef | None
    ledger_entries: tuple[LedgerEntry, ...] | None
    exitstatus: int | None
    shard: tuple[int, int] | None
    checks: tuple[str, ...] = ()
    ledger_note: str = ""
    # Entry indices the run observed as could-have-applied-but-unneeded ("not observed here"), None where
    # the file predates the record.
    ledger_unobserved: tuple[int, ...] | None = None

    @property
    def git_commit(self) -> str | None:
        return self.environment.git_commit

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Header:
        backends = raw.get("backends") or {}
        shard = raw.get("shard")
        part = None
        if (
            isinstance(shard, Mapping)
            and optional_int(shard.get("index")) is not None
            and optional_int(shard.get("count"))
        ):
            part = (int(shard["index"]), int(shard["count"]))
        ledger = raw.get("ledger")
        entries = ledger.get("entries") if isinstance(ledger, Mapping) else None
        exitstatus = raw.get("exitstatus")
        return cls(
            int(raw.get("schema", SCHEMA_VERSION)),
            string_field(raw, "time"),
            EnvironmentInfo.from_dict(raw.get("environment")),
            None if raw.get("profile") is None else str(raw["profile"]),
            None if raw.get("cases_file") is None else str(raw["cases_file"]),
            {str(k): BackendInfo.from_dict(v) for k, v in backends.items()}
            if isinstance(backends, Mapping)
            else {},
            FileRef.from_dict(raw.get("tolerances")),
            FileRef.from_dict(ledger),
            tuple(LedgerEntry.from_dict(e) for e in entries) if isinstance(entries, list) else None,
            optional_int(exitstatus),
            part,
            tuple(map(str, raw.get("checks") or [])),
            string_field(raw, "ledger_note"),
            _indices(ledger.get("not_observed") if isinstance(ledger, Mapping) else None),
        )


def package_versions() -> dict[str, str | None]:
    """Installed versions read from metadata, so no backend library is imported to learn them."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def environment(cwd: Path) -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "platform": platform.platform(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "cpu_features": list(machine.cpu_features()),
        "packages": package_versions(),
        "git_commit": git_commit(cwd),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def header_record(cwd: Path, **extra: Any) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {"kind": "header", "schema": SCHEMA_VERSION, "time": now, "environment": environment(cwd), **extra}
