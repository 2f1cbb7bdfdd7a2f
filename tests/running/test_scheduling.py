"""Signature grouping under pytest-xdist: one worker prepares every case of a backend's signature."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from collections import OrderedDict, defaultdict
from pathlib import Path

import pytest

from conformance.model import profiles
from conformance.model.case import Case
from conformance.running.durations import scopes, signature
from conformance.running.scheduling import SignatureScheduling


def _scheduler(cases: list[Case]) -> SignatureScheduling:
    scheduler = SignatureScheduling.__new__(SignatureScheduling)  # _split_scope needs no xdist session
    scheduler._groups = scopes(cases)
    return scheduler


def test_signature_ignores_shape_dist_and_seed_only():
    base = Case("layer_norm", (4, 64), "float32", 1e-5)
    same = Case("layer_norm", (2, 3, 64), "float32", 1e-5, dist="offset", seed=3)
    assert signature(base) == signature(same)
    for other in (
        Case("layer_norm", (4, 64), "float32", 1e-6),
        Case("layer_norm", (4, 64), "float16", 1e-5),
        Case("layer_norm", (4, 64), "float32", 1e-5, bias=False),
        Case("rms_norm", (4, 64), "float32", 1e-5),
        Case("rms_norm", (4, 64), "bfloat16", 1e-5, param_dtype="float32"),
    ):
        assert signature(other) != signature(base), other.id


def test_scope_is_backend_and_signature_for_suite_tests_and_the_node_id_otherwise():
    cases = profiles.cases("smoke")
    a, b = cases[0], next(c for c in cases if signature(c) != signature(cases[0]))
    sched = _scheduler(cases)
    node = "conformance/suite/test_{}.py::test_{}[{}:{}]"
    fwd = sched._split_scope(node.format("forward", "forward", "torch-nn", a.id))
    bwd = sched._split_scope(node.format("backward", "backward", "torch-nn", a.id))
    assert fwd == bwd == f"torch-nn::{signature(a)}"
    assert sched._split_scope(node.format("forward", "forward", "onnx-export", a.id)) != fwd
    assert sched._split_scope(node.format("forward", "forward", "torch-nn", b.id)) != fwd
    other = "conformance/suite/test_fingerprint.py::test_fingerprint[torch-nn:eps-convention]"
    assert sched._split_scope(other) == other


def _prepares(log: Path) -> dict[str, set[str]]:
    by_case: dict[str, set[str]] = defaultdict(set)
    for line in log.read_text().splitlines():
        pid, case_id = line.split()
        by_case[case_id].add(pid)
    return by_case


@pytest.mark.heavy
@pytest.mark.parametrize("dist", [(), ("--dist", "load")], ids=["default", "explicit-load"])
def test_xdist_prepares_each_signature_on_one_worker_unless_dist_is_given(suite, tmp_path, dist):
    log = tmp_path / "prepares.log"
    run = suite(
        *("--backend", "fake-prepare-log", "--profile", "smoke", "-n", "2", *dist),
        env={"NORMCONF_FAKE_PREPARE_LOG": str(log)},
    )
    assert run.returncode == 0, run.output[-3000:]
    by_case = _prepares(log)
    by_signature: dict[str, set[str]] = defaultdict(set)
    for case in profiles.cases("smoke"):
        by_signature[signature(case)] |= by_case[case.id]
    workers = set().union(*by_signature.values())
    if dist:
        # xdist's own ``load`` deals tests one by one: signatures end up split between the workers.
        assert any(len(pids) > 1 for pids in by_signature.values())
    else:
        assert all(len(pids) == 1 for pids in by_signature.values()), by_signature
        assert len(workers) == 2  # both workers got work: grouping did not serialize the run


def _light_signatures(cases: list[Case], count: int) -> list[str]:
    """The ``count`` signatures with the fewest cases: last in xdist's own order (most tests first)."""
    sizes: dict[str, int] = defaultdict(int)
    for case in cases:
        sizes[signature(case)] += 1
    return sorted(sizes, key=lambda s: (sizes[s], s))[:count]


@pytest.mark.heavy
def test_the_slowest_scopes_of_earlier_runs_go_out_first(suite, tmp_path):
    cases = profiles.cases("smoke")
    cache = tmp_path / "cache"
    log = tmp_path / "prepares.log"
    args = ("--backend", "fake-prepare-log", "-n", "2", "--graph-cache", str(cache))
    first_run = suite(*args, env={"NORMCONF_FAKE_PREPARE_LOG": str(log)})
    assert first_run.returncode == 0, first_run.output[-3000:]
    # The run recorded every scope it ran: the backend's signatures, its fingerprint and property tests.
    recorded = json.loads((cache / "durations.json").read_text())
    assert {f"fake-prepare-log::{signature(c)}" for c in cases} <= set(recorded)
    assert any(key.startswith("fingerprint[fake-prepare-log:") for key in recorded)
    # Make the two signatures with the fewest cases (last in xdist's own order) the slowest.
    slow = _light_signatures(cases, 2)
    recorded |= {f"fake-prepare-log::{s}": 1000.0 - i for i, s in enumerate(slow)}
    (cache / "durations.json").write_text(json.dumps(recorded))
    log.unlink()
    run = suite(*args, env={"NORMCONF_FAKE_PREPARE_LOG": str(log)})
    assert run.returncode == 0, run.output[-3000:]
    by_id = {case.id: case for case in cases}
    first: dict[str, str] = {}
    for line in log.read_text().splitlines():
        pid, case_id = line.split()
        first.setdefault(pid, signature(by_id[case_id]) if case_id in by_id else case_id)
    # Each worker's first unit is one of the two scopes the earlier run found slowest.
    assert sorted(first.values()) == sorted(slow), (first, slow)


