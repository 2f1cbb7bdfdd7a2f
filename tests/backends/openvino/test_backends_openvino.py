"""The OpenVINO adapters: graphs read by OpenVINO, the pinned and the default precision policy and what
results record of them, the convention translations, the default-eps hook, the MatMul fences, the
buffers the aliasing check reads, what the f32 runtime makes of the fused residual ops' rounded sum, and
agreement with the float64 oracle on small cases."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from conformance import oracle
from conformance.adapter import memory
from conformance.adapter.backend import Unsupported
from conformance.model.case import Case
from conformance.model.dtypes import unit_roundoff
from conformance.model.inputs import make_inputs
from conformance.model.outputs import produced

ov = pytest.importorskip("openvino")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
runtime = pytest.importorskip("backends.openvino.runtime")
edits = pytest.importorskip("backends.openvino.graph_edits")
precision = pytest.importorskip("backends.openvino.precision")
graphs = pytest.importorskip("backends.onnx.graphs")

CORE = ov.Core()
BF16_CPU = "BF16" in CORE.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
# Test-local bound, in units of the coarser dtype's roundoff times max(1, |expected|): the graphs round a
# few times per element over rows of at most 96; a wrong convention (eps, momentum, biased running
# variance, a dropped offset) is off by far more. The suite's real tolerances live in tolerances.toml.
BOUND_ULPS = 16.0

SMALL = [
    Case("layer_norm", (4, 32), "float32", 1e-5),
    Case("layer_norm", (3, 4, 16), "float32", 1e-6, norm_ndim=2, bias=False),
    Case("layer_norm", (4, 32), "float16", 1e-5, param_dtype="float32"),
    Case("layer_norm", (4, 32), "float32", 1e-5, weight=False),
    Case("rms_norm", (4, 32), "float32", 1e-6, weight_offset=1.0),
    Case("rms_norm", (4, 32), "float16", 1e-6),
    Case("add_rms_norm", (4, 32), "float32", 1e-6),
    Case("add_rms_norm", (4, 32), "float16", 1e-6, norm_input="exact"),
    Case("add_layer_norm", (4, 32), "float32", 1e-5),
    Case("add_layer_norm", (3, 4, 16), "float32", 1e-5, norm_ndim=2, bias=False),
    Case("add_layer_norm", (4, 32), "float16", 1e-5, residual_dtype="float32"),
    Case("add_layer_norm", (4, 32), "float16", 1e-5, param_dtype="float32", norm_input="exact"),
    Case("batch_norm", (8, 6), "float32", 1e-5),
    Case("batch_norm", (4, 6, 5), "float32", 1e-5, training=True),
    Case("batch_norm", (4, 3, 2, 3), "float32", 1e-5, training=True, momentum=None),
    Case("batch_norm", (4, 6, 5), "float16", 1e-5, training=True, momentum=0.3),
    Case("group_norm", (2, 8, 5), "float32", 1e-5, num_groups=4),
    Case("group_norm", (2, 8, 3, 4), "float16", 1e-5, num_groups=8, weight=False, bias=False),
    Case("instance_norm", (2, 6, 10), "float32", 1e-5),
    Case("instance_norm", (4, 3, 10), "float32", 1e-5, track_running_stats=True),
    Case(
        "instance_norm", (4, 3, 2, 5), "float32", 1e-5, track_running_stats=True, training=True, momentum=None
    ),
]
BACKENDS = {"openvino": runtime.OpenVINO, "openvino-default": runtime.OpenVINODefault}


def _id(value: object) -> str:
    return value.id if isinstance(value, Case) else str(value)


def _run(
    backend: Any, case: Case, inputs: dict[str, np.ndarray] | None = None, *, default_eps: bool = False
) -> tuple[dict[str, np.ndarray], Any]:
    inputs = make_inputs(case, grad=False) if inputs is None else inputs
    prepared = (
        backend.prepare_default_eps(case, inputs)
        if default_eps
        else backend.prepare(case, inputs, grad=False)
    )
    prepared()
    return inputs, prepared


def _bits(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint16) if array.dtype.itemsize == 2 else array


def _attrs(node: Any) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _model_ops(case: Case, *, fenced: bool = False, default_eps: bool = False) -> tuple[Any, set[str]]:
    conventions = graphs.OnnxRuntime()
    spec = graphs.build(case, conventions.plan(case, make_inputs(case, grad=False)), conventions)
    if default_eps:
        edits.drop_eps(spec)
    if fenced:
        edits.fence(spec)
    model = spec.model()
    onnx.checker.check_model(model, full_check=True)
    return spec, {op.get_type_name() for op in runtime._read(CORE, model, case.id).get_ordered_ops()}


@pytest.mark.parametrize(
    ("case", "ov_op"),
    [
        (Case("layer_norm", (4, 8), "float32", 1e-5), "MVN"),
        (Case("rms_norm", (4, 8), "float32", 1e-5), "ReduceMean"),
        (Case("add_rms_norm", (4, 8), "bfloat16", 1e-5), "ReduceMean"),
        (Case("add_layer_norm", (4, 8), "float16", 1e-5, norm_input="exact"), "MVN"),
        (Case("batch_norm", (4, 3, 5), "float16", 1e-5), "BatchNormInference"),
        (Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True), "ReduceMean"),
        (Case("group_norm", (2, 8, 5), "float32", 1e-5, num_groups=4), "GroupNormalization"),
        (Case("instance_norm", (2, 6, 5), "float32", 1e-5), "MVN"),
    ],
    ids=_id,
)
def test_each_op_s_graph_is_read_by_the_onnx_frontend(case: Case, ov_op: str) -> None:
    # LayerNormalization-17 -> MVN; RMSNormalization-23 -> its decomposition (fused to RMS by the CPU
    # plugin); BatchNormalization-15 training_mode=1 -> batch statistics and running-statistic outputs;
    # GroupNormalization -> opset12 GroupNormalization (the plugin runs it as MVN + Eltwise);
    # InstanceNormalization -> MVN with the affine.
    _, ops = _model_ops(case)
    assert ov_op in ops
    info = _run(runtime.OpenVINO(), case)[1].info()
    assert info["opset"] == graphs.OPSETS[case.op]


def test_group_norm_on_two_dimensional_input_is_unsupported_with_the_plugin_s_reason() -> None:
    # The frontend reads it; the CPU plugin implements GroupNormalization for rank 3 and up only.
    case = Case("group_norm", (4, 8), "float32", 1e-5, num_groups=2)
    with pytest.raises(
        Unsupported, match=r"CPU plugin cannot compile.*Unsupported operation of type: GroupNorm"
    ):
        runtime.OpenVINO().prepare(case, make_inputs(case, grad=False), grad=False)


def test_a_graph_the_frontend_cannot_convert_is_unsupported_with_its_summary() -> None:
    helper = onnx.helper
    node = helper.make_node("NotAnOnnxOp", ["x"], ["y"])
    values = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in ("x", "y")]
    model = helper.make_model(
        helper.make_graph([node], "g", values[:1], values[1:]), opset_imports=[helper.make_opsetid("", 17)]
    )
    with pytest.raises(Unsupported, match=r"ONNX frontend cannot read .*No conversion rule.*NotAnOnnxOp"):
        runtime._read(CORE, model, "a test graph")


def test_batch_norm_with_wider_parameters_is_unsupported_with_the_frontend_s_reason() -> None:
    # ONNX's BatchNormalization takes x, scale and statistics of different types (T, T1, T2); the
    # frontend maps it to BatchNormInference, which binds them to one.
    case = Case("batch_norm", (4, 6, 5), "float16", 1e-5, param_dtype="float32")
    with pytest.raises(Unsupported, match=r"BatchNormalization-15: Input element types do not match"):
        runtime.OpenVINO().prepare(case, make_inputs(case, grad=False), grad=False)


@pytest.mark.parametrize(
    ("case", "kernel"),
    [
        (Case("layer_norm", (4, 32), "float32", 1e-5), "MVN:f32"),
        (Case("rms_norm", (4, 32), "float32", 1e-5), "RMS:f32"),
        (Case("layer_norm", (4, 32), "bfloat16", 1e-5), "MVN:f32"),
    ],
    ids=_id,
)
def test_precision_is_pinned_to_f32_and_recorded(case: Case, kernel: str) -> None:
    backend = runtime.OpenVINO()
    built = backend._cache.get(
        "probe",
        lambda: backend._compile(case, backend.conventions.plan(case, make_inputs(case, grad=False)), False),
    )[0]
    assert precision.short(built.model.get_property("INFERENCE_PRECISION_HINT")) == "f32"
    info = _run(backend, case)[1].info()
    assert info["requested_precision"] == "f32" and info["inference_precision_hint"] == "f32"
    # With bf16 hardware the plugin runs a bfloat16 graph's elementwise nodes (the affine after MVN,
    # the residual Add) natively even under the f32 hint; the normalization itself stays f32.
    native = "f32+bf16" if BF16_CPU and case.dtype == "bfloat16" else "f32"
    assert info["norm_precision"] == native and kernel in info["norm_nodes"]
    assert info["norm_lowered"] is False and "fence_nodes" not in info
    assert info["compile_s"] > 0 and info["openvino"] == ov.__version__ and info["threads"] >= 1


def test_float64_graphs_run_in_float32_and_results_say_so() -> None:
    case = Case("layer_norm", (4, 32), "float64", 1e-5, dist="offset")
    inputs, prepared = _run(runtime.OpenVINO(), case)
    info = prepared.info()
    assert info["norm_precision"] == "f32" and info["norm_lowered"] is True
    # The CPU plugin converts the graph to f32: the same graph in float32 on the rounded inputs gives
    # the same bits (the deviation's verified reason).
    single = dataclasses.replace(case, dtype="float32")
    _, reference = _run(runtime.OpenVINO(), single, {k: v.astype(np.float32) for k, v in inputs.items()})
    assert np.array_equal(prepared.outputs()["y"].astype(np.float32), reference.outputs()["y"])


def _plugin_bf16(values: np.ndarray) -> np.ndarray:
    """The CPU plugin's bfloat16_t::round_to_nearest_even: (bits + ((bits & 0x10000) >> 1)) >> 16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + ((bits & 0x10000) >> 1)) >> 16).astype(np.uint16)


