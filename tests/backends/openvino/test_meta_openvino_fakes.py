"""Meta-test: OpenVINO adapters with the eps left out or the BatchNorm momentum backwards are caught.

The fakes (tests/fakes/openvino.py) run the real ONNX graphs in the real OpenVINO CPU runtime;
the correct openvino adapter runs the same cases in the same run and passes them. The cases are chosen
so each fake has something to get wrong: eps 1e-2 and 1e-12 (ONNX's default is 1e-5, which is why the
smoke profile, all eps 1e-5, cannot see the eps fake) and a training step with momentum 0.1.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.suite import SuiteRun, run_suite

pytest.importorskip("openvino")
pytest.importorskip("onnxruntime")

REAL, EPS, MOMENTUM = "openvino", "fake-openvino-eps", "fake-openvino-momentum"
CASES = [
    {"op": "layer_norm", "shape": [16, 96], "dtype": "float32", "eps": 1e-2},
    {"op": "rms_norm", "shape": [16, 96], "dtype": "float32", "eps": 1e-2},
    {"op": "rms_norm", "shape": [16, 96], "dtype": "float32", "eps": 1e-12, "dist": "near_constant"},
    {"op": "batch_norm", "shape": [8, 4, 5], "dtype": "float32", "eps": 1e-2},
    {"op": "batch_norm", "shape": [8, 4, 5], "dtype": "float32", "eps": 1e-5, "training": True},
    # Control: at ONNX's default eps the eps fake computes the right thing.
    {"op": "layer_norm", "shape": [16, 96], "dtype": "float32", "eps": 1e-5},
]


def _failing_outputs(record: dict[str, Any]) -> set[str]:
    return {c["output"] for c in record["comparisons"] if c["worst_ratio"] == "inf" or c["worst_ratio"] > 1}


def _by(run: SuiteRun, backend: str, check: str) -> dict[str, dict[str, Any]]:
    return {r["case"]["id"]: r for r in run.records if r["backend"] == backend and r["check"] == check}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    folder = tmp_path_factory.mktemp("openvino-fakes")
    cases = folder / "cases.json"
    cases.write_text(json.dumps(CASES))
    backends = f"{REAL},{EPS},{MOMENTUM}"
    # The metamorphic properties draw their own examples and say nothing about these translations.
    args = ("-p", "fakes.openvino", "--backend", backends, "--cases", str(cases))
    return run_suite(folder, *args, "-k", "not test_properties")


def test_the_real_adapter_passes_the_cases_the_fakes_fail(run: SuiteRun) -> None:
    assert run.returncode == 1, run.output[-3000:]
    for check in ("forward", "training"):
        records = _by(run, REAL, check)
        assert records and {r["outcome"] for r in records.values()} == {"passed"}, check


def test_eps_left_out_is_caught_on_every_case_whose_eps_is_not_onnx_s_default(run: SuiteRun) -> None:
    forward = _by(run, EPS, "forward")
    wrong = {cid: r for cid, r in forward.items() if "eps1e-05" not in cid}
    assert len(wrong) == 4
    for cid, record in wrong.items():
        assert record["outcome"] == "failed", cid
        assert "y" in _failing_outputs(record), cid
        assert "output 'y' out of tolerance" in record["reason"]
        test = f"conformance.suite.test_forward::test_forward[{EPS}:"
        assert f"-m pytest --pyargs {test}" in record["reason"].replace("'", "")
    controls = {r["outcome"] for cid, r in forward.items() if "eps1e-05" in cid}
    assert controls == {"passed"}


def test_momentum_passed_straight_through_is_caught_on_the_running_statistics(run: SuiteRun) -> None:
    training = _by(run, MOMENTUM, "training")
    assert training and {r["outcome"] for r in training.values()} == {"failed"}
    for record in training.values():
        assert {"running_mean", "running_var"} <= _failing_outputs(record)
        assert "output 'running_mean' out of tolerance" in record["reason"]
    # Only the running statistics are wrong: y of the same training step passes.
    forward = [r for r in _by(run, MOMENTUM, "forward").values() if r["case"]["training"]]
    assert forward and {r["outcome"] for r in forward} == {"passed"}


def test_the_fingerprint_reads_the_fakes(run: SuiteRun) -> None:
    answers = {(r["backend"], r["question"]): r["answer"] for r in run.kind("fingerprint")}
    assert answers[(REAL, "batch_norm.momentum")] == "torch"
    assert answers[(MOMENTUM, "batch_norm.momentum")] == "onnx"
    # The eps hook omits the attribute, so ONNX's default is what the fingerprint reads.
    assert answers[(REAL, "layer_norm.default_eps")] == "1e-05"
