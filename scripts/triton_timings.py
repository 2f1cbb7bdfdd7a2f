"""Forward and forward+backward timings of the triton backends and a baseline, with GB/s.

Usage: python scripts/triton_timings.py --out DIR [--shapes 4096x4096,4096x8192] [--dtypes bfloat16,float16]
           [--group-shapes 2x320x32x32,4x64x64x64] [--groups 32] [--ops layer_norm,group_norm,...]
           [--backends triton,triton-inplace,torch-functional] [--reps 20]

Same cases and ``prepare()`` as the conformance run; only ``call(); synchronize()`` is timed. On a GPU
each repetition is timed with CUDA events after a 256 MiB write that evicts x, dy and the outputs from
L2, so the figures are HBM figures. Byte model (activations only): forward LN/RMS/GN/IN read x and write
y, the add ops move 4 tensors (x, residual in; y, residual_out out); the backward call runs forward and
backward, adding read x (for the add ops the saved sum), dy, the add ops' dresidual_out, and write dx
(dresidual is dx's tensor when the stream has x's dtype). triton-inplace's timed call also restores x and
residual from pristine copies (4 more tensor moves, not counted). ``roofline`` is GB/s over a
device-to-device copy measured in the same run. Each record also splits the wall time (``wall_ms``, the
median above: launch-inclusive, L2 scrubbed) into ``device_ms`` (the kernels alone: the Prepared's
``device_timing()``, a CUDA-graph replay or the profiler's kernel sum, backends/common/device_timing.py)
and ``host_ms`` (the rest), with ``launches`` and ``h2d_copies`` per call and ``device_gbps`` /
``device_roofline_fraction`` (conformance.bench.timing.split, as the benchmarks record them); on the CPU
those are null. ``--shapes`` are (rows x columns) for the row ops,
``--group-shapes`` (N x C x spatial...) for GroupNorm (``--groups`` groups) and InstanceNorm (instance
statistics). A backend that does not support a case (or is not registered) is left out of the table
with its reason printed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from conformance import BackendUnavailable, Case, Unsupported
from conformance.adapter import registry
from conformance.bench import timing
from conformance.model.case import ADD_OPS
from conformance.model.dtypes import numpy_dtype
from conformance.model.inputs import for_call, make_inputs

ROW_OPS = ("layer_norm", "rms_norm", "add_rms_norm", "add_layer_norm")
GROUP_OPS = ("group_norm", "instance_norm")
EPS = {"rms_norm": 1e-6, "add_rms_norm": 1e-6}  # the others: 1e-5


def activation_bytes(case: Case, grad: bool) -> int:
    per_tensor = math.prod(case.shape) * numpy_dtype(case.dtype).itemsize
    add = case.op in ADD_OPS
    forward, backward = (4, 4) if add else (2, 3)
    return per_tensor * (forward + (backward if grad else 0))


class Clock:
    """Times one callable per repetition: CUDA events with an L2-evicting write before each, or
    perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.scrub = (
            torch.empty(64 << 20, dtype=torch.float32, device=device) if device.type == "cuda" else None
        )

    def time_ms(self, fn: Callable[[], None], reps: int) -> list[float]:
        times = []
        for _ in range(reps):
            if self.scrub is not None:
                self.scrub.zero_()
                # torch's stubs leave Event's constructor untyped.
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fn()
                times.append((time.perf_counter() - begin) * 1e3)
        return times


def copy_gbps(clock: Clock) -> float:
    """Device copy bandwidth (bytes read + written per second) of a 1 GiB buffer."""
    n = (1 << 30) // 4 if clock.device.type == "cuda" else (64 << 20) // 4
    src = torch.ones(n, dtype=torch.float32, device=clock.device)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)

    copy()
    best = min(clock.time_ms(copy, 10))
    return 2 * n * 4 / best / 1e6


