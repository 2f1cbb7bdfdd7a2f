"""pytest hooks of the benchmarks: options, the fixed thread count, parametrization, the roofline.

pytest loads this when a path argument points into conformance/bench (the normconf plugin keeps the
directory out of ``pytest conformance``). Backends, ``--op``, ``--dtype`` and ``--cases`` are the
normconf plugin's options; cases come from ``--bench-profile`` unless ``--cases`` names a file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from conformance.bench import allocator, measure
from conformance.bench.measure import BenchConfig, BenchState
from conformance.model import sweep
from conformance.model.case import Case
from conformance.running import plugin

STATE = pytest.StashKey[BenchState]()
# Read by OpenMP and MKL when torch (or another library) starts; torch adapters also apply it later.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# The ORT adapters' sessions wait blocked between runs unless this is 1 (backends/common/ort_support.py:
# a conformance run calls them seldom); the benchmarks time ORT as configured by default: spinning.
ORT_SPINNING = "NORMCONF_ORT_SPINNING"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("normconf-bench", "normconf benchmarks (conformance/bench)")
    group.addoption(
        "--bench-profile",
        default=sweep.DEFAULT_PROFILE,
        help=f"benchmark cases: {', '.join(sweep.BENCH_PROFILES)} (default {sweep.DEFAULT_PROFILE}; "
        "--cases FILE overrides)",
    )
    group.addoption(
        "--bench-threads",
        type=int,
        default=None,
        help="CPU threads for every backend (default: usable cores)",
    )
    group.addoption(
        "--bench-time", type=float, default=0.25, help="measured seconds per benchmark (default 0.25)"
    )
    group.addoption(
        "--bench-copy-mib", type=int, default=256, help="size of the roofline copy in MiB (default 256)"
    )
    group.addoption(
        "--bench-flush",
        default="auto",
        choices=("auto", "on", "off"),
        help="flush caches before every round: auto = on for non-CPU devices (default)",
    )
    group.addoption(
        "--bench-malloc",
        default="pinned",
        choices=allocator.CHOICES,
        help="glibc malloc policy for large blocks: pinned (reuse, no adaptive mmap threshold; default)"
        " or default (see conformance/bench/allocator.py)",
    )
    group.addoption(
        "--bench-interpreted",
        action="store_true",
        help="also time backends that run interpreted (figures marked interpreted: true)",
    )


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("benchmark"):
        raise pytest.UsageError("the benchmarks need pytest-benchmark: pip install 'normconf[bench]'")
    threads = config.getoption("--bench-threads")
    threads = _usable_cores() if threads is None else threads
    try:
        bench = BenchConfig.build(
            profile=config.getoption("--bench-profile"),
            threads=threads,
            budget_s=config.getoption("--bench-time"),
            copy_mib=config.getoption("--bench-copy-mib"),
            flush=config.getoption("--bench-flush"),
            interpreted=config.getoption("--bench-interpreted"),
            min_rounds=config.getoption("benchmark_min_rounds"),
            disabled=bool(config.getoption("benchmark_disable")) or _xdist(config),
            malloc=config.getoption("--bench-malloc"),
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    # Before any backend loads, so libraries that read the variables at start-up see them.
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    os.environ.setdefault(ORT_SPINNING, "1")
    config.stash[STATE] = BenchState(bench, config)


def _xdist(config: pytest.Config) -> bool:
    # pytest-benchmark disables timing under xdist; timings from parallel workers would mean little.
    return bool(getattr(config.option, "numprocesses", None)) or hasattr(config, "workerinput")


def _state(config: pytest.Config) -> BenchState:
    return config.stash[STATE]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = _state(metafunc.config)
    if "bench_target" in metafunc.fixturenames:
        targets = [(backend, case) for case in state.cases() for backend in state.backends()]
        metafunc.parametrize("bench_target", targets, ids=[f"{b}:{c.id}" for b, c in targets])
    if "bench_device" in metafunc.fixturenames:
        devices = state.devices()
        metafunc.parametrize("bench_device", devices, ids=devices)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The copy benchmarks first, then case-major: every backend and check of a case in a row, so
    its inputs are drawn once and the backends of one case are timed under the same conditions."""
    state = _state(config)
    order = {case.id: i for i, case in enumerate(state.cases())}
    backends = {name: i for i, name in enumerate(state.backends())}

    def key(item: pytest.Item) -> tuple[int, int, int, int]:
        callspec = getattr(item, "callspec", None)
        target = callspec.params.get("bench_target") if callspec is not None else None
        if target is None:
            return (0, 0, 0, 0)
        check = measure.CHECKS.index(item.name.split("[", 1)[0].removeprefix("test_bench_"))
        return (1, order[target[1].id], check, backends[target[0]])

    items.sort(key=key)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        machine_info["normconf"] = state.machine_info()


@pytest.fixture
def bench_run(
    request: pytest.FixtureRequest, benchmark: Any, bench_target: tuple[str, Case]
) -> Callable[[str], None]:
    """Benchmark one backend x case x check (forward, or forward + backward)."""
    state = _state(request.config)
    name, case = bench_target

    def run(check: str) -> None:
        measure.run_case(state, plugin_state(request.config), benchmark, name, case, check)

    return run


@pytest.fixture
def bench_copy(request: pytest.FixtureRequest, benchmark: Any) -> Callable[[str], None]:
    """Benchmark the session's roofline copy on one device."""
    state = _state(request.config)

    def run(device: str) -> None:
        measure.run_copy(state, benchmark, device)

    return run


def plugin_state(config: pytest.Config) -> plugin.RunState:
    return config.stash[plugin.STATE]
