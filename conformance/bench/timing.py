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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

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