def test_bfloat16_outputs_are_rounded_by_the_plugin_s_rule() -> None:
    # The exact-sum graph casts the float32 sum to bfloat16 explicitly: an f32 -> bf16 Convert on every
    # CPU (where the graph adds in bfloat16, a CPU with bf16 hardware adds natively, tested below).
    case = Case("add_rms_norm", (8, 64), "bfloat16", 1e-5, norm_input="exact")
    inputs, prepared = _run(runtime.OpenVINO(), case)
    got = prepared.outputs()["residual_out"]
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    exact = inputs["x"].astype(np.float32) + inputs["residual"].astype(np.float32)  # exact in float32
    assert np.array_equal(got.view(np.uint16), _plugin_bf16(exact))
    nearest_even = exact.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.count_nonzero(got.view(np.uint16) != nearest_even) > 0


@pytest.mark.skipif(not BF16_CPU, reason="this CPU has no bf16: the plugin runs bfloat16 graphs in f32")
def test_with_bf16_hardware_the_bfloat16_add_rounds_to_nearest_even() -> None:
    case = Case("add_rms_norm", (8, 64), "bfloat16", 1e-5)
    inputs, prepared = _run(runtime.OpenVINO(), case)
    assert prepared.info()["norm_precision"] == "f32+bf16"
    exact = inputs["x"].astype(np.float32) + inputs["residual"].astype(np.float32)
    nearest_even = exact.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(prepared.outputs()["residual_out"].view(np.uint16), nearest_even)