def measure(
    name: str, case: Case, inputs: dict[str, Any], grad: bool, clock: Clock, reps: int, roofline: float
) -> dict[str, Any] | None:
    """One backend's record for ``case``; ``roofline``: the same run's copy bandwidth in GB/s."""
    entries = registry.entries()
    if name not in entries:
        print(f"{name:18} {case.id}: left out (not registered)", flush=True)
        return None
    backend = entries[name].load()
    given = for_call(inputs, grad=grad)
    try:
        why = backend.capabilities().why_not(case, grad=grad)
    except BackendUnavailable as exc:
        why = f"unavailable: {exc}"
    if why is None:
        try:
            prepared = backend.prepare(case, given, grad=grad)
        except Unsupported as exc:
            why = str(exc)
    if why is not None:
        print(f"{name:18} {case.id}: left out ({why})", flush=True)
        return None

    def call() -> None:
        prepared()
        prepared.synchronize()

    for _ in range(3):  # compile and warm up, untimed
        call()
    times = clock.time_ms(call, reps)
    median = statistics.median(times)
    size = activation_bytes(case, grad)
    info: dict[str, Any] = dict(getattr(prepared, "info", dict)())
    device_timing = getattr(prepared, "device_timing", None)
    device = None if device_timing is None else device_timing()
    return {
        "backend": name,
        "case_id": case.id,
        "check": "backward" if grad else "forward",
        "bytes": size,
        "median_ms": median,
        "min_ms": min(times),
        "gbps": size / median / 1e6,
        "roofline": size / median / 1e6 / roofline,
        # The wall time's split into the kernels' and the host's, as the benchmarks record it.
        **timing.split(median / 1e3, device, size, roofline),
        "info": dict(info),
    }


def _shapes(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in s.split("x")) for s in text.split(",") if s]


def cases(args: argparse.Namespace) -> Iterator[Case]:
    """Row ops over ``--shapes``, GroupNorm and InstanceNorm over ``--group-shapes``, every dtype."""
    ops = args.ops.split(",")
    for dtype in args.dtypes.split(","):
        for op in (o for o in ROW_OPS if o in ops):
            for shape in _shapes(args.shapes):
                yield Case(op, shape, dtype, EPS.get(op, 1e-5))
        for shape in _shapes(args.group_shapes):
            if "group_norm" in ops:
                yield Case("group_norm", shape, dtype, 1e-5, num_groups=args.groups)
            if "instance_norm" in ops:
                yield Case("instance_norm", shape, dtype, 1e-5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", default="4096x4096,4096x8192")
    parser.add_argument("--group-shapes", default="2x320x32x32,4x64x64x64")
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--ops", default=",".join(ROW_OPS + GROUP_OPS))
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--backends", default="triton,triton-inplace,torch-functional")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    names = args.backends.split(",")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    clock = Clock(device)
    roofline = copy_gbps(clock)
    records = []
    for case in cases(args):
        inputs = make_inputs(case, grad=True)
        for grad in (False, True):
            for name in names:
                record = measure(name, case, inputs, grad, clock, args.reps, roofline)
                if record is None:
                    continue
                records.append(record)
                print(_line(record), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    summary = {"device": device_name, "copy_gbps": roofline, "torch": torch.__version__, "records": records}
    (args.out / "timings.json").write_text(json.dumps(summary, indent=1))
    (args.out / "timings.md").write_text(_markdown(summary))


def _line(r: dict[str, Any]) -> str:
    line = (
        f"{r['backend']:18} {r['check']:8} {r['case_id']:45} {r['median_ms']:8.3f} ms "
        f"{r['gbps']:7.1f} GB/s {r['roofline']:5.1%}"
    )
    if r["device_ms"] is not None:
        line += (
            f" | device {r['device_ms']:.3f} ms {r['device_roofline_fraction']:5.1%} "
            f"host {r['host_ms']:.3f} ms {r['launches']:g} launches {r['h2d_copies']:g} h2d"
        )
    return line


def _markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"device: {summary['device']}; copy {summary['copy_gbps']:.0f} GB/s (read + write)",
        "",
        "| backend | check | case | wall ms | GB/s | of copy | device ms | of copy | host ms | launches "
        "| h2d |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(value: Any, form: str) -> str:
        return "" if value is None else format(value, form)

    for r in summary["records"]:
        lines.append(
            f"| {r['backend']} | {r['check']} | {r['case_id']} | {r['median_ms']:.3f} | {r['gbps']:.1f} | "
            f"{r['roofline']:.1%} | {cell(r['device_ms'], '.3f')} | "
            f"{cell(r['device_roofline_fraction'], '.1%')} | {cell(r['host_ms'], '.3f')} | "
            f"{cell(r['launches'], 'g')} | {cell(r['h2d_copies'], 'g')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
