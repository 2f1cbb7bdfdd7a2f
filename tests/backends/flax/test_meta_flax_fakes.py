"""Meta-test: Flax adapters with the momentum convention backwards, eps left at Flax's default, or
GroupNorm's x handed to linen.GroupNorm channels-first (untransposed), are caught.

The fakes (tests/fakes/flax.py) run real jitted Flax linen modules; the correct flax adapter
runs the same cases in the same run and passes them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("flax")

MOMENTUM = "fake-flax-momentum"
EPS = "fake-flax-default-eps"


def _failing_outputs(record):
    return {c["output"] for c in record["comparisons"] if c["worst_ratio"] == "inf" or c["worst_ratio"] > 1}


def _checked(run, check, backend, **case):
    return [
        r
        for r in run.records
        if r["check"] == check
        and r["backend"] == backend
        and r["outcome"] != "unsupported"
        and all(r["case"][k] == v for k, v in case.items())
    ]


def test_momentum_passed_straight_through_is_caught(suite):
    run = suite(
        "-p",
        "fakes.flax",
        "--backend",
        f"flax,{MOMENTUM}",
        "--op",
        "batch_norm",
        "--profile",
        "smoke",
        "-k",
        "test_training or test_forward",
    )
    assert run.returncode == 1, run.output[-3000:]
    # The real adapter's running_mean is right; its running_var is the known biased-update deviation.
    real = _checked(run, "training", "flax")
    assert real and all("running_mean" not in _failing_outputs(r) for r in real)
    fake = _checked(run, "training", MOMENTUM)
    assert fake and {r["outcome"] for r in fake} == {"failed"}
    for record in fake:
        assert "running_mean" in _failing_outputs(record), record["case"]["id"]
        reason = record["reason"]
        assert "output 'running_mean' out of tolerance" in reason
        assert "tolerances.toml rule[" in reason and "why:" in reason
        # The reproduce command quotes the node id.
        test = f"conformance.suite.test_training::test_training[{MOMENTUM}:"
        reproduce = f"-m pytest --pyargs {test}"
        assert reproduce in reason.replace("'", "")
    # Only the running statistics are wrong: y of the same training cases still passes.
    forward = _checked(run, "forward", MOMENTUM, training=True)
    assert forward and {r["outcome"] for r in forward} == {"passed"}


def test_eps_left_at_flax_default_is_caught(suite):
    run = suite(
        "-p",
        "fakes.flax",
        "--backend",
        f"flax,{EPS}",
        "--op",
        "layer_norm",
        "--dtype",
        "float32",
        "--profile",
        "smoke",
        "-k",
        "test_forward and near_constant",
    )
    assert run.returncode == 1, run.output[-3000:]
    real = _checked(run, "forward", "flax", dist="near_constant")
    assert real and {r["outcome"] for r in real} == {"passed"}
    fake = _checked(run, "forward", EPS, dist="near_constant")
    assert fake and {r["outcome"] for r in fake} == {"failed"}
    for record in fake:
        assert "y" in _failing_outputs(record)
        assert "output 'y' out of tolerance" in record["reason"]


LAYOUT = "fake-flax-group-layout"


def test_group_norm_given_channels_first_is_caught(suite):
    """linen.GroupNorm given x (N, C, L) untransposed groups L: without an affine it runs silently."""
    run = suite(
        "-p",
        "fakes.flax",
        "--backend",
        f"flax,{LAYOUT}",
        "--op",
        "group_norm",
        "--dtype",
        "float32",
        "--profile",
        "ci",
        "-k",
        "test_forward and now-nob",
    )
    assert run.returncode == 1, run.output[-3000:]
    real = _checked(run, "forward", "flax", weight=False, bias=False)
    assert real and {r["outcome"] for r in real} == {"passed"}
    fake = _checked(run, "forward", LAYOUT, weight=False, bias=False)
    assert fake and {r["outcome"] for r in fake} == {"failed"}
    for record in fake:
        assert _failing_outputs(record) == {"y"}
        assert "output 'y' out of tolerance" in record["reason"]


def test_eps_left_at_flax_default_is_caught_on_group_ops(suite):
    """GroupNorm and InstanceNorm run with Flax's 1e-6 instead of the case's 1e-2 on near-constant groups."""
    run = suite(
        "-p",
        "fakes.flax",
        "--backend",
        f"flax,{EPS}",
        "--op",
        "group_norm,instance_norm",
        "--dtype",
        "float32",
        "--profile",
        "ci",
        "-k",
        "test_forward and near_constant and eps0.01",
    )
    assert run.returncode == 1, run.output[-3000:]
    real = _checked(run, "forward", "flax", eps=0.01)
    assert {r["case"]["op"] for r in real} == {"group_norm", "instance_norm"}
    assert {r["outcome"] for r in real} == {"passed"}
    fake = _checked(run, "forward", EPS, eps=0.01)
    assert {r["case"]["op"] for r in fake} == {"group_norm", "instance_norm"}
    assert {r["outcome"] for r in fake} == {"failed"}
    assert all(_failing_outputs(r) == {"y"} for r in fake)