def test_momentum_is_one_minus_pytorch_s_in_the_graph() -> None:
    backend = runtime.OpenVINO()
    for momentum, attribute in ((0.1, 0.9), (0.5, 0.5), (None, 0.0)):
        case = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True, momentum=momentum)
        spec = graphs.build(case, graphs.Plan("float32", 15), backend.conventions)
        node = next(n for n in spec.nodes if n.op_type == "BatchNormalization")
        assert _attrs(node)["momentum"] == pytest.approx(attribute)
        assert _run(backend, case)[1].info()["onnx_momentum"] == pytest.approx(attribute)


@pytest.mark.parametrize(
    "case",
    [
        Case("layer_norm", (6, 40), "float32", 1e-2),
        Case("rms_norm", (6, 40), "float32", 1e-2),
        Case("batch_norm", (8, 6, 5), "float32", 1e-2),
        Case("group_norm", (4, 6, 5), "float32", 1e-2, num_groups=3),
        Case("instance_norm", (4, 6, 5), "float32", 1e-2),
    ],
    ids=_id,
)
def test_eps_is_passed_and_the_hook_leaves_it_out(case: Case) -> None:
    spec, _ = _model_ops(case)
    node = next(n for n in spec.nodes if n.op_type in edits.NORMS)
    assert _attrs(node)["epsilon"] == pytest.approx(1e-2, rel=1e-7)  # a FLOAT attribute: 32-bit
    spec, _ = _model_ops(case, default_eps=True)
    node = next(n for n in spec.nodes if n.op_type in edits.NORMS)
    assert "epsilon" not in _attrs(node)
    # Without the attribute the runtime applies ONNX's default, 1e-5: the same bits as eps=1e-5 given.
    backend = runtime.OpenVINO()
    inputs, hooked = _run(backend, case, default_eps=True)
    _, given = _run(backend, dataclasses.replace(case, eps=1e-5), inputs)
    assert hooked.info()["eps"].startswith("ONNX default")
    assert np.array_equal(hooked.outputs()["y"], given.outputs()["y"])
    _, explicit = _run(backend, case, inputs)
    assert not np.array_equal(hooked.outputs()["y"], explicit.outputs()["y"])


