"""The flax adapter: its translations (momentum 1 - m, eps, axes, dtypes, Gemma offset, GroupNorm's
channels-last transpose), the defaults it keeps on purpose (use_fast_variance, Flax's own eps), what it
leaves out (InstanceNorm's running statistics, torch's channels_last layout), the fused residual add
(its conventions, the backward through both outputs, its buffers, XLA's unrounded sum), and agreement
of small cases with the oracle."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from conformance import oracle
from conformance.adapter import memory
from conformance.adapter.backend import Unsupported
from conformance.fingerprint import cases as fingerprint_cases
from conformance.judging import tolerances
from conformance.judging.verdict import compare_outputs
from conformance.model.case import Case
from conformance.model.inputs import make_inputs
from conformance.model.outputs import produced

pytest.importorskip("flax")
jc = pytest.importorskip("backends.common.jax_support")
flax_linen = pytest.importorskip("backends.flax.linen")
nn = pytest.importorskip("flax.linen")
jnp = pytest.importorskip("jax.numpy")

BACKEND = flax_linen.FlaxLinen()


def _run(case: Case, *, grad: bool, backend=BACKEND):
    inputs = make_inputs(case, grad=grad)
    prepared = backend.prepare(case, inputs, grad=grad)
    prepared()
    prepared.synchronize()
    return inputs, prepared, prepared.outputs()


def _spec(case: Case, **changes):
    fields = {
        "grad": False,
        "eps": case.eps,
        "momentum": BACKEND.flax_momentum(case),
        "transposed": BACKEND.transposes(case),
        **changes,
    }
    return flax_linen.Spec.of(case, case.weight_dtype, **fields)


# --- translations --------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_momentum_is_translated_to_one_minus_m(m: float) -> None:
    case = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True, momentum=m)
    assert BACKEND.flax_momentum(case) == 1.0 - m
    module = flax_linen.batch_norm_module(_spec(case))
    assert module.momentum == 1.0 - m


def test_running_mean_follows_pytorch_momentum() -> None:
    """float64: Flax's m_f * r + (1 - m_f) * b with m_f = 1 - m is PyTorch's (1 - m) r + m b."""
    case = Case("batch_norm", (4, 3, 5), "float64", 1e-5, training=True, momentum=0.25)
    inputs, prepared, out = _run(case, grad=False)
    x, r = inputs["x"], inputs["running_mean"]
    expected = 0.75 * r + 0.25 * x.mean(axis=(0, 2))
    np.testing.assert_allclose(out["running_mean"], expected, rtol=1e-14, atol=0)
    assert prepared.info()["flax_momentum"] == 0.75


def test_running_var_is_flax_biased_update() -> None:
    """The documented deviation: Flax blends in the biased batch variance, PyTorch the unbiased one."""
    case = Case("batch_norm", (4, 3, 5), "float64", 1e-5, training=True, momentum=0.5)
    inputs, _, out = _run(case, grad=False)
    x, r = inputs["x"], inputs["running_var"]
    biased, unbiased = x.var(axis=(0, 2)), x.var(axis=(0, 2), ddof=1)
    np.testing.assert_allclose(out["running_var"], 0.5 * r + 0.5 * biased, rtol=1e-12)
    assert not np.allclose(out["running_var"], 0.5 * r + 0.5 * unbiased, rtol=1e-3)


def test_momentum_none_is_unsupported_and_undeclared() -> None:
    case = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True, momentum=None)
    assert "momentum_none" not in BACKEND.capabilities().features
    with pytest.raises(Unsupported, match="cumulative"):
        BACKEND.prepare(case, make_inputs(case, grad=False), grad=False)


def _op_case(op: str, eps: float) -> Case:
    """A small float32 case of ``op`` (channel ops: x (N, C, L); GroupNorm with 3 groups of 2 channels)."""
    if op == "group_norm":
        return Case(op, (6, 6, 4), "float32", eps, num_groups=3)
    if op in ("batch_norm", "instance_norm"):
        return Case(op, (6, 3, 4), "float32", eps)
    return Case(op, (4, 24), "float32", eps)


ALL_OPS = [
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "add_rms_norm",
    "add_layer_norm",
    "group_norm",
    "instance_norm",
]


@pytest.mark.parametrize("op", ALL_OPS)
def test_eps_is_passed_explicitly(op: str) -> None:
    case = _op_case(op, 3e-4)
    module = flax_linen.MODULES[op](_spec(case))
    assert module.epsilon == 3e-4
    _, prepared, _ = _run(case, grad=False)
    assert prepared.info()["epsilon"] == 3e-4


@pytest.mark.parametrize("op", ALL_OPS)
def test_default_eps_hook_leaves_flax_default(op: str) -> None:
    """The hook builds the module without epsilon; Flax's defaults are read from its classes."""
    cls = {
        "layer_norm": nn.LayerNorm,
        "rms_norm": nn.RMSNorm,
        "add_rms_norm": nn.RMSNorm,
        "add_layer_norm": nn.LayerNorm,
        "group_norm": nn.GroupNorm,
        "instance_norm": nn.InstanceNorm,
    }.get(op, nn.BatchNorm)
    assert flax_linen.default_eps(op) == cls().epsilon
    case = _op_case(op, 3e-4)
    prepared = BACKEND.prepare_default_eps(case, make_inputs(case, grad=False))
    assert prepared.info()["epsilon"] == flax_linen.default_eps(op)


