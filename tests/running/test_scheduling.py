"""Signature grouping under pytest-xdist: one worker prepares every case of a backend's signature."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from conformance.model import profiles
from conformance.model.case import Case
from conformance.running.scheduling import SignatureScheduling, scopes, signature


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