@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize("case", SMALL, ids=_id)
def test_small_cases_agree_with_the_oracle(name: str, case: Case) -> None:
    inputs, prepared = _run(BACKENDS[name](), case)
    out = prepared.outputs()
    expected = oracle.evaluate(case, inputs, grad=False)
    assert set(out) == set(produced(case, grad=False))
    u = max(unit_roundoff(case.dtype), unit_roundoff(case.weight_dtype))
    info = prepared.info()
    if name == "openvino-default" and info["inference_precision_hint"] == "bf16":
        # A CPU with AVX512-BF16 or AMX: the default policy runs the fenced norm in bf16 (the ledger's
        # hint-conditioned entries). The values must still be right to the precision it says it used.
        assert "bf16" in info["norm_precision"], info
        u = max(u, unit_roundoff("bfloat16"))
    for key, value in out.items():
        assert value.shape == expected[key].shape, key
        err = np.max(np.abs(value.astype(np.float64) - expected[key]))
        bound = BOUND_ULPS * u * max(1.0, float(np.max(np.abs(expected[key]))))
        assert err <= bound, f"{key}: max |error| {err:.3g} > test bound {bound:.3g}"


@pytest.mark.parametrize("name", list(BACKENDS))
def test_repeated_calls_give_the_same_bits_and_leave_inputs_alone(name: str) -> None:
    case = Case("batch_norm", (4, 3, 5), "bfloat16", 1e-5, training=True)
    inputs = make_inputs(case, grad=False)
    pristine = {k: v.copy() for k, v in inputs.items()}
    prepared = BACKENDS[name]().prepare(case, inputs, grad=False)
    with pytest.raises(RuntimeError, match="before the first call"):
        prepared.outputs()
    results = [prepared() or dict(prepared.outputs()) for _ in range(3)]
    for later in results[1:]:
        for key, value in later.items():
            assert np.array_equal(_bits(value), _bits(results[0][key])), key
    results[0]["y"][...] = 0  # the returned arrays are copies, not the request's tensors
    assert not np.all(prepared.outputs()["y"].astype(np.float32) == 0)
    for key, value in inputs.items():
        assert np.array_equal(_bits(value), _bits(pristine[key])), key


def test_one_compiled_model_serves_every_case_of_a_signature() -> None:
    backend = runtime.OpenVINO()
    a = Case("layer_norm", (4, 64), "float32", 1e-5)
    b = Case("layer_norm", (16, 64), "float32", 1e-5, dist="offset", seed=3)
    c = Case("layer_norm", (16, 64), "float32", 1e-6)
    infos = [_run(backend, case)[1].info() for case in (a, b, c)]
    assert [info["cached"] for info in infos] == [False, True, False]
    assert infos[0]["compile_s"] > 0 and infos[1]["compile_s"] == 0.0 and infos[2]["compile_s"] > 0
    assert len(backend._cache) == 2


def test_the_fence_is_an_exact_matmul_on_each_side_of_the_norm() -> None:
    case = Case("add_rms_norm", (4, 3, 16), "bfloat16", 1e-5, norm_ndim=2)
    spec, ops = _model_ops(case, fenced=True)
    kinds = [n.op_type for n in spec.nodes if n.op_type != "Constant"]
    assert kinds[:3] == ["Unsqueeze", "MatMul", "Squeeze"] and kinds[-3:] == [
        "Unsqueeze",
        "MatMul",
        "Squeeze",
    ]
    assert "MatMul" in ops and set(spec.outputs.values()) == {"y", "residual_out"}
    # [[1]] is stored as raw bytes: the frontend reads it as 1.0 (int32_data would read as 16256.0).
    one = next(n for n in spec.nodes if n.output[0] == "fence_one")
    assert onnx.numpy_helper.to_array(_attrs(one)["value"]).astype(np.float32).tolist() == [[1.0]]


