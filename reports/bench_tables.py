"""Markdown tables for docs/benchmarks.md from normconf benchmark JSON (pytest-benchmark's --benchmark-json).

Usage: python -m reports.bench_tables BENCH.json [--noise SECOND.json] [--interpreted]

Prints the session (device, threads, copy roofline), then: LayerNorm vs RMSNorm time per backend and
dtype; fused vs composed add+RMSNorm; float32 vs half precision (what statistics precision costs);
GroupNorm and InstanceNorm per image shape; the best and worst roofline fractions; and with --noise,
how far the medians of two identical runs lie apart. Row-op shapes are grouped by rows: decode
(<= 16 rows), mid, large (>= 2048 rows, memory-bound); GroupNorm/InstanceNorm shapes form their own
group, "image". Ratios over a group are geometric means; "roofline" is GB/s over the session's copy GB/s.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.model.case import LAYER_NORM, RMS_NORM

GROUPS = ("decode", "mid", "large")
HALF = ("bfloat16", "float16")
# Ops on (N, C, spatial...) images whose normalization groups are channel groups of each sample.
IMAGE_OPS = ("group_norm", "instance_norm")
# Backends that run add + RMSNorm as one fused kernel; the torch eager/library ones compose two ops.
FUSED = ("torch-compile", "onnxruntime", "onnx-export", "triton")


@dataclass(frozen=True)
class Rec:
    backend: str
    check: str
    op: str
    dtype: str
    shape: tuple[int, ...]
    median_s: float
    gbps: float
    roofline: float
    nbytes: int
    groups: int = 1  # channel groups per sample of GroupNorm (InstanceNorm: one per channel)

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def group(self) -> str:
        if self.op in IMAGE_OPS:
            # Rows of (N, C, H, W) are not normalization groups; image shapes are compared apart.
            return "image"
        return "decode" if self.rows <= 16 else "large" if self.rows >= 2048 else "mid"

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))


def load(path: str, interpreted: bool = False) -> tuple[dict[str, Any], list[Rec]]:
    data = json.loads(Path(path).read_text())
    recs = []
    for bench in data["benchmarks"]:
        extra = bench.get("extra_info", {})
        if "case_id" not in extra or (extra.get("interpreted") and not interpreted):
            continue
        case = extra["case"]
        recs.append(
            Rec(
                extra["backend"],
                extra["check"],
                case["op"],
                case["dtype"],
                tuple(case["shape"]),
                bench["stats"]["median"],
                extra["gbps"],
                extra["roofline_fraction"],
                extra["bytes"],
                _groups(case),
            )
        )
    return data, recs


def _groups(case: dict[str, Any]) -> int:
    """Channel groups per sample: GroupNorm's num_groups, InstanceNorm's channels, else 1."""
    if case["op"] == "instance_norm":
        return int(case["shape"][1])
    return int(case.get("num_groups") or 1)


def geomean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.0f}%"


def ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def index(recs: list[Rec]) -> dict[tuple[str, str, str, str, tuple[int, ...]], Rec]:
    return {(r.backend, r.check, r.op, r.dtype, r.shape): r for r in recs}


def pairs(recs: list[Rec], a: tuple[str, str], b: tuple[str, str], group: str, **match: str) -> list[float]:
    """Time ratios t(a) / t(b) over the shapes of ``group``; a and b are (op, dtype)."""
    by = index(recs)
    out = []
    for r in recs:
        if (r.op, r.dtype) != a or r.group != group or any(getattr(r, k) != v for k, v in match.items()):
            continue
        other = by.get((r.backend, r.check, b[0], b[1], r.shape))
        if other is not None:
            out.append(r.median_s / other.median_s)
    return out


def largest(recs: list[Rec], backend: str, check: str, op: str, dtype: str) -> Rec | None:
    found = [r for r in recs if (r.backend, r.check, r.op, r.dtype) == (backend, check, op, dtype)]
    return max(found, key=lambda r: math.prod(r.shape), default=None)


def keys(recs: list[Rec]) -> list[tuple[str, str, str]]:
    dtypes = ["float32", "bfloat16", "float16"]
    found = {(r.check, r.backend, r.dtype) for r in recs}
    return sorted(found, key=lambda k: (k[0] != "forward", k[1], dtypes.index(k[2]) if k[2] in dtypes else 9))


def ln_vs_rms(recs: list[Rec]) -> list[str]:
    rows = []
    for check, backend, dtype in keys(recs):
        cells = [
            ratio(
                geomean(
                    pairs(recs, ("layer_norm", dtype), ("rms_norm", dtype), g, backend=backend, check=check)
                )
            )
            for g in GROUPS
        ]
        ln, rms = (largest(recs, backend, check, op, dtype) for op in (LAYER_NORM, RMS_NORM))
        if ln is None or rms is None:
            continue
        rows.append([check, backend, dtype, *cells, f"{ln.median_s * 1e3:.2f} / {rms.median_s * 1e3:.2f}",
                     f"{pct(ln.roofline)} / {pct(rms.roofline)}"])  # fmt: skip
    head = ["check", "backend", "dtype", "LN/RMS decode", "LN/RMS mid", "LN/RMS large",
            "LN / RMS ms (largest)", "LN / RMS roofline (largest)"]  # fmt: skip
    return table(head, rows)


def fused_vs_composed(recs: list[Rec]) -> list[str]:
    rows = []
    for check, backend, dtype in keys(recs):
        add = largest(recs, backend, check, "add_rms_norm", dtype)
        if add is None:
            continue
        cells = [
            ratio(
                geomean(
                    pairs(recs, ("add_rms_norm", dtype), ("rms_norm", dtype), g, backend=backend, check=check)
                )
            )
            for g in GROUPS
        ]
        kind = "fused" if backend in FUSED else "composed"
        rows.append([check, backend, kind, dtype, *cells, f"{add.median_s * 1e3:.2f}", pct(add.roofline)])
    size = "x".join(map(str, _largest_shape(recs)))
    head = ["check", "backend", "add + RMS", "dtype", "addRMS/RMS decode", "addRMS/RMS mid",
            "addRMS/RMS large", f"ms ({size})", "roofline"]  # fmt: skip
    return table(head, rows)


def _largest_shape(recs: list[Rec]) -> tuple[int, ...]:
    return max((r.shape for r in recs), key=math.prod, default=())


def precision(recs: list[Rec]) -> list[str]:
    rows = []
    for check, backend, dtype in keys(recs):
        if dtype not in HALF:
            continue
        for op in ("layer_norm", "rms_norm", "add_rms_norm"):
            half = largest(recs, backend, check, op, dtype)
            full = largest(recs, backend, check, op, "float32")
            if half is None or full is None:
                continue
            match = {"backend": backend, "check": check}
            cells = [ratio(geomean(pairs(recs, (op, dtype), (op, "float32"), g, **match))) for g in GROUPS]
            rows.append([check, backend, op, dtype, *cells, f"{pct(full.roofline)} / {pct(half.roofline)}"])
    head = ["check", "backend", "op", "half dtype", "t(half)/t(fp32) decode", "mid", "large",
            "roofline fp32 / half (largest)"]  # fmt: skip
    return table(head, rows)


def _image_order(r: Rec) -> tuple[bool, str, str, int, tuple[int, ...], int]:
    """Forward first, then backend, op, size, and float32 before the half dtypes."""
    dtypes = ["float32", "bfloat16", "float16"]
    rank = dtypes.index(r.dtype) if r.dtype in dtypes else len(dtypes)
    return (r.check != "forward", r.backend, r.op, math.prod(r.shape), r.shape, rank)


def images(recs: list[Rec]) -> list[str]:
    """GroupNorm and InstanceNorm per shape: time, GB/s, roofline, and time over float32's."""
    by = index(recs)
    rows = []
    for r in sorted((r for r in recs if r.op in IMAGE_OPS), key=_image_order):
        full = by.get((r.backend, r.check, r.op, "float32", r.shape))
        versus = "-" if full is None or r.dtype == "float32" else ratio(r.median_s / full.median_s)
        rows.append([r.check, r.backend, r.op, r.shape_text, str(r.groups), r.dtype,
                     f"{r.median_s * 1e3:.3f}", f"{r.gbps:.2f}", pct(r.roofline), versus])  # fmt: skip
    head = ["check", "backend", "op", "shape", "groups", "dtype", "median ms", "GB/s", "roofline",
            "t / t(fp32)"]  # fmt: skip
    return table(head, rows)