def test_flax_default_eps_values() -> None:
    # The fingerprint's default-eps answers for Flax 0.12: LayerNorm, RMSNorm, GroupNorm and
    # InstanceNorm 1e-6 (torch: 1e-5 for all but RMSNorm), BatchNorm 1e-5.
    assert flax_linen.default_eps("layer_norm") == 1e-6
    assert flax_linen.default_eps("rms_norm") == 1e-6
    assert flax_linen.default_eps("batch_norm") == 1e-5
    assert flax_linen.default_eps("group_norm") == 1e-6
    assert flax_linen.default_eps("instance_norm") == 1e-6


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_multi_axis_reduces_and_scales_over_trailing_dims(op: str) -> None:
    case = Case(op, (2, 3, 4), "float32", 1e-5, norm_ndim=2)
    module = flax_linen.MODULES[op](_spec(case))
    assert tuple(module.reduction_axes) == (-2, -1) == tuple(module.feature_axes)


def test_group_norm_takes_x_channels_last_with_the_case_groups() -> None:
    """linen.GroupNorm's feature axis is the last: the adapter moves C there and y back."""
    case = Case("group_norm", (2, 8, 5, 3), "float64", 1e-5, num_groups=4)
    spec = _spec(case)
    module = flax_linen.group_norm_module(spec)
    assert spec.transposed and module.num_groups == 4 and module.group_size is None
    assert tuple(module.reduction_axes) == (1, 2, 3)  # spatial and channels of (N, H, W, C)
    inputs, prepared, out = _run(case, grad=False)
    assert prepared.info()["num_groups"] == 4 and "transposed" in prepared.info()["layout"]
    # The same module applied by hand to the channels-last array gives y transposed, to float64
    # rounding (eager and jitted XLA fuse differently; a wrong axis would be off by O(1)).
    params = {"scale": inputs["weight"], "bias": inputs["bias"]}
    by_hand = module.apply({"params": params}, np.moveaxis(inputs["x"], 1, -1))
    assert np.max(np.abs(np.moveaxis(np.asarray(by_hand), -1, 1) - out["y"])) < 1e-13


def test_group_norm_of_two_dims_groups_the_channels() -> None:
    """(N, C): the transpose is the identity and each group is C/G channels of one sample."""
    case = Case("group_norm", (3, 6), "float64", 1e-5, num_groups=2, weight=False, bias=False)
    inputs, _, out = _run(case, grad=False)
    groups = inputs["x"].reshape(3, 2, 3)
    expected = (groups - groups.mean(-1, keepdims=True)) / np.sqrt(groups.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out["y"], expected.reshape(3, 6), rtol=1e-12, atol=1e-12)