@pytest.mark.parametrize(
    "case",
    [
        Case("layer_norm", (6, 40), "float32", 1e-5),
        Case("rms_norm", (6, 40), "bfloat16", 1e-5, weight_offset=1.0),
        Case("add_rms_norm", (6, 40), "float16", 1e-5),
        Case("add_layer_norm", (6, 40), "bfloat16", 1e-5, residual_dtype="float32"),
        Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True),
    ],
    ids=_id,
)
def test_fenced_graphs_compute_the_same_bits_where_the_runtime_runs_f32(case: Case) -> None:
    if BF16_CPU:
        pytest.skip("this CPU lowers the fenced norm to bf16 by default")
    inputs = make_inputs(case, grad=False)
    x = inputs["x"].astype(np.float32)
    x.flat[[0, 7, 45]] = np.inf, -np.inf, np.nan  # x * 1 keeps them where they are
    inputs = {**inputs, "x": x.astype(inputs["x"].dtype)}
    plain = _run(runtime.OpenVINO(), case, inputs)[1].outputs()
    fenced = _run(runtime.OpenVINODefault(), case, inputs)[1].outputs()
    for key, value in plain.items():
        assert np.array_equal(fenced[key].astype(np.float32), value.astype(np.float32), equal_nan=True), key
        assert np.isfinite(value.astype(np.float32)).any() or case.op == "batch_norm", key


def test_the_default_policy_passes_no_hint_and_records_the_runtime_s_choice() -> None:
    case = Case("layer_norm", (4, 32), "float32", 1e-5)
    info = _run(runtime.OpenVINODefault(), case)[1].info()
    default = precision.short(CORE.get_property("CPU", "INFERENCE_PRECISION_HINT"))
    assert runtime.OpenVINODefault.policy.config == {}
    assert info["requested_precision"] == "default" and info["inference_precision_hint"] == default
    assert info["fence_nodes"].startswith("FullyConnected:")
    assert "MVN:" in info["norm_nodes"]
    assert info["norm_lowered"] is (default != "f32")


def _bf16(*, fenced: bool) -> Any:
    """The adapter with the bf16 hint asked for explicitly, the norm fenced or alone."""
    backend = runtime.OpenVINO()
    backend.policy = runtime.Policy({"INFERENCE_PRECISION_HINT": "bf16"}, fenced=fenced, requested="bf16")
    return backend


@pytest.mark.skipif(BF16_CPU, reason="this CPU has bf16: the lowering itself is tested")
def test_without_bf16_hardware_the_bf16_hint_is_silently_kept_at_f32() -> None:
    # Measured on an AVX2-only CPU: the plugin accepts the hint and the compiled model reads f32.
    case = Case("rms_norm", (4, 32), "float32", 1e-5)
    for backend in (_bf16(fenced=False), _bf16(fenced=True)):
        info = _run(backend, case)[1].info()
        assert info["requested_precision"] == "bf16" and info["inference_precision_hint"] == "f32"
        assert info["norm_precision"] == "f32" and info["norm_lowered"] is False


@pytest.mark.skipif(
    not BF16_CPU, reason="needs a CPU with AVX512-BF16 or AMX (OPTIMIZATION_CAPABILITIES BF16)"
)
def test_with_bf16_hardware_the_fenced_norm_is_lowered_and_the_lone_norm_is_not() -> None:
    # intel_cpu Graph::EnforceInferencePrecision keeps the graph's tail (outputs back to the last MatMul)
    # in f32: the lone norm is tail, the fenced one is not.
    case = Case("rms_norm", (4, 32), "float32", 1e-5)
    lone = _run(_bf16(fenced=False), case)[1].info()
    fenced = _run(_bf16(fenced=True), case)[1].info()
    assert lone["inference_precision_hint"] == fenced["inference_precision_hint"] == "bf16"
    assert lone["norm_lowered"] is False and "bf16" not in lone["norm_precision"]
    assert fenced["norm_lowered"] is True and "bf16" in fenced["norm_precision"]


