"""The onnxruntime adapter: graph builders, convention translations, the session cache, dtypes ORT lacks,
agreement with a float64 NumPy reference written here for the translated BatchNorm update, the
GroupNorm/InstanceNorm graphs (GroupNormalization-21 and -18, InstanceNorm's running statistics), and the
fused residual ops' graphs per residual convention."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from conformance import oracle
from conformance.adapter.backend import BackendUnavailable, Unsupported
from conformance.model.case import Case
from conformance.model.dtypes import unit_roundoff
from conformance.model.inputs import make_inputs

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
graphs = pytest.importorskip("backends.onnx.graphs")
_ort = pytest.importorskip("backends.common.ort_support")

CPU = _ort.provider() == "CPUExecutionProvider"
# Test-local bound, in units of the parameter dtype's roundoff: the translated running variance rounds
# a few times in float32 before one rounding to the parameter dtype; a wrong convention (biased
# variance, momentum m instead of 1 - m) is off by far more.
BOUND_ULPS = 8.0


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _nodes(case, compute=None):
    backend = graphs.OnnxRuntime()
    spec = graphs.build(case, graphs.Plan(compute or case.weight_dtype, backend.opset(case)), backend)
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


# --- GroupNorm and InstanceNorm ---------------------------------------------------------------------


def _within(case, out, inputs, outputs=("y",)):
    """Each output within BOUND_ULPS of the float64 oracle, relative to max(1, |expected|)."""
    expected = oracle.evaluate(case, inputs, grad=False)
    u = max(unit_roundoff(case.dtype), unit_roundoff("float32"))
    for name in outputs:
        err = np.max(np.abs(out[name].astype(np.float64) - expected[name]))
        assert err <= BOUND_ULPS * u * max(1.0, np.max(np.abs(expected[name]))), name


@pytest.mark.parametrize(
    ("dtype", "stash"), [("float32", "FLOAT"), ("float16", "FLOAT"), ("float64", "DOUBLE")]
)
def test_group_norm_21_takes_the_per_channel_affine_and_float32_statistics(monkeypatch, dtype, stash):
    monkeypatch.delenv(graphs.GROUP_NORM_VARIABLE, raising=False)
    case = Case("group_norm", (2, 8, 5), dtype, 1e-5, num_groups=4)
    nodes, spec = _nodes(case)
    attrs = _attrs(nodes["GroupNormalization"])
    assert spec.model().opset_import[0].version == 21 and [n.op_type for n in spec.nodes] == [
        "GroupNormalization"
    ]
    assert attrs["num_groups"] == 4 and attrs["stash_type"] == getattr(onnx.TensorProto, stash)
    assert [i.type.tensor_type.shape.dim[0].dim_value for i in spec.inputs[1:]] == [8, 8]
    info = graphs.OnnxRuntime().prepare(case, make_inputs(case, grad=False), grad=False).info()
    assert info["stash_type"] == {"FLOAT": "float32", "DOUBLE": "float64"}[stash]
    assert info["group_affine"] == "per_channel" and info["opset"] == 21


@pytest.mark.parametrize("value", ["17", "20", "22", "x"])
def test_a_group_norm_opset_other_than_18_or_21_makes_the_backend_unavailable(monkeypatch, value):
    monkeypatch.setenv(graphs.GROUP_NORM_VARIABLE, value)
    with pytest.raises(BackendUnavailable, match=rf"NORMCONF_ORT_GROUP_NORM_OPSET='{value}'.*18 or 21"):
        graphs.OnnxRuntime().capabilities()


@pytest.mark.parametrize(
    ("case", "affine", "ops"),
    [
        # Random per-channel weights vary within a group: scale 1, bias 0, then Mul and Add per channel.
        (
            Case("group_norm", (2, 8, 5), "float32", 1e-5, num_groups=4),
            "composed",
            "Unsqueeze+Unsqueeze+Mul+Add",
        ),
        (Case("group_norm", (3, 6), "float64", 1e-5, num_groups=2), "composed", "Mul+Add"),
        # One channel per group, or no affine: the values are the groups' own.
        (Case("group_norm", (2, 8, 5), "float32", 1e-5, num_groups=8), "per_group", ""),
        (
            Case("group_norm", (2, 8, 5), "float32", 1e-5, num_groups=2, weight=False, bias=False),
            "per_group",
            "",
        ),
        (
            Case("group_norm", (2, 8, 5, 3), "float16", 1e-5, num_groups=2, param_dtype="float32"),
            "composed",
            "",
        ),
    ],
    ids=lambda v: v.id if isinstance(v, Case) else str(v),
)
def test_group_norm_18_takes_the_affine_per_group_or_composed(monkeypatch, case, affine, ops):
    monkeypatch.setenv(graphs.GROUP_NORM_VARIABLE, "18")
    backend = graphs.OnnxRuntime()
    inputs, prepared = _run(backend, case)
    info = prepared.info()
    assert info["opset"] == 18 and info["group_affine"] == affine and "stash_type" not in info
    assert info["graph"].split("+").count("GroupNormalization") == 1 and ops in info["graph"]
    # ONNX's checker rejects the deprecated op; the graph is shape-checked and the result says so.
    assert "deprecated" in info["onnx_checker"]
    fed = graphs.feeds(case, inputs, backend.plan(case, inputs))
    assert fed["weight"].shape == ((case.groups,) if affine == "per_group" else (case.shape[1],))
    _within(case, prepared.outputs(), inputs)
    # The same case at opset 21 computes the same function.
    monkeypatch.setenv(graphs.GROUP_NORM_VARIABLE, "21")
    _, at21 = _run(graphs.OnnxRuntime(), case)
    assert at21.info()["opset"] == 21
    _within(case, at21.outputs(), inputs)


def test_per_group_values_are_used_only_where_the_weights_are_constant_within_each_group(monkeypatch):
    monkeypatch.setenv(graphs.GROUP_NORM_VARIABLE, "18")
    case = Case("group_norm", (2, 8, 5), "float32", 1e-5, num_groups=4)
    inputs = dict(make_inputs(case, grad=False))
    backend = graphs.OnnxRuntime()
    assert backend.plan(case, inputs).affine == "composed"
    inputs["weight"] = np.repeat(np.float32([0.5, 2.0, -1.0, 3.0]), 2)
    inputs["bias"] = np.repeat(np.float32([0.0, 1.0, -2.0, 0.25]), 2)
    chosen = backend.plan(case, inputs)
    assert chosen.affine == "per_group"
    assert graphs.feeds(case, inputs, chosen)["weight"].tolist() == [0.5, 2.0, -1.0, 3.0]
    prepared = backend.prepare(case, inputs, grad=False)
    prepared()
    _within(case, prepared.outputs(), inputs)


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
@pytest.mark.parametrize("opset", [18, 21])
def test_ort_runs_group_normalization_as_its_function_body(monkeypatch, tmp_path, opset):
    # ORT 1.32's CPU provider registers no GroupNormalization kernel: the session inlines the ONNX
    # function body (ReduceMean, E[x^2] - E[x]^2, ...), visible in the graph it writes out unoptimized.
    monkeypatch.setenv(graphs.GROUP_NORM_VARIABLE, str(opset))
    case = Case("group_norm", (2, 8, 5), "float32", 1e-5, num_groups=8)
    backend = graphs.OnnxRuntime()
    spec = graphs.build(case, backend.plan(case, make_inputs(case, grad=False)), backend)
    options = _ort.ort.SessionOptions()
    options.graph_optimization_level = _ort.ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "inlined.onnx")
    _ort.ort.InferenceSession(spec.model().SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = {node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node}
    assert "GroupNormalization" not in ops and {"ReduceMean", "Sqrt", "Div"} <= ops
    assert _run(backend, case)[1].info()["ort_kernel"] == "function body"


def test_instance_norm_passes_ones_and_zeros_for_an_absent_affine():
    case = Case("instance_norm", (2, 6, 10), "float32", 1e-5, weight=False, bias=False)
    _, spec = _nodes(case)
    assert [n.op_type for n in spec.nodes] == ["InstanceNormalization"]
    assert spec.model().opset_import[0].version == 22
    inputs, prepared = _run(graphs.OnnxRuntime(), case)
    fed = graphs.feeds(case, inputs, graphs.OnnxRuntime().plan(case, inputs))
    assert np.all(fed["weight"] == 1) and np.all(fed["bias"] == 0)
    assert prepared.info()["ort_kernel"] == "kernel"
    _within(case, prepared.outputs(), inputs)


def test_instance_norm_eval_with_running_statistics_is_batch_normalization():
    case = Case("instance_norm", (4, 3, 10), "float32", 1e-5, track_running_stats=True)
    nodes, spec = _nodes(case)
    assert [n.op_type for n in spec.nodes] == ["BatchNormalization"]
    assert "training_mode" not in _attrs(nodes["BatchNormalization"])
    inputs, prepared = _run(graphs.OnnxRuntime(), case)
    _within(case, prepared.outputs(), inputs)


@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
@pytest.mark.parametrize(("dtype", "params"), [("float32", "float32"), ("float16", "float32")])
def test_instance_norm_training_updates_the_running_statistics_as_pytorch(dtype, params, momentum):
    case = Case(
        "instance_norm",
        (4, 3, 6, 5),
        dtype,
        1e-5,
        param_dtype=params,
        track_running_stats=True,
        training=True,
        momentum=momentum,
    )
    inputs, prepared = _run(graphs.OnnxRuntime(), case)
    out = prepared.outputs()
    x = inputs["x"].astype(np.float64)
    m = 1.0 if momentum is None else momentum
    # PyTorch: the batch average of each instance's mean and unbiased variance (not BatchNorm's).
    mean, var = x.mean(axis=(2, 3)).mean(axis=0), x.var(axis=(2, 3), ddof=1).mean(axis=0)
    want = {
        "running_mean": (1 - m) * inputs["running_mean"] + m * mean,
        "running_var": (1 - m) * inputs["running_var"] + m * var,
    }
    assert np.max(np.abs(var - x.var(axis=(0, 2, 3), ddof=1))) > 1e-3  # the two conventions differ here
    for name, expected in want.items():
        err = np.max(np.abs(out[name].astype(np.float64) - expected))
        assert err <= BOUND_ULPS * unit_roundoff("float32") * max(1.0, np.max(np.abs(expected))), name
    _within(case, out, inputs)
    assert prepared.info()["running_update"].startswith("ReduceMean")


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
def test_float64_instance_normalization_has_no_cpu_kernel():
    case = Case("instance_norm", (2, 6, 10), "float64", 1e-5)
    with pytest.raises(Unsupported, match=r"InstanceNormalization.*NOT_IMPLEMENTED.*InstanceNormalization"):
        graphs.OnnxRuntime().prepare(case, make_inputs(case, grad=False), grad=False)


def test_channels_last_is_not_declared_and_group_ops_are():
    caps = graphs.OnnxRuntime().capabilities()
    assert "channels_last" not in caps.features and {"running_stats", "training"} <= caps.features
    assert {"group_norm", "instance_norm"} <= caps.ops
    case = Case("group_norm", (2, 8, 5, 6), "float32", 1e-5, num_groups=2, layout="channels_last")
    assert "channels_last" in caps.why_not(case)


# --- the fused residual ops: add_layer_norm, and both ops' residual conventions ----------------------


def _wiring(spec):
    """Each node as (op, inputs, outputs), Constants left out."""
    return [(n.op_type, list(n.input), list(n.output)) for n in spec.nodes if n.op_type != "Constant"]


def _graph_types(spec):
    """Graph input/output name -> ONNX element type."""
    values = [*spec.inputs, *spec.values]
    return {v.name: v.type.tensor_type.elem_type for v in values}


F32, BF16, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16
_NORM = ["residual_out", "weight", "bias"]


@pytest.mark.parametrize(
    ("case", "wiring", "types"),
    [
        # Default: the Add's result is residual_out, and the norm reads it as stored.
        (
            Case("add_layer_norm", (4, 8), "float16", 1e-5),
            [("Add", ["x", "residual"], ["residual_out"]), ("LayerNormalization", _NORM, ["y"])],
            {"residual": F16, "residual_out": F16, "y": F16},
        ),
        # Residual in float32: x Cast to float32, residual_out float32, the norm on it, y Cast back.
        (
            Case("add_layer_norm", (4, 8), "bfloat16", 1e-5, residual_dtype="float32"),
            [
                ("Cast", ["x"], ["x_sum"]),
                ("Add", ["x_sum", "residual"], ["residual_out"]),
                ("LayerNormalization", _NORM, ["y_wide"]),
                ("Cast", ["y_wide"], ["y"]),
            ],
            {"x": BF16, "residual": F32, "residual_out": F32, "y": BF16},
        ),
        # Exact: the sum in float32 is what the norm reads; residual_out is a Cast of it.
        (
            Case("add_layer_norm", (4, 8), "bfloat16", 1e-5, norm_input="exact"),
            [
                ("Cast", ["x"], ["x_sum"]),
                ("Cast", ["residual"], ["residual_sum"]),
                ("Add", ["x_sum", "residual_sum"], ["sum"]),
                ("Cast", ["sum"], ["residual_out"]),
                ("LayerNormalization", ["sum", "weight", "bias"], ["y_wide"]),
                ("Cast", ["y_wide"], ["y"]),
            ],
            {"residual": BF16, "residual_out": BF16, "weight": F32, "y": BF16},
        ),
        # Both: residual_out is the float32 sum the norm reads.
        (
            Case("add_rms_norm", (4, 8), "float16", 1e-5, residual_dtype="float32", norm_input="exact"),
            [
                ("Cast", ["x"], ["x_sum"]),
                ("Add", ["x_sum", "residual"], ["residual_out"]),
                ("RMSNormalization", ["residual_out", "weight"], ["y_wide"]),
                ("Cast", ["y_wide"], ["y"]),
            ],
            {"residual": F32, "residual_out": F32, "y": F16},
        ),
        # float32 activations: the exact convention's float32 sum is the stored one.
        (
            Case("add_layer_norm", (4, 8), "float32", 1e-5, norm_input="exact"),
            [("Add", ["x", "residual"], ["residual_out"]), ("LayerNormalization", _NORM, ["y"])],
            {"residual_out": F32, "y": F32},
        ),
        # A float32 stream under float64 activations: the sum in float64, stored once in float32, read
        # as stored.
        (
            Case("add_layer_norm", (4, 8), "float64", 1e-5, residual_dtype="float32"),
            [
                ("Cast", ["residual"], ["residual_sum"]),
                ("Add", ["x", "residual_sum"], ["sum"]),
                ("Cast", ["sum"], ["residual_out"]),
                ("Cast", ["residual_out"], ["x_wide"]),
                ("LayerNormalization", ["x_wide", "weight", "bias"], ["y"]),
            ],
            {"residual": F32, "residual_out": F32, "y": onnx.TensorProto.DOUBLE},
        ),
    ],
    ids=lambda v: v.id if isinstance(v, Case) else "",
)
def test_the_residual_conventions_are_spelled_in_the_graph(case, wiring, types):
    backend = graphs.OnnxRuntime()
    spec = graphs.build(case, backend.plan(case, make_inputs(case, grad=False)), backend)
    onnx.checker.check_model(spec.model(), full_check=True)
    assert _wiring(spec) == wiring
    assert spec.outputs == {"residual_out": "residual_out", "y": "y"}
    assert {name: _graph_types(spec)[name] for name in types} == types


def test_add_layer_norm_is_opset_17_with_the_optional_bias_and_records_its_convention():
    case = Case("add_layer_norm", (4, 8), "float16", 1e-5, bias=False, norm_input="exact")
    nodes, spec = _nodes(case, "float32")
    assert spec.model().opset_import[0].version == 17
    assert list(nodes["LayerNormalization"].input) == ["sum", "weight"]
    info = _run(graphs.OnnxRuntime(), case)[1].info()
    assert info["graph"] == "Cast+Cast+Add+Cast+LayerNormalization+Cast"
    assert info["sum_dtype"] == "float32" and info["norm_reads"] == "the exact sum (float32)"


_CONVENTIONS = [
    {},
    {"residual_dtype": "float32"},
    {"norm_input": "exact"},
    {"residual_dtype": "float32", "norm_input": "exact"},
]


@pytest.mark.parametrize("convention", _CONVENTIONS, ids=lambda c: "-".join(c.values()) or "default")
@pytest.mark.parametrize(("op", "dtype"), [("add_layer_norm", "float16"), ("add_rms_norm", "float16")])
def test_each_convention_agrees_with_its_oracle(op, dtype, convention):
    case = Case(op, (6, 48), dtype, 1e-5, dist="offset", **convention)
    inputs, prepared = _run(graphs.OnnxRuntime(), case)
    out = prepared.outputs()
    assert out["residual_out"].dtype == np.dtype(case.stream_dtype)
    _within(case, out, inputs, outputs=("y", "residual_out"))


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
def test_bfloat16_runs_where_the_add_is_float32_and_is_unsupported_where_it_is_bfloat16():
    for convention in _CONVENTIONS[1:]:
        case = Case("add_layer_norm", (6, 48), "bfloat16", 1e-5, **convention)
        inputs, prepared = _run(graphs.OnnxRuntime(), case)
        _within(case, prepared.outputs(), inputs, outputs=("y", "residual_out"))
    case = Case("add_layer_norm", (6, 48), "bfloat16", 1e-5)
    with pytest.raises(Unsupported, match=r"no kernel for Add\+LayerNormalization.*NOT_IMPLEMENTED"):
        graphs.OnnxRuntime().prepare(case, make_inputs(case, grad=False), grad=False)


@pytest.mark.skipif(not CPU, reason="the transformer is the CPU provider's")
def test_ort_drops_the_stored_sum_s_rounding_under_float32_parameters(tmp_path):
    # float16 Add has no CPU kernel: ORT's InsertCastTransformer (run at every optimization level) runs
    # it in float32 and hands the LayerNormalization, which the graph feeds Cast(residual_out) to
    # float32, the float32 sum directly: the norm reads the unrounded sum (a ledgered deviation).
    case = Case("add_layer_norm", (16, 200), "float16", 1e-5, param_dtype="float32", dist="offset")
    backend = graphs.OnnxRuntime()
    inputs = make_inputs(case, grad=False)
    spec = graphs.build(case, backend.plan(case, inputs), backend)
    assert _wiring(spec)[:2] == [
        ("Add", ["x", "residual"], ["residual_out"]),
        ("Cast", ["residual_out"], ["x_wide"]),
    ]
    options = _ort.ort.SessionOptions()
    options.graph_optimization_level = _ort.ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    _ort.ort.InferenceSession(spec.model().SerializeToString(), options, providers=["CPUExecutionProvider"])
    ran = onnx.load(options.optimized_model_filepath).graph.node
    norm = next(n for n in ran if n.op_type == "LayerNormalization")
    add = next(n for n in ran if n.op_type == "Add")
    assert norm.input[0] == add.output[0] != "residual_out"
    out = backend.prepare(case, inputs, grad=False)
    out()
    exact = dataclasses.replace(case, norm_input="exact")
    _within(exact, out.outputs(), inputs, outputs=("y", "residual_out"))


def test_buffers_are_the_bound_copies_and_a_shared_name_is_left_out():
    case = Case("add_layer_norm", (4, 16), "float32", 1e-5)
    _, prepared = _run(graphs.OnnxRuntime(), case)
    assert set(prepared.buffers()) == {"x", "residual", "weight", "bias", "y", "residual_out"}
    bn = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True)
    _, trained = _run(graphs.OnnxRuntime(), bn)
    # running_mean and running_var name an input and an output: two buffers, one contract name.
    assert {"running_mean", "running_var"}.isdisjoint(trained.buffers())
    assert {"x", "prior_running_var", "y"} <= set(trained.buffers())


def test_a_norm_that_always_reads_the_unrounded_sum_is_caught(suite, tmp_path):
    # The fake normalizes the float32 sum whatever the case asks (what the fused contrib kernels do for
    # half inputs): on float16 offset rows the default convention's y catches it, the exact one passes.
    cases = tmp_path / "cases.json"
    base = {"op": "add_layer_norm", "shape": [16, 200], "dtype": "float16", "eps": 1e-5, "dist": "offset"}
    cases.write_text(json.dumps([base, {**base, "norm_input": "exact"}]))
    run = suite("-p", "fakes.onnx", "--backend", "onnxruntime,fake-onnx-exact-sum", "--cases", str(cases))
    assert run.returncode == 1, run.output[-3000:]
    forward = {(r["backend"], r["case"]["id"]): r for r in run.records if r["check"] == "forward"}
    rounded, exact = (
        "add_layer_norm-float16-16x200-eps1e-05-offset",
        "add_layer_norm-float16-16x200-eps1e-05-offset-exact",
    )
    assert {forward[("onnxruntime", i)]["outcome"] for i in (rounded, exact)} == {"passed"}
    assert forward[("fake-onnx-exact-sum", exact)]["outcome"] == "passed"
    caught = forward[("fake-onnx-exact-sum", rounded)]
    assert caught["outcome"] == "failed" and "output 'y' out of tolerance" in caught["reason"]
