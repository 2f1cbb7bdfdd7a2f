"""The onnxruntime adapter: graph builders, convention translations, the session cache, dtypes ORT lacks,
and agreement with a float64 NumPy reference written here for the translated BatchNorm update."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.adapter.backend import Unsupported
from conformance.model.case import Case
from conformance.model.dtypes import unit_roundoff
from conformance.model.inputs import make_inputs

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
graphs = pytest.importorskip("backends.onnx_graphs")
_ort = pytest.importorskip("backends._ort")

CPU = _ort.provider() == "CPUExecutionProvider"
# Test-local bound, in units of the parameter dtype's roundoff: the translated running variance rounds
# a few times in float32 before one rounding to the parameter dtype; a wrong convention (biased
# variance, momentum m instead of 1 - m) is off by far more.
BOUND_ULPS = 8.0


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _nodes(case, compute=None):
    spec = graphs.build(case, compute or case.weight_dtype, graphs.OnnxRuntime())
    onnx.checker.check_model(spec.model(), full_check=True)
    return {node.op_type: node for node in spec.nodes}, spec


def _run(backend, case):
    inputs = make_inputs(case, grad=False)
    prepared = backend.prepare(case, inputs, grad=False)
    prepared()
    return inputs, prepared


def test_layer_norm_graph_is_one_opset_17_node_over_the_trailing_dims():
    nodes, spec = _nodes(Case("layer_norm", (3, 4, 10), "float32", 1e-5, norm_ndim=2))
    attrs = _attrs(nodes["LayerNormalization"])
    assert spec.model().opset_import[0].version == 17
    assert attrs["axis"] == -2 and attrs["stash_type"] == onnx.TensorProto.FLOAT
    assert attrs["epsilon"] == pytest.approx(1e-5, rel=1e-7)  # a FLOAT attribute: 32-bit
    assert list(nodes["LayerNormalization"].input) == ["x", "weight", "bias"]


def test_layer_norm_without_bias_omits_the_optional_input():
    nodes, _ = _nodes(Case("layer_norm", (4, 8), "float32", 1e-5, bias=False))
    assert list(nodes["LayerNormalization"].input) == ["x", "weight"]


def test_rms_norm_keeps_float64_statistics_in_float64():
    nodes, spec = _nodes(Case("rms_norm", (4, 8), "float64", 1e-6))
    assert spec.model().opset_import[0].version == 23
    assert _attrs(nodes["RMSNormalization"])["stash_type"] == onnx.TensorProto.DOUBLE


def test_add_rms_norm_is_add_then_rms_normalization_with_residual_out():
    _, spec = _nodes(Case("add_rms_norm", (4, 8), "float16", 1e-6))
    assert [n.op_type for n in spec.nodes] == ["Add", "RMSNormalization"]
    assert spec.outputs == {"residual_out": "residual_out", "y": "y"}


def test_wider_parameters_run_the_normalization_between_casts():
    _, spec = _nodes(Case("layer_norm", (4, 8), "float16", 1e-5, param_dtype="float32"))
    assert [n.op_type for n in spec.nodes] == ["Cast", "LayerNormalization", "Cast"]
    assert _attrs(spec.nodes[-1])["to"] == onnx.TensorProto.FLOAT16


def test_batch_norm_momentum_is_one_minus_pytorch_momentum():
    backend = graphs.OnnxRuntime()
    assert (
        backend.onnx_momentum(Case("batch_norm", (4, 3), "float32", 1e-5, training=True, momentum=0.1)) == 0.9
    )
    # None (cumulative average) is 1 / num_batches_tracked = 1 on the first step: ONNX keeps nothing.
    assert (
        backend.onnx_momentum(Case("batch_norm", (4, 3), "float32", 1e-5, training=True, momentum=None)) == 0
    )


def test_batch_norm_training_graph_has_running_statistics_outputs():
    nodes, spec = _nodes(Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True, momentum=0.3))
    attrs = _attrs(nodes["BatchNormalization"])
    assert attrs["training_mode"] == 1 and attrs["momentum"] == pytest.approx(0.7)
    assert set(spec.outputs) == {"y", "running_mean", "running_var"}


def test_batch_norm_inference_graph_is_one_node():
    nodes, spec = _nodes(Case("batch_norm", (4, 3, 5), "float32", 1e-5))
    assert [n.op_type for n in spec.nodes] == ["BatchNormalization"]
    assert "training_mode" not in _attrs(nodes["BatchNormalization"])


@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
@pytest.mark.parametrize(
    ("dtype", "params"), [("float32", "float32"), ("float64", "float64"), ("float16", "float32")]
)
def test_running_statistics_follow_pytorch(dtype, params, momentum):
    case = Case("batch_norm", (4, 3, 5), dtype, 1e-5, param_dtype=params, training=True, momentum=momentum)
    inputs, prepared = _run(graphs.OnnxRuntime(), case)
    out = prepared.outputs()
    x = inputs["x"].astype(np.float64)
    m = 1.0 if momentum is None else momentum
    count = x.size // x.shape[1]
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2), ddof=1)  # PyTorch: unbiased in the update
    want = {
        "running_mean": (1 - m) * inputs["running_mean"] + m * mean,
        "running_var": (1 - m) * inputs["running_var"] + m * var,
    }
    assert count == 20
    for name, expected in want.items():
        err = np.max(np.abs(out[name].astype(np.float64) - expected))
        # momentum is a 32-bit attribute: its rounding is part of what ONNX computes.
        u = max(unit_roundoff(params), unit_roundoff("float32") if momentum == 0.1 else 0.0)
        assert err <= BOUND_ULPS * u * max(1.0, np.max(np.abs(expected))), name


def test_repeated_calls_give_the_same_bits_and_leave_inputs_alone():
    # ORT's training-mode kernel aliases input_var with its running_var output; the graph keeps the
    # aliased value a graph output of its own, or repeated runs drift.
    case = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True)
    inputs = make_inputs(case, grad=False)
    pristine = {k: v.copy() for k, v in inputs.items()}
    prepared = graphs.OnnxRuntime().prepare(case, inputs, grad=False)
    first = [prepared() or dict(prepared.outputs()) for _ in range(3)]
    for later in first[1:]:
        for name, value in later.items():
            assert np.array_equal(value, first[0][name]), name
    for name, value in inputs.items():
        assert np.array_equal(value, pristine[name]), name


def test_one_session_serves_every_case_of_a_signature():
    backend = graphs.OnnxRuntime()
    a = Case("layer_norm", (4, 64), "float32", 1e-5)
    b = Case("layer_norm", (16, 64), "float32", 1e-5, dist="offset", seed=3)
    c = Case("layer_norm", (16, 64), "float32", 1e-6)
    infos = [_run(backend, case)[1].info() for case in (a, b, c)]
    assert [info["cached"] for info in infos] == [False, True, False]
    assert len(backend._cache) == 2
    assert infos[0]["execution_provider"] and infos[0]["graph_optimization_level"] == "ORT_ENABLE_ALL"
    assert infos[0]["opset"] == 17


def test_weight_offset_and_missing_weight_are_translated():
    case = Case("rms_norm", (4, 16), "float32", 1e-6, weight_offset=1.0)
    inputs, prepared = _run(graphs.OnnxRuntime(), case)
    x = inputs["x"].astype(np.float64)
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * (1.0 + inputs["weight"])
    assert np.max(np.abs(prepared.outputs()["y"] - want)) <= BOUND_ULPS * unit_roundoff("float32") * 4


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
def test_a_dtype_without_a_cpu_kernel_is_unsupported_with_ort_s_reason():
    case = Case("batch_norm", (4, 3), "bfloat16", 1e-5)
    with pytest.raises(Unsupported, match=r"has no kernel for BatchNormalization.*NOT_IMPLEMENTED"):
        graphs.OnnxRuntime().prepare(case, make_inputs(case, grad=False), grad=False)


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
def test_bfloat16_crosses_into_ort_as_its_bits():
    case = Case("layer_norm", (4, 16), "bfloat16", 1e-5)
    _, prepared = _run(graphs.OnnxRuntime(), case)
    y = prepared.outputs()["y"]
    assert y.dtype.name == "bfloat16" and y.shape == (4, 16) and np.all(np.isfinite(y.astype(np.float32)))