def extremes(recs: list[Rec], count: int = 5) -> list[str]:
    """The ``count`` highest and lowest roofline fractions among ``recs``."""
    ranked = sorted(recs, key=lambda r: r.roofline)
    chosen = [("best", r) for r in reversed(ranked[-count:])] + [("worst", r) for r in ranked[:count]]
    rows = [
        [tag, r.backend, r.check, r.op, r.dtype, r.shape_text, f"{r.median_s * 1e6:.1f}", f"{r.gbps:.2f}",
         pct(r.roofline)]
        for tag, r in chosen
    ]  # fmt: skip
    return table(["", "backend", "check", "op", "dtype", "shape", "median us", "GB/s", "roofline"], rows)


def noise(first: list[Rec], second: list[Rec]) -> list[str]:
    """|median difference| between two identical runs per shape group and overall, and the same for
    the LayerNorm / RMSNorm time ratio of each backend, check, dtype and shape."""
    other = index(second)
    spreads: dict[str, list[float]] = defaultdict(list)
    for r in first:
        twin = other.get((r.backend, r.check, r.op, r.dtype, r.shape))
        if twin is not None:
            change = abs(twin.median_s / r.median_s - 1)
            spreads[r.group].append(change)
            spreads["all"].append(change)
    mine = index(first)
    for r in first:
        if r.op != LAYER_NORM:
            continue
        pair = [by.get((r.backend, r.check, "rms_norm", r.dtype, r.shape)) for by in (mine, other)]
        twin = other.get((r.backend, r.check, r.op, r.dtype, r.shape))
        if twin is not None and pair[0] is not None and pair[1] is not None:
            spreads["LN/RMS ratio"].append(
                abs((twin.median_s / pair[1].median_s) / (r.median_s / pair[0].median_s) - 1)
            )
    rows = []
    for group in (*GROUPS, "image", "all", "LN/RMS ratio"):
        values = sorted(spreads.get(group, []))
        if not values:
            continue
        q90 = values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)]
        beyond = sum(v > 0.10 for v in values)
        rows.append(
            [group, str(len(values)), pct(statistics.median(values)), pct(q90), pct(values[-1]), str(beyond)]
        )
    return table(["shapes", "figures", "median abs diff", "90th pct", "max", "> 10%"], rows)


