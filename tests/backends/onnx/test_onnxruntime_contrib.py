"""The onnxruntime-contrib adapter: ORT's com.microsoft SkipLayerNormalization and
SkipSimplifiedLayerNormalization, their graph, the dtypes the schema takes, what the half kernels
normalize, the Unsupported reasons, and agreement with the float64 oracle on small cases."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from conformance import oracle
from conformance.adapter import memory
from conformance.adapter.backend import Unsupported
from conformance.judging.tolerances import read_tolerances
from conformance.judging.verdict import compare_outputs
from conformance.model.case import Case
from conformance.model.inputs import make_inputs
from conformance.model.outputs import forward_outputs

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
contrib = pytest.importorskip("backends.onnx.contrib")
_ort = pytest.importorskip("backends.common.ort_support")

CPU = _ort.provider() == "CPUExecutionProvider"
TOLERANCES = read_tolerances()


def _run(case, inputs=None):
    inputs = make_inputs(case, grad=False) if inputs is None else inputs
    prepared = contrib.OnnxRuntimeContrib().prepare(case, inputs, grad=False)
    prepared()
    return inputs, prepared


def _ratios(case, inputs, out):
    """worst_ratio of each forward output against the oracle of ``case``, under the suite's tolerances."""
    expected = oracle.evaluate(case, inputs, grad=False)
    names = forward_outputs(case)
    return {c.output: c.worst_ratio for c in compare_outputs(case, inputs, expected, out, names, TOLERANCES)}


@pytest.mark.parametrize(
    ("op", "formal", "inputs"),
    [
        ("add_layer_norm", "SkipLayerNormalization", ["x", "residual", "weight", "bias"]),
        ("add_rms_norm", "SkipSimplifiedLayerNormalization", ["x", "residual", "weight"]),
    ],
)
def test_the_graph_is_one_com_microsoft_node(op, formal, inputs):
    case = Case(op, (4, 32), "float16", 1e-5)
    model = contrib.model(case)
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == (formal, "com.microsoft")
    assert list(node.input) == inputs
    # Outputs by position: output, mean, inv_std_var (left empty), input_skip_bias_sum.
    assert list(node.output) == ["y", "", "", "residual_out"]
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 17), ("com.microsoft", 1)}
    eps = next(a for a in node.attribute if a.name == "epsilon")
    assert eps.f == pytest.approx(1e-5, rel=1e-7)  # a FLOAT attribute: 32-bit


def test_results_record_the_op_its_domain_and_the_names_passed():
    _, prepared = _run(Case("add_layer_norm", (4, 32), "float32", 1e-5))
    info = prepared.info()
    assert info["op"] == "SkipLayerNormalization" and info["domain"] == "com.microsoft"
    assert info["inputs"] == "input=x, skip=residual, gamma=weight, beta=bias"
    assert info["outputs"] == "output=y, input_skip_bias_sum=residual_out"
    assert info["cached"] is False and info["graph_optimization_level"] == "ORT_ENABLE_ALL"
    _, nobias = _run(Case("add_layer_norm", (4, 32), "float32", 1e-5, bias=False))
    assert nobias.info()["inputs"] == "input=x, skip=residual, gamma=weight"


def test_declared_dtypes_are_the_schema_s():
    caps = contrib.OnnxRuntimeContrib().capabilities()
    assert caps.dtypes == {"float32", "float16", "bfloat16"} and caps.ops == {
        "add_layer_norm",
        "add_rms_norm",
    }
    assert "float64" in caps.why_not(Case("add_rms_norm", (4, 8), "float64", 1e-5))
    assert "T is float, float16, bfloat16" in caps.notes["dtypes"]


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
def test_a_double_graph_is_rejected_by_ort_s_schema_check():
    # The CPU provider registers double kernels, but the contrib schema's T leaves double out.
    case = Case("add_layer_norm", (4, 8), "float32", 1e-5)
    model = contrib.model(case)
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    with pytest.raises(Exception, match=r"INVALID_GRAPH.*tensor\(double\)"):
        _ort.ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "case",
    [
        Case("add_layer_norm", (6, 40), "float32", 1e-5),
        Case("add_rms_norm", (6, 40), "float32", 1e-6),
        Case("add_layer_norm", (6, 40), "float16", 1e-5, norm_input="exact"),
        Case("add_rms_norm", (6, 40), "bfloat16", 1e-5, norm_input="exact"),
        Case("add_layer_norm", (6, 40), "bfloat16", 1e-5, dist="offset", norm_input="exact"),
        Case("add_layer_norm", (3, 4, 10), "float32", 1e-5, norm_ndim=2),
        Case("add_rms_norm", (2, 3, 16), "float16", 1e-5),
        Case("add_layer_norm", (8, 24), "float32", 1e-5, weight=False, bias=False),
        Case("add_rms_norm", (8, 24), "bfloat16", 1e-5, weight=False),
    ],
    ids=lambda c: c.id,
)
def test_small_cases_agree_with_the_oracle(case):
    inputs, prepared = _run(case)
    out = prepared.outputs()
    assert {name: value.shape for name, value in out.items()} == {"y": case.shape, "residual_out": case.shape}
    ratios = _ratios(case, inputs, out)
    assert all(r <= 1.0 for r in ratios.values()), ratios


