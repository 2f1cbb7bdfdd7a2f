"""How the ORT adapters' sessions run their intra-op threads: blocked between runs unless
NORMCONF_ORT_SPINNING=1 (ORT's own default, which the benchmarks keep), the same outputs either way, and
a bad value named as a usage error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conformance.adapter.backend import BackendUnavailable
from conformance.model.case import Case
from conformance.model.inputs import make_inputs

pytest.importorskip("onnxruntime")
_ort = pytest.importorskip("backends.common.ort_support")
graphs = pytest.importorskip("backends.onnx.graphs")
contrib = pytest.importorskip("backends.onnx.contrib")

VARIABLE = _ort.SPINNING_VARIABLE
# Every ORT backend's class that builds its sessions through ort_support.session without torch.onnx
# (the exporters' share the function and are checked by name in the suite run below).
BACKENDS: dict[str, Callable[[], object]] = {
    "onnxruntime": graphs.OnnxRuntime,
    "onnxruntime-gn18": graphs.OnnxRuntimeGN18,
    "onnxruntime-contrib": contrib.OnnxRuntimeContrib,
}
# Rows and widths big enough that ORT splits each kernel's work over its threads.
CASES = [
    Case("layer_norm", (256, 1024), "float32", 1e-5),
    Case("layer_norm", (128, 2048), "float16", 1e-5),
    Case("rms_norm", (256, 1024), "float16", 1e-6),
    Case("add_rms_norm", (256, 1024), "float32", 1e-6),
    Case("add_layer_norm", (256, 1024), "float16", 1e-5),
    Case("batch_norm", (32, 64, 8, 8), "float32", 1e-5),
    Case("group_norm", (8, 64, 16, 16), "float32", 1e-5, num_groups=8),
]


def _prepare(backend: object, case: Case) -> Any:
    """``case`` prepared on ``backend`` and called once."""
    prepared = backend.prepare(case, make_inputs(case, grad=False), grad=False)  # type: ignore[attr-defined]
    prepared()
    return prepared


def test_sessions_wait_blocked_unless_spinning_is_asked_for(monkeypatch):
    case = Case("layer_norm", (4, 32), "float32", 1e-5)
    monkeypatch.delenv(VARIABLE, raising=False)
    assert _ort.spinning() is False
    assert _prepare(graphs.OnnxRuntime(), case).info()["intra_op_spinning"] is False
    assert graphs.OnnxRuntime().capabilities().notes["intra_op_spinning"].startswith("0 ")
    monkeypatch.setenv(VARIABLE, " 1 ")
    assert _ort.spinning() is True
    assert _prepare(graphs.OnnxRuntime(), case).info()["intra_op_spinning"] is True
    assert graphs.OnnxRuntime().capabilities().notes["intra_op_spinning"].startswith("1 ")
    monkeypatch.setenv(VARIABLE, "0")
    assert _prepare(graphs.OnnxRuntime(), case).info()["intra_op_spinning"] is False


@pytest.mark.parametrize("value", ["yes", "2", "true", "-1", "0.5"])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_bad_spinning_value_makes_each_ort_backend_unavailable(monkeypatch, name, value):
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(
        BackendUnavailable, match=rf"NORMCONF_ORT_SPINNING='{value}' is not allowed; allowed: 0 .* or 1 "
    ):
        BACKENDS[name]().capabilities()  # type: ignore[attr-defined]


def test_a_bad_spinning_value_asked_for_by_name_is_a_usage_error(suite):
    run = suite("--backend", "onnx-export", env={VARIABLE: "on"})
    assert run.returncode == 4
    assert "NORMCONF_ORT_SPINNING='on' is not allowed" in run.output


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_spinning_or_blocked_the_outputs_are_the_same_bits(monkeypatch, case):
    ran = {}
    for value in ("0", "1"):
        monkeypatch.setenv(VARIABLE, value)
        # A fresh backend, so a fresh session cache: each setting builds its own session.
        prepared = _prepare(graphs.OnnxRuntime(), case)
        assert prepared.info()["intra_op_spinning"] is (value == "1")
        ran[value] = prepared.outputs()
    assert ran["0"].keys() == ran["1"].keys() and ran["0"]
    for name, blocked in ran["0"].items():
        spun = ran["1"][name]
        assert blocked.dtype == spun.dtype and blocked.tobytes() == spun.tobytes(), name