def test_instance_norm_uses_feature_axes_one_without_a_transpose() -> None:
    case = Case("instance_norm", (2, 3, 4, 5), "float32", 1e-5)
    spec = _spec(case)
    module = flax_linen.instance_norm_module(spec)
    assert not spec.transposed and module.feature_axes == 1
    _, prepared, _ = _run(case, grad=False)
    assert "layout" not in prepared.info()


@pytest.mark.parametrize(
    ("case", "why"),
    [
        (Case("instance_norm", (2, 3, 6), "float32", 1e-5, track_running_stats=True), "running statistics"),
        (Case("group_norm", (2, 4, 3, 5), "float32", 1e-5, num_groups=2, layout="channels_last"), "layout"),
    ],
)
def test_running_stats_and_channels_last_are_undeclared_and_unsupported(case: Case, why: str) -> None:
    caps = BACKEND.capabilities()
    assert not {"running_stats", "channels_last"} & caps.features
    assert caps.why_not(case) is not None
    with pytest.raises(Unsupported, match=why):
        BACKEND.prepare(case, make_inputs(case, grad=False), grad=False)


@pytest.mark.parametrize("op", ["group_norm", "instance_norm"])
def test_group_statistics_are_one_pass_by_flax_default(op: str) -> None:
    """The ledger's reason for offset groups, recomputed: with Flax's default use_fast_variance=True
    y fails the oracle's tolerance; the same module with use_fast_variance=False passes."""
    groups = {"num_groups": 3} if op == "group_norm" else {}
    case = Case(op, (2, 6, 10), "float32", 1e-5, dist="offset", **groups)
    inputs, prepared, out = _run(case, grad=False)
    assert prepared.info()["use_fast_variance"] is True
    expected = oracle.evaluate(case, inputs, grad=False)
    table = tolerances.read_tolerances()
    (one_pass,) = compare_outputs(case, inputs, expected, out, ("y",), table)
    assert not one_pass.passed
    spec = _spec(case)
    module = flax_linen.MODULES[op](spec).clone(use_fast_variance=False)
    step = flax_linen.forward_fn(spec, module)
    loaded = flax_linen.to_device(case, spec, inputs, flax_linen.scale(case, inputs))
    (y,), _ = step(loaded.params, loaded.stats, loaded.x, None)
    (two_pass,) = compare_outputs(case, inputs, expected, {"y": np.asarray(y)}, ("y",), table)
    assert two_pass.passed, two_pass.worst_ratio


def test_batch_norm_channel_axis_is_one() -> None:
    for training in (False, True):
        case = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=training)
        module = flax_linen.batch_norm_module(_spec(case))
        assert module.axis == 1 and module.use_running_average is (not training)


@pytest.mark.parametrize(
    ("case", "dtype", "param_dtype"),
    [
        (Case("layer_norm", (4, 24), "bfloat16", 1e-5, param_dtype="float32"), "bfloat16", "float32"),
        (Case("rms_norm", (4, 24), "float16", 1e-5), "float16", "float16"),
        (Case("rms_norm", (4, 24), "float32", 1e-5, param_dtype="bfloat16"), "float32", "bfloat16"),
        (Case("batch_norm", (4, 3, 5), "bfloat16", 1e-5, training=True), "bfloat16", "bfloat16"),
    ],
)
def test_dtype_is_the_activation_dtype_and_param_dtype_the_parameters(case, dtype, param_dtype) -> None:
    module = flax_linen.MODULES[case.op](_spec(case))
    assert np.dtype(module.dtype) == jc.jax_dtype(dtype)
    assert np.dtype(module.param_dtype) == jc.jax_dtype(param_dtype)
    _, _, out = _run(case, grad=True)
    assert out["y"].dtype == jc.jax_dtype(dtype) and out["dx"].dtype == jc.jax_dtype(dtype)
    assert out["dweight"].dtype == jc.jax_dtype(param_dtype)


