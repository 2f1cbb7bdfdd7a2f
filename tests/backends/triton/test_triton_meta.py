"""Meta-tests: broken Triton kernels are caught by the suite (fakes: tests/fakes/triton.py).

A LayerNorm kernel whose padded lanes enter the variance is exact when a row fills its power-of-two
block, so the suite must fail it on exactly the other row lengths, naming y and the tolerance rule,
while the same kernel with the lanes masked out passes every case. The triton backend's GroupNorm
kernels with statistics per channel must fail exactly where a group holds several channels, and with
dweight reduced blind to the group exactly where there are several groups; wired right, they pass.
The in-place add + norm kernels (triton-inplace) must fail the aliasing check when the residual buffer
is written undeclared or left holding a stale value, and the determinism check when the inputs are not
restored before each call, while the values they return stay right.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support.shared import once
from support.suite import run_suite

pytest.importorskip("triton")

ROWS = (1, 3, 8, 32, 40, 64, 100, 127, 256, 300)
BROKEN, CONTROL = "fake-triton-masked-lanes", "fake-triton-rowwise"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    def make(folder: Path) -> Any:
        cases = [
            {"op": "layer_norm", "shape": [5, n], "dtype": dtype, "eps": 1e-5, "dist": dist}
            for n in ROWS
            for dtype in ("float32", "float16")
            for dist in ("normal", "offset")
        ]
        (folder / "rows.json").write_text(json.dumps(cases))
        # One run for both fakes: the interpreter's start-up is paid once.
        args = ("--backend", f"{BROKEN},{CONTROL}", "--cases", str(folder / "rows.json"))
        return run_suite(folder, *args, "-p", "fakes.triton")

    return once(tmp_path_factory, "triton-meta", make)


def _row(record):
    return record["case"]["shape"][-1]


def _power_of_two(n):
    return n & (n - 1) == 0


def test_masked_lanes_in_the_variance_are_caught(run):
    assert run.returncode == 1, run.output[-3000:]
    forward = [r for r in run.records if r["backend"] == BROKEN and r["check"] == "forward"]
    failed = [r for r in forward if r["outcome"] == "failed"]
    # Every row length that leaves padding fails in float32; every full block passes everywhere.
    assert {_row(r) for r in failed if r["case"]["dtype"] == "float32"} == {
        n for n in ROWS if not _power_of_two(n)
    }
    assert all(r["outcome"] == "passed" for r in forward if _power_of_two(_row(r)))
    reason = failed[0]["reason"]
    assert "output 'y' out of tolerance" in reason
    assert "tolerances.toml rule[" in reason and "why:" in reason
    assert f"-m pytest --pyargs conformance.suite.test_forward::test_forward[{BROKEN}:" in (
        reason.replace("'", "")
    )


def test_the_same_kernel_with_lanes_masked_out_passes(run):
    records = [r for r in run.records if r["backend"] == CONTROL]
    outcomes = {r["outcome"] for r in records}
    # The fake declares no backward: those checks are unsupported, never passed.
    assert outcomes == {"passed", "unsupported"}
    assert sum(r["outcome"] == "unsupported" for r in records) == len(ROWS) * 4


GN_SHAPES = {(2, 4, 5): (1, 2, 4), (3, 6, 2, 3): (1, 3, 6)}
GN_CONTROL = "fake-triton-gn"
CHANNEL_STATS, GROUP_DWEIGHT = "fake-triton-gn-channel-stats", "fake-triton-gn-group-dweight"


@pytest.fixture(scope="module")
def gn_run(tmp_path_factory):
    def make(folder: Path) -> Any:
        cases = [
            {"op": "group_norm", "shape": list(shape), "dtype": "float32", "eps": 1e-5, "num_groups": groups}
            for shape, choices in GN_SHAPES.items()
            for groups in choices
        ]
        (folder / "groups.json").write_text(json.dumps(cases))
        backends = f"{GN_CONTROL},{CHANNEL_STATS},{GROUP_DWEIGHT}"
        args = ("--backend", backends, "--cases", str(folder / "groups.json"))
        return run_suite(folder, *args, "-p", "fakes.triton")

    return once(tmp_path_factory, "triton-gn-meta", make)


def _groups(record):
    case = record["case"]
    return case["num_groups"], case["shape"][1]


def _by_check(run, backend, check):
    return [r for r in run.records if r["backend"] == backend and r["check"] == check]


def test_statistics_per_channel_instead_of_per_group_are_caught(gn_run):
    assert gn_run.returncode == 1, gn_run.output[-3000:]
    for check in ("forward", "backward"):
        records = _by_check(gn_run, CHANNEL_STATS, check)
        assert len(records) == 6
        # Wrong wherever a group holds more than one channel; exact when G = C (InstanceNorm's grouping).
        failed = {r["case"]["id"] for r in records if r["outcome"] == "failed"}
        assert failed == {r["case"]["id"] for r in records if _groups(r)[0] < _groups(r)[1]}, check
        assert all(r["outcome"] == "passed" for r in records if r["case"]["id"] not in failed)
    reason = next(
        r["reason"] for r in _by_check(gn_run, CHANNEL_STATS, "forward") if r["outcome"] == "failed"
    )
    assert "output 'y' out of tolerance" in reason and "tolerances.toml rule[" in reason


def test_dweight_reduced_without_the_group_mapping_is_caught(gn_run):
    assert all(r["outcome"] == "passed" for r in _by_check(gn_run, GROUP_DWEIGHT, "forward"))
    records = _by_check(gn_run, GROUP_DWEIGHT, "backward")
    failed = [r for r in records if r["outcome"] == "failed"]
    # One group maps every channel right; with more, channel k of each group shares one sum.
    assert {r["case"]["id"] for r in failed} == {r["case"]["id"] for r in records if _groups(r)[0] > 1}
    for record in failed:
        assert "output 'dweight' out of tolerance" in record["reason"]
        bad = {c["output"] for c in record["comparisons"] if c["mismatched"]}
        assert bad == {"dweight"}, bad  # dx and dbias take the right path


def test_the_group_norm_kernels_wired_right_pass(gn_run):
    records = [r for r in gn_run.records if r["backend"] == GN_CONTROL]
    assert {r["outcome"] for r in records} == {"passed"}
    assert {r["check"] for r in records} >= {"forward", "backward", "determinism", "inputs_unchanged"}


IN_PLACE = "fake-triton-inplace"
UNDECLARED, STALE, NO_RESTORE = (f"{IN_PLACE}-{bug}" for bug in ("undeclared", "stale", "no-restore"))


@pytest.fixture(scope="module")
def in_place_run(tmp_path_factory):
    def make(folder: Path) -> Any:
        cases = [
            {"op": op, "shape": [4, 40], "dtype": dtype, "eps": 1e-5, "norm_input": norm_input}
            for op in ("add_rms_norm", "add_layer_norm")
            for dtype, norm_input in (("bfloat16", "rounded"), ("bfloat16", "exact"), ("float32", "rounded"))
        ]
        (folder / "add.json").write_text(json.dumps(cases))
        backends = ",".join((IN_PLACE, UNDECLARED, STALE, NO_RESTORE))
        args = ("--backend", backends, "--cases", str(folder / "add.json"))
        return run_suite(folder, *args, "-p", "fakes.triton")

    return once(tmp_path_factory, "triton-inplace-meta", make)


def _outcomes(run, backend, check):
    return {r["outcome"] for r in _by_check(run, backend, check)}


def test_the_in_place_kernels_declared_and_restored_pass(in_place_run):
    records = [r for r in in_place_run.records if r["backend"] == IN_PLACE]
    # Forward only: the backward is unsupported, never passed.
    assert {(r["check"], r["outcome"]) for r in records} == {
        ("forward", "passed"),
        ("inputs_unchanged", "passed"),
        ("aliasing", "passed"),
        ("determinism", "passed"),
        ("backward", "unsupported"),
    }
    assert len(records) == 6 * 5


def test_an_undeclared_in_place_residual_is_caught(in_place_run):
    assert in_place_run.returncode == 1, in_place_run.output[-3000:]
    assert _outcomes(in_place_run, UNDECLARED, "forward") == {"passed"}  # the values are right
    records = _by_check(in_place_run, UNDECLARED, "aliasing")
    assert len(records) == 6 and {r["outcome"] for r in records} == {"failed"}
    for record in records:
        assert "output 'residual_out' shares memory with input 'residual'" in record["reason"]
        assert "input 'residual' was written by the call" in record["reason"]
        assert "'y'" not in record["reason"]  # y -> x is declared
    # And the residual it was handed changed under the inputs_unchanged check.
    assert _outcomes(in_place_run, UNDECLARED, "inputs_unchanged") == {"failed"}


def test_a_declared_buffer_left_stale_is_caught(in_place_run):
    assert _outcomes(in_place_run, STALE, "forward") == {"passed"}
    assert _outcomes(in_place_run, STALE, "determinism") == {"passed"}
    records = _by_check(in_place_run, STALE, "aliasing")
    assert len(records) == 6 and {r["outcome"] for r in records} == {"failed"}
    for record in records:
        reason = record["reason"]
        assert "input 'residual' is declared as" in reason and "does not hold the 'residual_out'" in reason


def test_inputs_not_restored_before_each_call_are_caught(in_place_run):
    # One call is right (forward, aliasing); the second starts from the first one's outputs.
    for check in ("forward", "aliasing", "inputs_unchanged"):
        assert _outcomes(in_place_run, NO_RESTORE, check) == {"passed"}, check
    assert _outcomes(in_place_run, NO_RESTORE, "determinism") == {"failed"}