def session(data: dict[str, Any], recs: list[Rec]) -> list[str]:
    info = data.get("machine_info", {})
    normconf = info.get("normconf", {})
    cpu = info.get("cpu", {}).get("brand_raw", "") or info.get("processor", "")
    lines = [
        f"- machine: {cpu} ({info.get('node', '?')}), threads: {normconf.get('threads')}",
        f"- bench profile: {normconf.get('bench_profile')}, measured time per benchmark: "
        f"{normconf.get('bench_time_s')} s, {len(recs)} benchmarks, {data.get('datetime', '')}",
    ]
    for device, roof in normconf.get("rooflines", {}).items():
        lines.append(
            f"- roofline on {device}: copy {roof['gbps']:.2f} GB/s ({roof['source']}, {roof['bytes']} bytes)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", help="pytest-benchmark JSON written by pytest conformance/bench")
    parser.add_argument("--noise", help="a second JSON of an identical run: report the median spread")
    parser.add_argument("--interpreted", action="store_true", help="keep interpreted backends' figures")
    parser.add_argument(
        "--dram-mib",
        type=float,
        default=128.0,
        help="activation traffic (MiB) from which a benchmark counts as memory-bound: at least four times the"
        " last-level cache (default 128, four times a 32 MiB L3)",
    )
    args = parser.parse_args()
    data, recs = load(args.bench, args.interpreted)
    sections = [
        ("Session", session(data, recs)),
        ("LayerNorm vs RMSNorm (time ratio; > 1 means RMSNorm is faster)", ln_vs_rms(recs)),
        (
            "Fused vs composed add + RMSNorm (time of add+RMS over RMS alone; bytes say 2.0)",
            fused_vs_composed(recs),
        ),
        ("Half precision vs float32 (time ratio; bytes say 0.5)", precision(recs)),
        (
            "GroupNorm and InstanceNorm per image shape (t / t(fp32): half precision; bytes say 0.5)",
            images(recs),
        ),
        ("Best and worst roofline fractions, every shape (cache-resident ones exceed 100%)", extremes(recs)),
        (
            f"Best and worst roofline fractions, memory-bound benchmarks (>= {args.dram_mib:g} MiB moved)",
            extremes([r for r in recs if r.nbytes >= args.dram_mib * 2**20]),
        ),
    ]
    if args.noise:
        sections.append(("Noise between the two runs", noise(recs, load(args.noise, args.interpreted)[1])))
    for title, lines in sections:
        print(f"### {title}\n")
        print("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