def _node(layer: str, prec: str, names: str = "n") -> Any:
    return precision.RuntimeNode(layer, prec, prec, names)


def test_the_decision_is_read_from_the_layer_s_nodes_only() -> None:
    nodes = (
        _node("Input", "f32"),
        _node("FullyConnected", "bf16"),
        _node("Reshape", "bf16"),
        _node("Subgraph", "bf16", "Convert_12,Convert_13"),  # fused input conversions: plumbing
        _node("MVN", "bf16"),
        _node("Eltwise", "i32", "count"),  # shape arithmetic
        _node("Eltwise", "bf16", "Multiply_3,y_norm"),
        _node("FullyConnected", "bf16"),
        _node("Output", "f32"),
    )
    info = precision.decision(nodes, "bf16")
    assert info == {
        "inference_precision_hint": "bf16",
        "norm_precision": "bf16",
        "norm_nodes": "MVN:bf16->bf16 Eltwise:bf16->bf16",
        "fence_nodes": "FullyConnected:bf16",
    }
    assert precision.lowered(nodes, "float32") and not precision.lowered(nodes, "bfloat16")
    lone = (_node("Input", "f32"), _node("MVN", "f32"), _node("Output", "f32"))
    assert precision.decision(lone, "bf16")["norm_precision"] == "f32"
    assert not precision.lowered(lone, "float32") and precision.lowered(lone, "float64")


@pytest.mark.parametrize("name", list(BACKENDS))
def test_capabilities_name_the_cpu_versions_and_no_backward(name: str) -> None:
    caps = BACKENDS[name]().capabilities()
    assert caps.device == "cpu" and caps.device_name == CORE.get_property("CPU", "FULL_DEVICE_NAME")
    assert "backward" not in caps.features and {"training", "momentum_none", "param_dtype"} <= caps.features
    assert caps.notes["openvino"] == ov.get_version() and caps.notes["onnx"] == onnx.__version__
    assert "f32" in caps.notes["inference_precision"]
    # ONNX tensors have no memory format; the group ops run through onnx_graphs' graphs.
    assert "channels_last" not in caps.features and {"group_norm", "instance_norm"} <= caps.ops


@pytest.mark.parametrize("name", list(BACKENDS))
def test_buffers_are_the_feeds_and_the_request_s_output_tensors(name: str) -> None:
    case = Case("add_layer_norm", (4, 32), "bfloat16", 1e-5, norm_input="exact")
    inputs = make_inputs(case, grad=False)
    prepared = BACKENDS[name]().prepare(case, inputs, grad=False)
    # Before the first call only the feeds exist: the request's outputs are placed by infer().
    assert set(prepared.buffers()) == {"x", "residual", "weight", "bias"}
    names = ("y", "residual_out")
    watch = memory.Watch.start(prepared, inputs, names)
    prepared()
    out = prepared.outputs()
    watch.finish(prepared, out, names)
    assert watch.reported and set(watch.outputs) == set(names)
    assert memory.problems(watch, {}, inputs, out) == []


@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
def test_half_graphs_run_in_f32_so_the_norm_reads_the_unrounded_sum(op: str) -> None:
    # The plugin (hint f32) converts the float16 graph to f32: the Add's f32 result reaches the norm
    # unrounded, and only the outputs are rounded to float16. Verified against the float32 twin graph.
    case = Case(op, (16, 200), "float16", 1e-5, dist="offset")
    inputs, prepared = _run(runtime.OpenVINO(), case)
    out = prepared.outputs()
    twin = dataclasses.replace(case, dtype="float32", norm_input="exact")
    single = {k: v.astype(np.float32) for k, v in inputs.items()}
    reference = _run(runtime.OpenVINO(), twin, single)[1].outputs()
    for key, value in out.items():
        assert np.array_equal(value, reference[key].astype(np.float16)), key
    exact = oracle.evaluate(dataclasses.replace(case, norm_input="exact"), inputs, grad=False)["y"]
    stored = oracle.evaluate(case, inputs, grad=False)["y"]
    error = {name: np.max(np.abs(out["y"] - want)) for name, want in (("exact", exact), ("stored", stored))}
    if op == "add_layer_norm":
        # LayerNorm's centring shows the stored sum's rounding (u * kappa, amplified by kappa / spread).
        assert error["exact"] < error["stored"] / 10, error
