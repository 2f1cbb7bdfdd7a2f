"""Meta-tests: ONNX adapters with a convention backwards are caught.

The fakes (tests/fakes/onnx.py) run real ONNX graphs (BatchNormalization training,
GroupNormalization-21 and -18) in the real onnxruntime; the correct onnxruntime adapter runs the same
cases in the same run and passes them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")

FAKE = "fake-onnx-momentum"
STASH = "fake-onnx-stash"
AFFINE = "fake-onnx-group-affine"


def _failing_outputs(record):
    return {c["output"] for c in record["comparisons"] if c["worst_ratio"] == "inf" or c["worst_ratio"] > 1}


def test_momentum_passed_straight_through_is_caught(suite):
    run = suite(
        "-p",
        "fakes.onnx",
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
        assert f"-m pytest --pyargs conformance.suite.test_training::test_training[{FAKE}:" in reason.replace(
            "'", ""
        )
    # Only the running statistics are wrong: y of the same training cases still passes.
    forward = [
        r for r in run.records if r["backend"] == FAKE and r["check"] == "forward" and r["case"]["training"]
    ]
    assert forward and {r["outcome"] for r in forward} <= {"passed", "unsupported"}


def test_group_norm_statistics_in_float16_and_an_untranslated_group_affine_are_caught(suite):
    run = suite(
        "-p",
        "fakes.onnx",
        "--backend",
        f"onnxruntime,{STASH},{AFFINE}",
        "--op",
        "group_norm",
        "--dtype",
        "float32",
        "--profile",
        "smoke",
    )
    assert run.returncode == 1, run.output[-3000:]
    forward = {
        name: [r for r in run.records if r["check"] == "forward" and r["backend"] == name]
        for name in ("onnxruntime", STASH, AFFINE)
    }
    ran = {name: [r for r in records if r["outcome"] != "unsupported"] for name, records in forward.items()}
    assert ran["onnxruntime"] and {r["outcome"] for r in ran["onnxruntime"]} == {"passed"}
    # stash_type FLOAT16: x and its statistics rounded to float16, y off by ~1e-3 relative.
    assert ran[STASH] and {r["outcome"] for r in ran[STASH]} == {"failed"}
    for record in ran[STASH]:
        assert _failing_outputs(record) == {"y"}, record["case"]["id"]
        assert "output 'y' out of tolerance" in record["reason"]
        assert f"test_forward[{STASH}:" in record["reason"].replace("'", "")
    # Per-channel values where GroupNormalization-18 takes per-group ones: ORT cannot broadcast them
    # unless each group is one channel (num_groups = C), where the two are the same thing. A run that
    # raises is the case's error, never a pass.
    one_channel = [r for r in ran[AFFINE] if r["case"]["num_groups"] == r["case"]["shape"][1]]
    wrong = [r for r in ran[AFFINE] if r["case"]["num_groups"] != r["case"]["shape"][1]]
    assert one_channel and {r["outcome"] for r in one_channel} == {"passed"}
    assert wrong and {r["outcome"] for r in wrong} == {"error"}
    for record in wrong:
        assert "__call__() raised RuntimeError: Error in execution" in record["reason"], record["reason"]
