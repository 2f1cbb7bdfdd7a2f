"""One benchmark: prepare (untimed), warm up (untimed), time ``call(); synchronize()``, record figures.

Every record's ``extra_info`` carries the keys the report joins on: case_id, backend, check, bytes,
weight_bytes, gbps, roofline_fraction, copy_gbps, threads, device (and more, see docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from conformance.adapter.backend import Backend, Capabilities, Prepared, Unsupported
from conformance.adapter.execute import with_deadline
from conformance.adapter.opening import Absent, Opened
from conformance.bench import allocator, bytemodel, timing
from conformance.model import sweep
from conformance.model.case import Case
from conformance.model.inputs import for_call, make_inputs
from conformance.running import plugin

CHECKS: tuple[str, ...] = bytemodel.CHECKS
# A roofline copy in a run with timing disabled only has to exercise the code path.
_DISABLED_COPY_BYTES = 1 << 20


@dataclass(frozen=True)
class BenchConfig:
    """The validated benchmark options."""

    profile: str
    threads: int
    budget_s: float
    copy_bytes: int
    flush: str
    interpreted: bool
    min_rounds: int
    disabled: bool
    malloc: str  # --bench-malloc: what allocator.configure applies before the first case

    @classmethod
    def build(cls, *, profile: str, threads: int, budget_s: float, copy_mib: int, **rest: Any) -> BenchConfig:
        if profile not in sweep.BENCH_PROFILES:
            allowed = ", ".join(sweep.BENCH_PROFILES)
            raise ValueError(f"--bench-profile={profile!r} is not allowed; allowed: {allowed}")
        for option, value in (("--bench-threads", threads), ("--bench-copy-mib", copy_mib)):
            if value < 1:
                raise ValueError(f"{option}={value!r} is not allowed; allowed: an integer >= 1")
        if not budget_s > 0:
            raise ValueError(f"--bench-time={budget_s!r} is not allowed; allowed: seconds > 0")
        return cls(profile, threads, budget_s, copy_mib << 20, **rest)

    def flushes(self, device: str) -> bool:
        return self.flush == "on" or (self.flush == "auto" and device != "cpu")


def interpreted(caps: Capabilities) -> bool:
    """Whether the backend declares an interpreted mode (Triton's CPU interpreter): timing means nothing."""
    return str(caps.notes.get("mode", "")).startswith("interpreted")


class BenchState:
    """Per-session benchmark state: the cases, the backends, and one roofline per device."""

    def __init__(self, config: BenchConfig, pytest_config: pytest.Config) -> None:
        self.config = config
        self._pytest_config = pytest_config
        self._rooflines: dict[str, tuple[timing.Roofline, Prepared]] = {}
        self._cases: list[Case] | None = None
        # What conformance/bench/allocator.py applied for config.malloc (once, before the first case).
        self.allocator: str | None = None

    @property
    def run_state(self) -> plugin.RunState:
        return self._pytest_config.stash[plugin.STATE]

    def cases(self) -> list[Case]:
        """``--cases FILE`` when given, else the bench profile; both filtered by --op and --dtype."""
        if self._cases is None:
            settings = self.run_state.settings
            ops, dtypes = self._choices("--op"), self._choices("--dtype")
            chosen = settings.cases if settings.cases_file is not None else sweep.cases(self.config.profile)
            self._cases = [
                c for c in chosen if (ops is None or c.op in ops) and (dtypes is None or c.dtype in dtypes)
            ]
        return self._cases

    def _choices(self, option: str) -> set[str] | None:
        value = self._pytest_config.getoption(option)
        return None if value is None else {v.strip() for v in value.split(",") if v.strip()}

    def backends(self) -> list[str]:
        return list(self.run_state.settings.backends)

    def loaded(self, name: str) -> Opened:
        return self.run_state.backend(name)

    def devices(self) -> list[str]:
        """Devices of the available, timed backends (each gets one roofline copy benchmark)."""
        devices: list[str] = []
        for name in self.backends():
            loaded = self.loaded(name)
            if isinstance(loaded, Absent) or (interpreted(loaded[1]) and not self.config.interpreted):
                continue
            if loaded[1].device not in devices:
                devices.append(loaded[1].device)
        return devices

    def apply_allocator(self) -> None:
        """Apply the malloc policy once, after the roofline copy allocated its buffers and before any
        case allocates: the copy keeps glibc's own large-block mapping, the fastest this machine
        copies with (pinned heap blocks copied ~15% slower here), so the roofline stays an upper
        bound; every case runs under the pinned policy."""
        if self.allocator is None:
            self.allocator = allocator.configure(self.config.malloc)

    def roofline(self, device: str) -> tuple[timing.Roofline, Prepared]:
        """The session's copy on ``device``, measured on first use (then reused by every benchmark)."""
        if device not in self._rooflines:
            nbytes = _DISABLED_COPY_BYTES if self.config.disabled else self.config.copy_bytes
            copy, source = self._copy(device, nbytes)
            median = None
            if self.config.disabled:
                timing.timed(copy)()
            else:
                median = timing.median_call_s(copy)
            roof = timing.Roofline(device, source, nbytes, self.config.threads, median)
            self._rooflines[device] = (roof, copy)
        return self._rooflines[device]

    def _copy(self, device: str, nbytes: int) -> tuple[Prepared, str]:
        """A backend's ``copy_kernel`` for the device (first selected backend that has one), else NumPy."""
        for name in self.backends():
            loaded = self.loaded(name)
            if isinstance(loaded, Absent) or loaded[1].device != device or interpreted(loaded[1]):
                continue
            kernel = getattr(loaded[0], "copy_kernel", None)
            if kernel is not None:
                prepared: Prepared = kernel(nbytes)
                _check_threads(name, prepared, self.config.threads)
                return prepared, name
        if device == "cpu":
            return timing.NumpyCopy(nbytes, self.config.threads), "numpy"
        raise pytest.UsageError(
            f"no roofline for device {device!r}: no selected backend on it has copy_kernel(nbytes)"
        )

    def machine_info(self) -> dict[str, Any]:
        c = self.config
        rooflines = {
            device: {"gbps": roof.gbps, "source": roof.source, "bytes": 2 * roof.nbytes}
            for device, (roof, _) in self._rooflines.items()
        }
        return {
            "threads": c.threads,
            "bench_profile": c.profile,
            "bench_time_s": c.budget_s,
            "rooflines": rooflines,
            "allocator": self.allocator or "not applied yet",
        }


def _info(prepared: object) -> dict[str, Any]:
    info = getattr(prepared, "info", None)
    if info is None:
        return {}
    value = info()
    if not isinstance(value, Mapping):
        raise TypeError(f"info() returned {type(value).__name__}, expected a mapping")
    return {str(k): v for k, v in value.items()}


def _check_threads(name: str, prepared: object, threads: int) -> dict[str, Any]:
    """A backend that reports its thread count must run with the session's."""
    info = _info(prepared)
    if "threads" in info and info["threads"] != threads:
        pytest.fail(
            f"{name} ran with threads={info['threads']}; the session fixed {threads} (--bench-threads)"
        )
    return info


@functools.lru_cache(maxsize=1)
def _inputs(case: Case) -> dict[str, np.ndarray]:
    # Case-major order: forward and backward of every backend for one case reuse one draw.
    return make_inputs(case, grad=True)


def _given(case: Case, grad: bool) -> dict[str, np.ndarray]:
    """Fresh copies for one prepare(), as the conformance suite gives them (dy only with gradients)."""
    return {k: np.array(v, copy=True) for k, v in for_call(_inputs(case), grad=grad).items()}


@contextmanager
def _recorded(sink: list[str]) -> Iterator[None]:
    """Warnings an adapter emits are recorded in extra_info, never raised (they are its business)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    sink.extend(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))


def _usable(state: BenchState, name: str, case: Case, grad: bool) -> tuple[Backend, Capabilities]:
    loaded = state.loaded(name)
    if isinstance(loaded, Absent):
        pytest.skip(loaded.reason)  # a broken backend's errors are the conformance run's to report
    backend, caps = loaded
    if interpreted(caps) and not state.config.interpreted:
        pytest.skip(
            f"{name} runs interpreted ({caps.notes.get('mode')}); --bench-interpreted times it anyway"
        )
    why = caps.why_not(case, grad=grad)
    if why is not None:
        pytest.skip(f"unsupported: {why}")
    return backend, caps


def _measure(state: BenchState, benchmark: Any, run: Callable[[], None], device: str) -> None:
    """Calibrate on one untimed call, then time ``run`` with pytest-benchmark (pedantic mode)."""
    flush = state.config.flushes(device)
    setup = None
    if flush:
        _, copy = state.roofline(device)
        setup = timing.timed(copy)
    if state.config.disabled:
        benchmark.pedantic(run, setup=setup)
        return
    start = time.perf_counter()
    run()
    plan = timing.plan(
        time.perf_counter() - start, state.config.budget_s, state.config.min_rounds, flush=flush
    )
    benchmark.pedantic(run, setup=setup, rounds=plan.rounds, iterations=plan.iterations)


def _device_timing(
    prepared: Prepared, state: BenchState, timeout: float, what: str
) -> tuple[Mapping[str, Any] | None, str | None]:
    """The Prepared's optional ``device_timing()`` (the kernels' time apart from the host's; None where
    there is no separate device). A failure is recorded with the benchmark, never raised: the wall
    time stands on its own."""
    measure = getattr(prepared, "device_timing", None)
    if measure is None or state.config.disabled:
        return None, None
    try:
        got = with_deadline(measure, timeout, what)
    except Exception as exc:  # the adapter's failure, reported in its record
        return None, f"{type(exc).__name__}: {exc}"
    if got is not None and not isinstance(got, Mapping):
        return None, f"device_timing() returned {type(got).__name__}, expected a mapping or None"
    if got is not None and not isinstance(got.get("device_ms"), int | float):
        return None, f"device_timing() gave device_ms={got.get('device_ms')!r}, expected a number of ms"
    return got, None


def median_s(benchmark: Any) -> float | None:
    stats = getattr(benchmark, "stats", None)
    return None if stats is None else float(stats.stats.median)


def run_case(
    state: BenchState, run_state: plugin.RunState, benchmark: Any, name: str, case: Case, check: str
) -> None:
    """Benchmark ``check`` of ``case`` on backend ``name``; only call + synchronize are timed."""
    grad = check == "backward"
    backend, caps = _usable(state, name, case, grad)
    roof, _ = state.roofline(caps.device)
    state.apply_allocator()
    benchmark.group = f"{check} {case.id}"
    timeout, what = run_state.settings.timeout, f"{name} {case.id}"
    caught: list[str] = []
    with _recorded(caught):
        start = time.perf_counter()
        try:
            prepared = with_deadline(
                lambda: backend.prepare(case, _given(case, grad), grad=grad), timeout, what
            )
        except Unsupported as exc:
            pytest.skip(f"unsupported: prepare() raised Unsupported: {exc}")
        prepare_s = time.perf_counter() - start
        run = timing.timed(prepared)
        with_deadline(run, timeout, what)  # the first call: warm-up (caches, lazy init), never timed
        info = _check_threads(name, prepared, state.config.threads)
        _measure(state, benchmark, run, caps.device)
        device, device_error = _device_timing(prepared, state, timeout, what)
    traffic = bytemodel.traffic(case, check)
    median = median_s(benchmark)
    gbps = traffic.activations / median / 1e9 if median else None
    benchmark.extra_info.update(
        {
            **timing.split(median, device, traffic.activations, roof.gbps),
            **({"device_timing_error": device_error} if device_error else {}),
            "case_id": case.id,
            "backend": name,
            "check": check,
            "bytes": traffic.activations,
            "weight_bytes": traffic.weights,
            "gbps": gbps,
            "roofline_fraction": roof.fraction(gbps),
            "copy_gbps": roof.gbps,
            "threads": state.config.threads,
            "device": caps.device,
            "device_name": caps.device_name,
            "interpreted": interpreted(caps),
            "flushed": state.config.flushes(caps.device),
            "prepare_s": prepare_s,
            "info": info,
            "case": case.to_dict(),
            **({"compile_s": info["compile_s"]} if "compile_s" in info else {}),
            **({"warnings": caught} if caught else {}),
        }
    )


def run_copy(state: BenchState, benchmark: Any, device: str) -> None:
    """Time the roofline copy itself: its fraction of the session roofline shows how stable it is."""
    roof, copy = state.roofline(device)
    benchmark.group = f"copy {device}"
    _measure(state, benchmark, timing.timed(copy), device)
    median = median_s(benchmark)
    gbps = 2 * roof.nbytes / median / 1e9 if median else None
    benchmark.extra_info.update(
        {
            "bytes": 2 * roof.nbytes,
            "gbps": gbps,
            "copy_gbps": roof.gbps,
            "roofline_fraction": roof.fraction(gbps),
            "threads": state.config.threads,
            "device": device,
            "source": roof.source,
        }
    )