def test_a_scope_without_history_goes_before_the_known_ones():
    sched = _scheduler([])
    sched._seconds = {"torch-nn::a": 5.0, "torch-nn::b": 50.0}
    new = sched._estimate("torch-nn::c", {"t1": False})
    assert (
        new > sched._estimate("torch-nn::b", {}) > sched._estimate("torch-nn::a", {"t1": False, "t2": False})
    )
    node = "conformance/suite/test_fingerprint.py::test_fingerprint[torch-nn:eps-convention]"
    sched._seconds["fingerprint[torch-nn:eps-convention]"] = 7.0
    assert sched._estimate(node, {node: False}) == (False, 7.0)


class _Worker:
    """What the scheduler uses of an xdist worker: the test indices it is sent, and its shutdown."""

    def __init__(self, name: str) -> None:
        self.gateway = types.SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


def test_every_test_goes_out_once_by_its_index_and_finished_scopes_leave_the_workers_work():
    cases = profiles.cases("smoke")[:40]
    sched = _scheduler(cases)
    sched.__dict__.update(
        numnodes=2, collection=None, workqueue=OrderedDict(), assigned_work={}, registered_collections={},
        config=types.SimpleNamespace(option=types.SimpleNamespace(loadscopereorder=True)),
        log=lambda *args: None, _seconds={}, _ordered=False, _positions={},
    )  # fmt: skip
    node = "conformance/suite/test_{0}.py::test_{0}[{1}:{2}]"
    collection = [
        node.format(check, b, c.id)
        for c in cases
        for b in ("torch-nn", "onnx-export")
        for check in ("forward", "backward")
    ]
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        sched.add_node(worker)
        sched.add_node_collection(worker, list(collection))
    sched.schedule()
    done: list[str] = []
    while any(w.sent for w in workers):
        for worker in workers:
            if worker.sent:
                index = worker.sent.pop(0)
                done.append(collection[index])
                sched.mark_test_complete(worker, index)
                # Only scopes with a test still to run stay in a worker's work.
                assert all(not all(unit.values()) for unit in sched.assigned_work[worker].values())
    assert sorted(done) == sorted(collection)  # each test once, found by its own index
    assert sched.tests_finished and not sched.has_pending
    assert all(w.shutting_down for w in workers)


# A project's own test modules with a module fixture each, and a conftest that collects c's test first
# (as this project's conftest collects its heavy tests first) and says which scheduler the run used.
_MODULE = """
import os

import pytest


@pytest.fixture(scope="module")
def built():
    with open(os.environ["SCHEDULING_LOG"], "a") as log:
        log.write(f"{os.environ['PYTEST_XDIST_WORKER']} {__name__}\\n")


@pytest.mark.parametrize("i", range(TESTS))
def test_uses(built, i):
    pass
"""
_CONFTEST = """
import os


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.module.__name__ != "test_c")


def pytest_sessionfinish(session):
    dsession = session.config.pluginmanager.getplugin("dsession")
    if dsession is not None:  # the controller
        with open(os.environ["SCHEDULER_LOG"], "w") as log:
            log.write(type(dsession.sched).__name__)
"""


def _project_run(tmp_path: Path, *args: str) -> tuple[str, dict[str, list[str]]]:
    """``pytest -n 2 <args>`` over the project: the scheduler's name, and each worker's modules in the
    order it built their fixtures."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "conftest.py").write_text(_CONFTEST)
    for name, tests in (("test_a.py", 1), ("test_b.py", 6), ("test_c.py", 1)):
        (project / name).write_text(_MODULE.replace("TESTS", str(tests)))
    log, scheduler = tmp_path / "built.log", tmp_path / "scheduler.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "SCHEDULING_LOG": str(log), "SCHEDULER_LOG": str(scheduler)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", *args, str(project)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    by_worker: dict[str, list[str]] = defaultdict(list)
    for line in log.read_text().splitlines():
        worker, module = line.split()
        by_worker[worker].append(module)
    return scheduler.read_text(), by_worker


@pytest.mark.heavy(seconds=10)
def test_a_run_of_other_tests_keeps_xdists_scheduling_and_make_test_keeps_modules_whole(tmp_path):
    # normconf's scheduler is for suite runs: a project's own tests keep xdist's default.
    scheduler, _ = _project_run(tmp_path)
    assert scheduler == "LoadScheduling"
    # The Makefile's (and tox's) test options: each module's fixture built once, on one worker, the
    # modules dealt out in the order of their first test (c, collected first; then a, then b), not most
    # tests first (b, a, c: then one worker would build b and the other a, then c).
    root = Path(__file__).resolve().parents[2]
    options = re.search(r"^TEST_DIST = (.*)$", (root / "Makefile").read_text(), re.MULTILINE)
    assert options is not None
    assert f"pytest -n auto {options[1]} {{posargs}}" in (root / "tox.ini").read_text()  # tox's unit
    scheduler, by_worker = _project_run(tmp_path, *options[1].split())
    assert scheduler == "LoadFileScheduling"
    assert sorted(by_worker.values()) == [["test_a"], ["test_c", "test_b"]], by_worker