def test_batch_stats_are_held_in_float32_for_half_parameters() -> None:
    case = Case("batch_norm", (4, 3, 5), "bfloat16", 1e-5, training=True)
    _, prepared, out = _run(case, grad=False)
    assert prepared.info()["batch_stats_dtype"] == "float32"
    assert out["running_mean"].dtype == np.float32


def test_gemma_offset_is_a_wider_scale_and_dweight_keeps_the_parameter_dtype() -> None:
    case = Case("rms_norm", (4, 64), "bfloat16", 1e-6, weight_offset=1.0)
    inputs, prepared, out = _run(case, grad=True)
    assert prepared.info()["param_dtype"] == "float32"
    assert out["dweight"].dtype == ml_dtypes.bfloat16
    assert flax_linen.scale_dtype(case, flax_linen.scale(case, inputs)) == "float32"


def test_use_fast_variance_is_flax_default() -> None:
    """Kept on purpose: users run Flax with its default one-pass variance."""
    default = {f.name: f.default for f in dataclasses.fields(nn.LayerNorm)}["use_fast_variance"]
    case = Case("layer_norm", (4, 24), "float32", 1e-5)
    module = flax_linen.layer_norm_module(_spec(case))
    assert module.use_fast_variance is default is True
    _, prepared, _ = _run(case, grad=False)
    assert prepared.info()["use_fast_variance"] is True


def test_float64_runs_in_float64() -> None:
    """x64 mode is on: float64 outputs, and float64 accuracy (float32 would be ~1e-7 off)."""
    case = Case("layer_norm", (4, 24), "float64", 1e-5)
    inputs, _, out = _run(case, grad=False)
    assert out["y"].dtype == np.float64
    expected = oracle.evaluate(case, inputs, grad=False)["y"]
    assert np.max(np.abs(out["y"] - expected)) < 1e-13


# --- the contract ---------------------------------------------------------------------------------


def test_capabilities() -> None:
    caps = BACKEND.capabilities()
    assert caps.ops == set(ALL_OPS)
    assert caps.dtypes == {"float64", "float32", "float16", "bfloat16"}
    assert {"backward", "training", "weight_offset", "no_weight", "no_bias", "multi_axis"} <= caps.features
    assert {"residual_dtype", "exact_sum"} <= caps.features and not caps.aliases
    assert caps.notes["flax"] and caps.notes["jax"] and "use_fast_variance" in caps.notes


def test_compile_is_in_prepare_and_cached() -> None:
    backend = flax_linen.FlaxLinen()
    case = Case("rms_norm", (3, 16), "float32", 1e-5)
    _, first, _ = _run(case, grad=True, backend=backend)
    _, second, _ = _run(case, grad=True, backend=backend)
    assert first.info()["compile_s"] > 0 and not first.info()["cached"]
    assert second.info()["compile_s"] == 0.0 and second.info()["cached"]


@pytest.mark.parametrize(
    "case",
    [
        Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True),
        Case("add_rms_norm", (4, 24), "bfloat16", 1e-5),
        Case("group_norm", (2, 8, 3, 5), "bfloat16", 1e-5, num_groups=4, param_dtype="float32"),
    ],
)
def test_repeated_calls_same_bits_inputs_untouched(case: Case) -> None:
    inputs = make_inputs(case, grad=True)
    pristine = {k: v.copy() for k, v in inputs.items()}
    prepared = BACKEND.prepare(case, inputs, grad=True)
    prepared()
    first = prepared.outputs()
    prepared()
    second = prepared.outputs()
    assert set(first) == set(produced(case, True))
    for name in first:
        assert first[name].tobytes() == second[name].tobytes(), name
    for name, value in inputs.items():
        assert value.tobytes() == pristine[name].tobytes(), name


def test_outputs_before_call_is_an_error() -> None:
    case = Case("layer_norm", (4, 24), "float32", 1e-5)
    prepared = BACKEND.prepare(case, make_inputs(case, grad=False), grad=False)
    with pytest.raises(RuntimeError, match="before the first call"):
        prepared.outputs()