@pytest.mark.skipif(not CPU, reason="the kernels measured are the CPU provider's")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
def test_half_kernels_normalize_the_unrounded_float32_sum(op, dtype):
    # Offset rows: rounding h to the half type moves it by u * kappa, which the normalization amplifies.
    case = Case(op, (16, 200), dtype, 1e-5, dist="offset")
    inputs, prepared = _run(case)
    out = prepared.outputs()
    # residual_out is the float32 sum rounded once to nearest-even: the default convention's stored sum.
    total = inputs["x"].astype(np.float32) + inputs["residual"].astype(np.float32)
    assert np.array_equal(out["residual_out"], total.astype(out["residual_out"].dtype))
    exact = _ratios(dataclasses.replace(case, norm_input="exact"), inputs, out)
    assert exact["y"] <= 1.0
    if op == "add_layer_norm":
        # LayerNorm subtracts the mean: the stored sum's rounding shows, against the default convention.
        assert _ratios(case, inputs, out)["y"] > 10.0


def test_the_float32_stream_and_wider_parameters_are_not_declared():
    caps = contrib.OnnxRuntimeContrib().capabilities()
    assert {"exact_sum", "weight_offset", "no_weight", "no_bias", "multi_axis"} <= caps.features
    for case, feature in (
        (Case("add_rms_norm", (4, 8), "bfloat16", 1e-5, residual_dtype="float32"), "residual_dtype"),
        (Case("add_layer_norm", (4, 8), "float16", 1e-5, param_dtype="float32"), "param_dtype"),
    ):
        assert feature in caps.why_not(case) and "T binds" in caps.notes[feature]
    assert "backward" in caps.why_not(Case("add_rms_norm", (4, 8), "float32", 1e-5), grad=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_weight_offset_is_fed_only_where_the_type_holds_one_plus_w(dtype):
    case = Case("add_rms_norm", (4, 16), dtype, 1e-6, weight_offset=1.0)
    inputs = dict(make_inputs(case, grad=False))
    with pytest.raises(Unsupported, match=rf"no weight offset.*rounds \d+ of 16 values to {dtype}"):
        contrib.OnnxRuntimeContrib().prepare(case, inputs, grad=False)
    # Weights on a coarse grid: 1 + w is exact in the type, so gamma = 1 + w is the case's own scale.
    grid = np.linspace(-0.5, 0.5, 16) // 2.0**-4 * 2.0**-4
    inputs["weight"] = grid.astype(inputs["weight"].dtype)
    _, prepared = _run(case, inputs)
    assert _ratios(case, inputs, prepared.outputs())["y"] <= 1.0


def test_one_session_per_signature_and_outputs_in_the_case_s_shape():
    backend = contrib.OnnxRuntimeContrib()
    first = Case("add_layer_norm", (2, 3, 8), "float32", 1e-5)
    again = Case("add_layer_norm", (5, 8), "float32", 1e-5, dist="offset")
    infos = []
    for case in (first, again):
        prepared = backend.prepare(case, make_inputs(case, grad=False), grad=False)
        prepared()
        assert prepared.outputs()["y"].shape == case.shape
        infos.append(prepared.info()["cached"])
    assert infos == [False, True] and len(backend._cache) == 1


def test_buffers_are_the_bound_copies_and_share_nothing():
    case = Case("add_layer_norm", (4, 32), "bfloat16", 1e-5)
    inputs = make_inputs(case, grad=False)
    pristine = {name: value.copy() for name, value in inputs.items()}
    prepared = contrib.OnnxRuntimeContrib().prepare(case, inputs, grad=False)
    names = forward_outputs(case)
    watch = memory.Watch.start(prepared, inputs, names)
    prepared()
    out = prepared.outputs()
    watch.finish(prepared, out, names)
    assert watch.reported and set(watch.inputs) == {"x", "residual", "weight", "bias"}
    assert memory.problems(watch, {}, inputs, out) == []
    assert out["y"].dtype == np.dtype(ml_dtypes.bfloat16)
    for name, value in inputs.items():
        assert np.array_equal(value.view(np.uint16), pristine[name].view(np.uint16)), name
