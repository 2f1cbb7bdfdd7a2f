"""How long to time each benchmark, and the copy bandwidth that every GB/s figure is a fraction of.

The roofline is a device copy of ``nbytes`` (read + write: ``2 * nbytes`` moved) measured in the
same session, on the same device, with the same thread count as the benchmarks. A backend supplies
the copy for its device through the optional ``copy_kernel(nbytes) -> Prepared``; on the CPU a
NumPy copy split over the session's threads stands in when no backend offers one.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance.adapter.backend import Outputs, Prepared

# A round shorter than this repeats the call (iterations) so timer and loop overhead stay negligible.
MIN_ROUND_S = 200e-6
MAX_ROUNDS = 2000
ROOFLINE_ROUNDS = 15


@dataclass(frozen=True)
class Plan:
    """pytest-benchmark pedantic arguments: ``rounds`` samples of ``iterations`` calls each."""

    rounds: int
    iterations: int


def plan(call_s: float, budget_s: float, min_rounds: int, *, flush: bool) -> Plan:
    """Rounds and iterations so the measured time is about ``budget_s`` and never under min_rounds.

    With a flush before every round (GPU), each round is one call: pytest-benchmark runs the setup
    once per round, and a second call in the round would hit the cache the flush just emptied.
    """
    call_s = max(call_s, 1e-9)
    iterations = 1 if flush else max(1, math.ceil(MIN_ROUND_S / call_s))
    rounds = int(budget_s / (call_s * iterations))
    return Plan(max(min_rounds, min(MAX_ROUNDS, rounds)), iterations)


def timed(prepared: Prepared) -> Callable[[], None]:
    """The timed region of every benchmark: one call, then the device synchronization."""

    def run() -> None:
        prepared()
        prepared.synchronize()

    return run


def median_call_s(prepared: Prepared, rounds: int = ROOFLINE_ROUNDS) -> float:
    """Median seconds of call + synchronize after one untimed warm-up call."""
    run = timed(prepared)
    run()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


class NumpyCopy:
    """A CPU copy of ``nbytes`` split over ``threads`` threads (NumPy releases the GIL while copying)."""

    def __init__(self, nbytes: int, threads: int) -> None:
        self.src = np.ones(max(1, nbytes // 4), dtype=np.float32)
        self.dst = np.empty_like(self.src)
        bounds = np.linspace(0, self.src.size, threads + 1).astype(int)
        self.chunks = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="normconf-copy") if threads > 1 else None

    def _part(self, chunk: slice) -> None:
        np.copyto(self.dst[chunk], self.src[chunk])

    def __call__(self) -> None:
        if self.pool is None:
            np.copyto(self.dst, self.src)
            return
        for future in [self.pool.submit(self._part, chunk) for chunk in self.chunks]:
            future.result()

    def synchronize(self) -> None:
        pass

    def outputs(self) -> Outputs:
        return {}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


@dataclass(frozen=True)
class Roofline:
    """The session's copy bandwidth on one device: ``gbps`` = 2 * nbytes / median / 1e9."""

    device: str
    source: str
    nbytes: int
    threads: int
    median_s: float | None

    @property
    def gbps(self) -> float | None:
        if not self.median_s:
            return None
        return 2 * self.nbytes / self.median_s / 1e9

    def fraction(self, gbps: float | None) -> float | None:
        """``gbps`` as a fraction of this roofline (None when either is unmeasured)."""
        roof = self.gbps
        return None if gbps is None or not roof else gbps / roof


# What a record's device fields mean where the Prepared measures no device time apart from the call.
NO_DEVICE = (
    "none: no device apart from the host (a CPU call is its own computation); wall_ms is the whole call"
)


def split(
    wall_s: float | None, device: Mapping[str, Any] | None, nbytes: int, copy_gbps: float | None
) -> dict[str, Any]:
    """A benchmark's time split into the kernels' and the host's (docs/benchmarks.md): ``wall_ms`` (the
    timed ``call(); synchronize()``), ``device_ms`` (the kernels alone, from the Prepared's
    ``device_timing()``, None without one), ``host_ms`` = wall_ms - device_ms (negative only within
    noise), ``launches`` and ``h2d_copies`` per call, and GB/s with its fraction of the session's copy
    for the device time (``device_gbps``, ``device_roofline_fraction`` of ``copy_gbps``, the session's copy;
    the wall time's are ``gbps`` and ``roofline_fraction``)."""
    wall_ms = None if wall_s is None else wall_s * 1e3
    if device is None:
        return {
            "wall_ms": wall_ms,
            "device_ms": None,
            "host_ms": None,
            "launches": None,
            "h2d_copies": None,
            "device_gbps": None,
            "device_roofline_fraction": None,
            "device_method": NO_DEVICE,
        }
    device_ms = float(device["device_ms"])
    device_gbps = nbytes / (device_ms / 1e3) / 1e9 if device_ms > 0 else None
    return {
        "wall_ms": wall_ms,
        "device_ms": device_ms,
        "host_ms": None if wall_ms is None else wall_ms - device_ms,
        "launches": device.get("launches"),
        "h2d_copies": device.get("h2d_copies"),
        "device_gbps": device_gbps,
        "device_roofline_fraction": device_gbps / copy_gbps if device_gbps and copy_gbps else None,
        "device_method": str(device.get("device_method", "")),
        **({"kernel_sum_ms": device["kernel_sum_ms"]} if "kernel_sum_ms" in device else {}),
    }
