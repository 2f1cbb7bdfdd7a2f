"""Meta-test: an ONNX adapter with the BatchNorm momentum convention backwards is caught.

The fake (tests/normconf_onnx_fakes.py) runs a real ONNX BatchNormalization training graph in the real
onnxruntime; the correct onnxruntime adapter runs the same cases in the same run and passes them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")

FAKE = "fake-onnx-momentum"


def _failing_outputs(record):
    return {c["output"] for c in record["comparisons"] if c["worst_ratio"] == "inf" or c["worst_ratio"] > 1}


def test_momentum_passed_straight_through_is_caught(suite):
    run = suite(
        "-p",
        "normconf_onnx_fakes",
        "--backend",
        f"onnxruntime,{FAKE}",
        "--op",
        "batch_norm",
        "--profile",
        "smoke",
    )
    assert run.returncode == 1, run.output[-3000:]
    training = [r for r in run.records if r["check"] == "training" and r["outcome"] != "unsupported"]
    real = [r for r in training if r["backend"] == "onnxruntime"]
    fake = [r for r in training if r["backend"] == FAKE]
    assert real and {r["outcome"] for r in real} == {"passed"}
    assert fake and {r["outcome"] for r in fake} == {"failed"}
    for record in fake:
        assert {"running_mean", "running_var"} <= _failing_outputs(record), record["case"]["id"]
        reason = record["reason"]
        assert "output 'running_mean' out of tolerance" in reason
        assert "output 'running_var' out of tolerance" in reason
        assert "tolerances.toml rule[" in reason and "why:" in reason
        assert (
            f"reproduce: pytest conformance/suite/test_training.py::test_training[{FAKE}:"
            in reason.replace("'", "")
        )
    # Only the running statistics are wrong: y of the same training cases still passes.
    forward = [
        r for r in run.records if r["backend"] == FAKE and r["check"] == "forward" and r["case"]["training"]
    ]
    assert forward and {r["outcome"] for r in forward} <= {"passed", "unsupported"}