def test_bfloat16_round_trip_is_bit_exact_and_copies() -> None:
    host = (np.arange(12, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16)
    device = jc.to_jax(host)
    back = jc.to_numpy(device)
    assert back.dtype == ml_dtypes.bfloat16 and back.tobytes() == host.tobytes()
    back[0] = 5
    assert host[0] == 0


# --- the fused residual add -----------------------------------------------------------------------

BF16 = jc.jax_dtype("bfloat16")


@pytest.mark.parametrize(
    ("stream", "exact", "stored", "read"),
    [
        ("bfloat16", False, 1.0, 1.0),  # rounded once to bfloat16, and normalized as stored
        ("bfloat16", True, 1.0, 1.0 + 2.0**-10),  # stored rounded, normalized unrounded (float32)
        ("float32", False, 1.0 + 2.0**-10, 1.0 + 2.0**-10),  # residual in float32: h in float32
    ],
)
def test_residual_sum_stores_the_stream_dtype_and_feeds_the_norm_the_convention(
    stream: str, exact: bool, stored: float, read: float
) -> None:
    # 1 + 2^-10 needs 10 significand bits: bfloat16 (7) rounds it to 1, float32 holds it.
    x = jnp.ones((2,), BF16)
    residual = jnp.full((2,), 2.0**-10, jc.jax_dtype(stream))
    out, normed = jc.residual_sum(x, residual, stream, exact=exact)
    assert out.dtype == jc.jax_dtype(stream)
    assert normed.dtype == (jnp.float32 if exact or stream == "float32" else BF16)
    assert np.asarray(out, np.float64).tolist() == [stored, stored]
    assert np.asarray(normed, np.float64).tolist() == [read, read]


def test_layer_norm_of_a_float32_sum_computes_in_float32_and_rounds_only_y() -> None:
    """Why residual_dtype needs no cast before the module: linen.LayerNorm(dtype=bfloat16) given float32
    h normalizes h itself in float32 (dtype is the result's), bit for bit the float32 module's y rounded
    once; h rounded to bfloat16 first would give other values."""
    case = Case("add_layer_norm", (4, 24), "bfloat16", 1e-5, residual_dtype="float32")
    inputs = make_inputs(case, grad=False)
    module = flax_linen.layer_norm_module(_spec(case))
    variables = {"params": {"scale": inputs["weight"], "bias": inputs["bias"]}}
    h32 = inputs["x"].astype(np.float32) + inputs["residual"]
    y = np.asarray(module.apply(variables, h32))
    wide = np.asarray(module.clone(dtype=jnp.float32).apply(variables, h32))
    assert y.dtype == BF16 and y.tobytes() == wide.astype(BF16).tobytes()
    rounded_first = np.asarray(module.apply(variables, h32.astype(BF16)))
    assert not np.array_equal(y, rounded_first)


@pytest.mark.parametrize(
    "case",
    [
        Case("add_layer_norm", (4, 24), "float32", 1e-5),
        Case("add_rms_norm", (4, 24), "bfloat16", 1e-5, residual_dtype="float32", norm_input="exact"),
    ],
    ids=lambda c: c.id,
)
def test_backward_takes_both_cotangents(case: Case) -> None:
    """dx and dresidual are dL/dh: with dy = 0 only dresidual_out reaches h, so both are it, exactly
    (dresidual in the stream's dtype, dx rounded to the activation dtype)."""
    inputs = dict(make_inputs(case, grad=True))
    inputs["dy"] = np.zeros_like(inputs["dy"])
    prepared = BACKEND.prepare(case, inputs, grad=True)
    prepared()
    out = prepared.outputs()
    given = inputs["dresidual_out"]
    assert out["dresidual"].dtype == given.dtype and out["dresidual"].tobytes() == given.tobytes()
    assert out["dx"].dtype == jc.jax_dtype(case.dtype)
    assert out["dx"].tobytes() == given.astype(jc.jax_dtype(case.dtype)).tobytes()


def test_buffers_are_distinct_device_arrays() -> None:
    """What the aliasing check sees: the prepared device inputs and each output's own buffer."""
    case = Case("add_layer_norm", (4, 24), "bfloat16", 1e-5)
    inputs = make_inputs(case, grad=True)
    prepared = BACKEND.prepare(case, inputs, grad=True)
    names = produced(case, True)
    watch = memory.Watch.start(prepared, inputs, names)
    prepared()
    returned = prepared.outputs()
    watch.finish(prepared, returned, names)
    assert watch.reported and set(watch.outputs) == set(names) == set(returned)
    assert set(watch.inputs) == {"x", "residual", "dy", "dresidual_out", "weight", "bias"}
    assert memory.problems(watch, {}, inputs, returned) == []


def test_xla_normalizes_the_unrounded_bfloat16_sum() -> None:
    """The add_*.sum deviation, recomputed on the fingerprint's probe: the program rounds h to bfloat16
    (residual_out is rounded), but XLA's default allow_excess_precision fuses the add into the norm's
    float32 upcast, so y is the oracle's with norm_input="exact", not the rounded one."""
    probe = fingerprint_cases.sum_ln()()
    case, inputs = probe.case, probe.inputs
    prepared = BACKEND.prepare(case, inputs, grad=False)
    prepared()
    out = prepared.outputs()
    table = tolerances.read_tolerances()
    names = ("y", "residual_out")
    exact = oracle.evaluate(dataclasses.replace(case, norm_input="exact"), inputs, grad=False)
    rounded = oracle.evaluate(case, inputs, grad=False)
    assert all(c.passed for c in compare_outputs(case, inputs, exact, out, names, table))
    assert {c.output for c in compare_outputs(case, inputs, rounded, out, names, table) if not c.passed} == {
        "y"
    }


# --- agreement with the oracle through the suite's tolerance matrix -------------------------------

AGREE = [
    Case("layer_norm", (8, 40), "float32", 1e-5),
    Case("layer_norm", (3, 4, 10), "float32", 1e-5, norm_ndim=2, weight=False),
    Case("layer_norm", (8, 40), "bfloat16", 1e-5, param_dtype="float32"),
    Case("rms_norm", (8, 40), "float16", 1e-6),
    Case("rms_norm", (8, 40), "bfloat16", 1e-6, weight_offset=1.0),
    Case("add_rms_norm", (8, 40), "float32", 1e-6),
    Case("add_layer_norm", (8, 40), "float32", 1e-5),
    Case("add_layer_norm", (8, 40), "bfloat16", 1e-5, residual_dtype="float32"),
    Case("add_rms_norm", (8, 40), "float16", 1e-6, norm_input="exact"),
    Case("batch_norm", (6, 3, 5), "float32", 1e-5),
    Case("batch_norm", (6, 3, 5), "float64", 1e-5, training=True, bias=False),
    Case("group_norm", (2, 8, 5, 5), "float32", 1e-5, num_groups=4),
    Case("group_norm", (3, 32, 7), "float64", 1e-5, num_groups=1, bias=False),
    Case("group_norm", (4, 6), "float32", 1e-5, num_groups=3),
    Case("group_norm", (2, 8, 25), "bfloat16", 1e-5, num_groups=8, param_dtype="float32"),
    Case("instance_norm", (2, 4, 6, 7), "float16", 1e-5),
    Case("instance_norm", (2, 2, 3, 4, 5), "float32", 1e-5, weight=False, bias=False),
]


@pytest.mark.parametrize("case", AGREE, ids=lambda c: c.id)
def test_agrees_with_the_oracle(case: Case) -> None:
    inputs, _, out = _run(case, grad=True)
    expected = oracle.evaluate(case, inputs, grad=True)
    names = tuple(n for n in produced(case, True) if n != "running_var")
    comparisons = compare_outputs(case, inputs, expected, out, names, tolerances.read_tolerances())
    failing = [(c.output, c.worst_ratio) for c in comparisons if not c.passed]
    assert not failing, failing
