"""A prepared call's time on a CUDA device apart from its host time, and what one call launches and copies.

The benchmarks time ``call(); synchronize()`` (wall time: Python, launches and the kernels). On a GPU a
call whose kernels take microseconds can spend most of its wall time on the host, so a benchmark also
asks the Prepared for ``device_timing()``, which measures the kernels alone, the way triton.testing's
``do_bench_cudagraph`` does: the call captured once in a CUDA graph and the graph replayed, timed with
CUDA events (the driver launches the captured kernels back to back: no Python, no per-launch cost). A
call that cannot be captured (it synchronizes, or copies from pageable host memory) is measured by
torch.profiler instead: the sum of its kernels' durations. The profiler also gives the counts: kernels
launched and host-to-device copies per call. Neither method flushes the L2 between replays: for inputs
that fit in it (decode shapes) device time is what a call costs after a layer that left them there.

On the CPU there is no separate device: ``device_timing`` is None and the benchmark's wall time is the
whole figure (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

REPLAYS = 20  # graph replays (and profiled calls) per measurement


@dataclass(frozen=True)
class DeviceTiming:
    """Per call: the kernels' time, how it was measured, the profiler's counts and kernel sum."""

    device_ms: float
    method: str  # "cuda-graph replay" or "profiler kernel sum (...why no graph)"
    launches: float  # kernels (and memsets) the profiler saw per call
    h2d_copies: float  # host-to-device copies per call
    kernel_sum_ms: float  # the profiler's sum of kernel durations per call

    def as_info(self) -> dict[str, float | str]:
        return {
            "device_ms": self.device_ms,
            "device_method": self.method,
            "launches": self.launches,
            "h2d_copies": self.h2d_copies,
            "kernel_sum_ms": self.kernel_sum_ms,
        }


@dataclass(frozen=True)
class Counts:
    launches: float
    h2d_copies: float
    kernel_sum_ms: float


def counts(names_and_us: list[tuple[str, float]], calls: int) -> Counts:
    """From the device events of ``calls`` calls, (name, duration in µs): per-call kernel launches (a
    memset counts: it is one), host-to-device copies and the kernels' summed time. Other copies
    (device to host, device to device) are neither."""
    launches = h2d = 0
    kernel_us = 0.0
    for name, us in names_and_us:
        if name.startswith("Memcpy"):
            h2d += "HtoD" in name
        else:
            launches += 1
            kernel_us += us
    return Counts(launches / calls, h2d / calls, kernel_us / calls / 1e3)


def _profiled(call: Callable[[], None], calls: int) -> Counts:
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    events = [
        (e.name, float(e.time_range.elapsed_us()))
        for e in prof.events()
        if getattr(e, "device_type", None) == DeviceType.CUDA
    ]
    return counts(events, calls)


def _graph_ms(call: Callable[[], None], replays: int) -> float:
    """Median-free mean of ``replays`` back-to-back replays of the captured call, in ms."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up on a side stream, as capture requires
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    torch.cuda.synchronize()
    # torch's stubs leave Event's constructor untyped.
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / replays


def measure(call: Callable[[], None], dev: torch.device, *, replays: int = REPLAYS) -> DeviceTiming | None:
    """The device time of ``call`` on ``dev`` (None unless CUDA); ``call`` must have run once before."""
    if dev.type != "cuda":
        return None
    torch.cuda.synchronize(dev)
    seen = _profiled(call, replays)
    try:
        device_ms, method = _graph_ms(call, replays), "cuda-graph replay"
    except Exception as exc:  # any capture failure: the profiler's figure stands in, with the reason
        torch.cuda.synchronize(dev)
        device_ms = seen.kernel_sum_ms
        method = f"profiler kernel sum (no CUDA graph: {type(exc).__name__}: {str(exc)[:200]})"
    return DeviceTiming(device_ms, method, seen.launches, seen.h2d_copies, seen.kernel_sum_ms)


def info(call: Callable[[], None], dev: torch.device) -> dict[str, float | str] | None:
    """What a Prepared's ``device_timing()`` returns: ``measure(...).as_info()``, None off CUDA."""
    got = measure(call, dev)
    return None if got is None else got.as_info()
