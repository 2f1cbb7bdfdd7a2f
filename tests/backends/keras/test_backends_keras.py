"""The Keras adapters (keras on torch, keras-jax): the translations (momentum 1 - m, eps, axes,
center/scale, dtype policy, Gemma's offset, GroupNormalization's groups, Keras' default eps), the fused
residual add (the float32 policy of a norm of a float32 sum, the backward through both outputs, the
torch backend's one gradient tensor, which sum each backend normalizes), what is
left out (InstanceNorm's running statistics, torch's channels_last layout), which process runs each backend,
agreement with the oracle under the suite's own tolerance table, and the child-process path: a case
run there, a dead, crashing or hung child reported as that case's error, and no orphan child.

The test process claims Keras' torch backend (keras_layers.process_backend), so ``keras`` runs here
and ``keras-jax`` runs in its child process; suite runs set KERAS_BACKEND explicitly.
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from conformance import oracle
from conformance.adapter import memory
from conformance.adapter.backend import Unsupported
from conformance.bench.measure import interpreted
from conformance.fingerprint import cases as fingerprint_cases
from conformance.judging import tolerances
from conformance.judging.verdict import compare_outputs
from conformance.model.case import Case
from conformance.model.dtypes import round_to
from conformance.model.inputs import make_inputs
from conformance.model.outputs import forward_outputs, grad_outputs, training_outputs

keras_layers = pytest.importorskip("backends.keras.layers")
plans = pytest.importorskip("backends.keras.plan")
child = pytest.importorskip("backends.keras.child")
pytest.importorskip("torch")
# Not importorskip("keras"): importing keras before its backend is claimed would fix it (or fail).
if importlib.util.find_spec("keras") is None:
    pytest.skip("keras is not installed", allow_module_level=True)

HERE = keras_layers.process_backend("torch")  # the claim must precede any import of keras
TABLE = tolerances.read_tolerances()


def _plan(case: Case, **kwargs: Any) -> Any:
    inputs = make_inputs(case, grad=False)
    momentum = plans.keras_momentum(case.momentum) if case.op == "batch_norm" else None
    return plans.plan(case, inputs, momentum, **kwargs)


def _run(backend: Any, case: Case, inputs: dict[str, np.ndarray], grad: bool = True) -> dict[str, Any]:
    prepared = backend.prepare(case, inputs, grad=grad)
    prepared()
    prepared.synchronize()
    return dict(prepared.outputs())


def _failing(
    case: Case, inputs: dict[str, np.ndarray], expected: Any, actual: Any, grad: bool = True
) -> set[str]:
    names = (*forward_outputs(case), *(grad_outputs(case) if grad else ()), *training_outputs(case))
    return {c.output for c in compare_outputs(case, inputs, expected, actual, names, TABLE) if not c.passed}


# ----------------------------------------------------------------------------- translations
@pytest.mark.parametrize("m", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_momentum_is_passed_as_one_minus_m(m):
    case = Case("batch_norm", (6, 3, 5), "float32", 1e-5, training=True, momentum=m)
    keras_m = _plan(case).kwargs["momentum"]
    assert keras_m == 1.0 - m
    # Keras blends in 1 - momentum of the batch statistic: that gives back m, to within one ulp.
    assert abs((1.0 - keras_m) - m) <= math.ulp(1.0)


def test_momentum_none_is_unsupported_and_not_declared():
    with pytest.raises(Unsupported, match="cumulative average"):
        plans.keras_momentum(None)
    for cls in (keras_layers.KerasTorch, keras_layers.KerasJax):
        assert "momentum_none" not in cls().capabilities().features


def _op_case(op: str, eps: float = 1e-5, **fields: Any) -> Case:
    """A small float32 case of ``op``; GroupNorm with 3 groups of 2 channels."""
    groups = {"num_groups": 3} if op == "group_norm" else {}
    return Case(op, (4, 6, 5), "float32", eps, **groups, **fields)


ALL_OPS = [
    "layer_norm",
    "rms_norm",
    "add_rms_norm",
    "add_layer_norm",
    "batch_norm",
    "group_norm",
    "instance_norm",
]


@pytest.mark.parametrize("op", ALL_OPS)
def test_eps_is_passed_and_left_out_only_for_the_default_eps_hook(op):
    case = _op_case(op, 3e-4)
    assert _plan(case).kwargs["epsilon"] == 3e-4
    assert "epsilon" not in _plan(case, default_eps=True).kwargs


def test_default_eps_table_is_keras_own():
    import inspect

    import keras

    for layer, eps in plans.DEFAULT_EPS.items():
        signature = inspect.signature(getattr(keras.layers, layer).__init__)
        assert signature.parameters["epsilon"].default == eps, layer


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "batch_norm", "group_norm"])
def test_the_default_eps_hook_runs_with_keras_default(op):
    """prepare_default_eps gives, bit for bit, what passing Keras' default explicitly gives."""
    adapter = keras_layers.KerasTorch() if HERE == "torch" else keras_layers.KerasJax()
    case = _op_case(op, dist="near_constant")
    inputs = make_inputs(case, grad=False)
    default = adapter.prepare_default_eps(case, inputs)
    default()
    layer = plans.LAYERS[op]
    explicit = _run(adapter, replace(case, eps=plans.DEFAULT_EPS[layer]), inputs, grad=False)
    assert np.array_equal(default.outputs()["y"], explicit["y"])
    assert "epsilon" not in default.info()["layer"]


@pytest.mark.parametrize(
    ("case", "axis"),
    [
        (Case("layer_norm", (4, 6, 5), "float32", 1e-5), -1),
        (Case("layer_norm", (4, 6, 5), "float32", 1e-5, norm_ndim=2), [-2, -1]),
        (Case("rms_norm", (4, 6, 5), "float32", 1e-5, norm_ndim=3), [-3, -2, -1]),
        (Case("batch_norm", (4, 6, 5), "float32", 1e-5), 1),  # Keras' default is -1
        (Case("group_norm", (4, 6, 5), "float32", 1e-5, num_groups=2), 1),  # channels-first, no transpose
        (Case("group_norm", (4, 6), "float32", 1e-5, num_groups=2), 1),
        (Case("instance_norm", (4, 6, 5, 3), "float32", 1e-5), 1),
    ],
)
def test_axes(case, axis):
    assert _plan(case).kwargs["axis"] == axis


@pytest.mark.parametrize(("op", "groups"), [("group_norm", 3), ("instance_norm", -1)])
def test_group_normalization_groups_and_affine_switches(op, groups):
    """GroupNorm passes G; InstanceNorm is Keras' GroupNormalization(groups=-1): one group per channel."""
    plan = _plan(_op_case(op, weight=False))
    assert plan.layer == "GroupNormalization" and plan.kwargs["groups"] == groups
    assert (plan.kwargs["center"], plan.kwargs["scale"]) == (True, False)
    assert set(plan.variables) == {"beta"} and dict(plan.grads) == {"dbias": "beta"}
    assert plan.training is None  # GroupNormalization.call takes no training flag
    if HERE == "torch":
        from backends.keras import run as _keras_run

        layer = _keras_run.build_layer(_plan(_op_case(op)))
        assert layer.groups == (3 if op == "group_norm" else 6) and layer.axis == 1


@pytest.mark.parametrize(
    ("case", "why"),
    [
        (Case("instance_norm", (4, 3, 6), "float32", 1e-5, track_running_stats=True), "running statistics"),
        (Case("group_norm", (2, 4, 3, 5), "float32", 1e-5, num_groups=2, layout="channels_last"), "layout"),
    ],
)
def test_running_stats_and_channels_last_are_undeclared_and_unsupported(case, why):
    for cls in (keras_layers.KerasTorch, keras_layers.KerasJax):
        caps = cls().capabilities()
        assert not {"running_stats", "channels_last"} & caps.features
        assert caps.why_not(case) is not None
    with pytest.raises(Unsupported, match=why):
        _plan(case)


def test_center_and_scale_follow_bias_and_weight():
    plan = _plan(Case("layer_norm", (4, 8), "float32", 1e-5, weight=False))
    assert (plan.kwargs["center"], plan.kwargs["scale"]) == (True, False)
    assert set(plan.variables) == {"beta"} and dict(plan.grads) == {"dbias": "beta"}
    plan = _plan(Case("batch_norm", (4, 8), "float32", 1e-5, bias=False, training=True))
    assert (plan.kwargs["center"], plan.kwargs["scale"]) == (False, True)
    assert set(plan.variables) == {"gamma", "moving_mean", "moving_variance"}


def test_rms_without_weight_gets_a_scale_of_ones_that_is_not_differentiated():
    plan = _plan(Case("rms_norm", (4, 8), "float32", 1e-5, weight=False))
    assert np.array_equal(plan.variables["scale"], np.ones(8, dtype=np.float32))
    assert dict(plan.grads) == {}


@pytest.mark.parametrize(
    ("dtype", "param", "policy"),
    [
        ("float32", None, "float32"),
        ("float64", None, "float64"),
        ("bfloat16", None, "bfloat16"),
        ("bfloat16", "float32", "mixed_bfloat16"),
        ("float16", "float32", "mixed_float16"),
    ],
)
def test_dtype_policy(dtype, param, policy):
    plan = _plan(Case("layer_norm", (4, 8), dtype, 1e-5, param_dtype=param))
    assert plan.policy == policy
    variable = param or dtype
    assert {str(v.dtype) for v in plan.variables.values()} == {variable}


@pytest.mark.parametrize(
    ("dtype", "param"), [("float32", "bfloat16"), ("float64", "float32"), ("float16", "bfloat16")]
)
def test_a_pairing_without_a_policy_is_unsupported(dtype, param):
    with pytest.raises(Unsupported, match="no dtype policy"):
        _plan(Case("layer_norm", (4, 8), dtype, 1e-5, param_dtype=param))


def test_weight_offset_is_translated_only_where_exact():
    case = Case("rms_norm", (2, 4), "float32", 1e-6, weight_offset=1.0)
    inputs = {"x": np.zeros((2, 4), np.float32), "weight": np.array([0.5, -0.25, 0.0, 0.75], np.float32)}
    plan = plans.plan(case, inputs, None)
    assert np.array_equal(plan.variables["scale"], np.array([1.5, 0.75, 1.0, 1.75], np.float32))
    inputs["weight"] = np.array([1e-3, 0, 0, 0], np.float32)  # 1 + 1e-3 needs more than float32's bits
    with pytest.raises(Unsupported, match="not exact in float32"):
        plans.plan(case, inputs, None)
    float64 = Case("rms_norm", (2, 4), "float64", 1e-6, weight_offset=1.0)
    weight = make_inputs(float64, grad=False)["weight"]
    held = plans.plan(float64, make_inputs(float64, grad=False), None).variables["scale"]
    assert np.array_equal(held, 1.0 + weight)


# ----------------------------------------------------------------------------- the fused residual add
@pytest.mark.parametrize(
    ("op", "fields", "policy", "sum_dtype"),
    [
        ("add_rms_norm", {"dtype": "bfloat16"}, "bfloat16", "bfloat16"),
        ("add_rms_norm", {"dtype": "bfloat16", "param_dtype": "float32"}, "mixed_bfloat16", "bfloat16"),
        ("add_rms_norm", {"dtype": "bfloat16", "residual_dtype": "float32"}, "float32", "float32"),
        ("add_rms_norm", {"dtype": "float16", "norm_input": "exact"}, "float32", "float32"),
        ("add_rms_norm", {"dtype": "float32", "norm_input": "exact"}, "float32", "float32"),
        ("add_layer_norm", {"dtype": "bfloat16", "residual_dtype": "float32"}, "bfloat16", "float32"),
        ("add_layer_norm", {"dtype": "float16", "norm_input": "exact"}, "float16", "float32"),
    ],
)
def test_only_an_autocasting_layer_of_a_float32_sum_gets_the_float32_policy(op, fields, policy, sum_dtype):
    case = Case(op, (4, 8), eps=1e-5, **fields)
    plan = _plan(case)
    assert plan.residual and plan.layer == plans.LAYERS[op]
    assert (plan.policy, plan.sum_dtype, plan.stream_dtype) == (policy, sum_dtype, case.stream_dtype)
    widened = policy == "float32" and case.dtype != "float32"
    assert bool(plan.casts) is widened
    if widened:
        # The parameters are held exactly in float32 variables; y and dweight return in their dtypes.
        assert plan.variable_dtype == "float32" and plan.casts["dweight"] == case.weight_dtype
        assert plan.casts["y"] == case.dtype
        assert np.array_equal(
            plan.variables["scale"], make_inputs(case, grad=False)["weight"].astype(np.float32)
        )


def test_parameters_a_float32_policy_cannot_hold_are_unsupported():
    with pytest.raises(Unsupported, match="not exact in float32"):
        _plan(Case("add_rms_norm", (4, 8), "float64", 1e-5, residual_dtype="float32"))


@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
def test_which_layers_autocast_a_float32_input(op):
    """Why only RMSNormalization gets the float32 policy: under a bfloat16 policy it rounds a float32
    input to bfloat16 before normalizing it (Layer.__call__ -> DTypePolicy.convert_input), while
    LayerNormalization (autocast = False) normalizes the float32 input and rounds only y, bit for bit
    the float32 layer's y rounded once."""
    if HERE != "torch":
        pytest.skip("the torch backend runs in a child process here")
    import torch

    from backends.keras import run as _keras_run

    case = Case(op, (4, 24), "bfloat16", 1e-5)
    layer = _keras_run.build_layer(_plan(case))
    assert layer.autocast is (plans.LAYERS[op] in plans.AUTOCASTS)
    h32 = torch.from_numpy(make_inputs(replace(case, dtype="float32"), grad=False)["x"]) * 3
    wide = _keras_run.build_layer(replace(_plan(case), policy="float32"))
    as_float32 = wide(h32).to(torch.bfloat16)
    rounded_first = layer(h32.to(torch.bfloat16))
    if layer.autocast:
        assert torch.equal(layer(h32), rounded_first) and not torch.equal(layer(h32), as_float32)
    else:
        assert torch.equal(layer(h32), as_float32) and not torch.equal(layer(h32), rounded_first)


# ----------------------------------------------------------------------------- processes
def _fresh_python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_first_adapter_to_ask_claims_the_process():
    code = (
        "from backends.keras.layers import KerasJax, KerasTorch; import os;"
        "print(KerasJax().runs_here(), KerasTorch().runs_here(), os.environ['KERAS_BACKEND'])"
    )
    assert _fresh_python(code) == "True False jax"
    assert _fresh_python(code, KERAS_BACKEND="torch") == "False True torch"
    stub = (
        "import sys, types; sys.modules['keras'] = types.SimpleNamespace(config=types.SimpleNamespace("
        "backend=lambda: 'torch')); import os; os.environ['KERAS_BACKEND'] = 'jax';"
    )
    # Once keras is imported its backend is fixed, whatever the variable says afterwards.
    assert _fresh_python(stub + code) == "False True jax"


def test_the_out_of_process_adapter_is_kept_out_of_the_benchmarks(adapters):
    local, remote = (
        adapters[n].capabilities()
        for n in (("keras", "keras-jax") if HERE == "torch" else ("keras-jax", "keras"))
    )
    assert not interpreted(local) and "mode" not in local.notes
    assert interpreted(remote), remote.notes
    assert "inter-process round trip" in remote.notes["mode"]
    assert local.notes["keras"] == remote.notes["keras"] and local.notes["keras_backend"] == HERE


# ----------------------------------------------------------------------------- agreement with the oracle
CASES = [
    Case("layer_norm", (4, 24), "float32", 1e-5),
    Case("layer_norm", (3, 4, 10), "float32", 1e-5, norm_ndim=2),
    Case("layer_norm", (4, 24), "bfloat16", 1e-5, param_dtype="float32"),
    Case("layer_norm", (4, 24), "float32", 1e-5, weight=False, bias=False),
    Case("rms_norm", (4, 24), "bfloat16", 1e-5),
    Case("add_rms_norm", (4, 24), "float16", 1e-5),
    Case("add_layer_norm", (4, 24), "float32", 1e-5),
    Case("add_layer_norm", (4, 24), "bfloat16", 1e-5, residual_dtype="float32"),
    Case("add_rms_norm", (4, 24), "float16", 1e-5, norm_input="exact"),
    Case("batch_norm", (6, 3, 5), "float32", 1e-5),
    Case("batch_norm", (6, 3, 5), "bfloat16", 1e-5, bias=False),
    Case("group_norm", (2, 8, 5, 5), "float32", 1e-5, num_groups=4),
    Case("group_norm", (4, 6), "float32", 1e-5, num_groups=3),
    Case("group_norm", (2, 8, 25), "bfloat16", 1e-5, num_groups=8, param_dtype="float32"),
    Case("instance_norm", (2, 4, 6, 7), "float16", 1e-5),
    Case("instance_norm", (2, 2, 3, 4, 5), "float32", 1e-5, weight=False, bias=False),
]


@pytest.fixture(scope="module")
def adapters() -> dict[str, Any]:
    """keras runs in this process, keras-jax in its child process (started once for the module)."""
    made = {"keras": keras_layers.KerasTorch(), "keras-jax": keras_layers.KerasJax()}
    yield made
    for adapter in made.values():
        adapter.close()


@pytest.mark.parametrize("name", ["keras", "keras-jax"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_agrees_with_the_oracle(adapters, name, case):
    inputs = make_inputs(case, grad=True)
    actual = _run(adapters[name], case, inputs)
    assert _failing(case, inputs, oracle.evaluate(case, inputs, grad=True), actual) == set()


@pytest.mark.parametrize("name", ["keras", "keras-jax"])
def test_backward_takes_both_cotangents(adapters, name):
    """dx and dresidual are dL/dh: with dy = 0 only dresidual_out reaches h, so both are it, exactly
    (dresidual in the float32 stream, dx rounded to bfloat16)."""
    case = Case("add_layer_norm", (4, 24), "bfloat16", 1e-5, residual_dtype="float32")
    inputs = dict(make_inputs(case, grad=True))
    inputs["dy"] = np.zeros_like(inputs["dy"])
    out = _run(adapters[name], case, inputs)
    given = inputs["dresidual_out"]
    assert out["dresidual"].dtype == np.float32 and out["dresidual"].tobytes() == given.tobytes()
    assert out["dx"].tobytes() == round_to(given, "bfloat16").tobytes()
    assert out["y"].dtype == out["dx"].dtype == round_to(given, "bfloat16").dtype


def test_dx_and_dresidual_are_one_tensor_on_torch_and_declared(adapters):
    """What the aliasing check sees on the torch backend: the layer's own tensors (buffers()). autograd
    returns one tensor for x's and residual's gradient when h = x + residual adds in one dtype; the
    adapter declares it, and without the declaration the check reports it."""
    if HERE != "torch":
        pytest.skip("the torch backend runs in a child process here")
    adapter = adapters["keras"]
    aliases = adapter.capabilities().aliases
    assert dict(aliases) == {"dresidual": "dx"}
    case = Case("add_rms_norm", (4, 24), "bfloat16", 1e-5)
    inputs = make_inputs(case, grad=True)
    prepared = adapter.prepare(case, inputs, grad=True)
    names = (*forward_outputs(case), *grad_outputs(case))
    watch = memory.Watch.start(prepared, inputs, names)
    prepared()
    returned = prepared.outputs()
    watch.finish(prepared, returned, names)
    assert watch.reported and set(watch.inputs) == {"x", "residual", "dy", "dresidual_out", "weight"}
    assert prepared.buffers()["dx"] is prepared.buffers()["dresidual"]
    assert memory.problems(watch, aliases, inputs, returned) == []
    (found,) = memory.problems(watch, {}, inputs, returned)
    assert "'dresidual' and 'dx' share memory" in found or "'dx' and 'dresidual' share memory" in found


@pytest.mark.parametrize(("name", "convention"), [("keras", "rounded"), ("keras-jax", "exact")])
def test_which_sum_the_layer_normalizes(adapters, name, convention):
    """The add_*.sum fingerprint, recomputed on its probe: the torch backend normalizes h as stored
    (bfloat16); on JAX, XLA's default allow_excess_precision fuses the bfloat16 add into the layer's
    float32 upcast, so the layer normalizes the unrounded sum although residual_out is rounded."""
    probe = fingerprint_cases.sum_ln()()
    case, inputs = probe.case, probe.inputs
    actual = _run(adapters[name], case, inputs, grad=False)
    expected = oracle.evaluate(replace(case, norm_input=convention), inputs, grad=False)
    assert _failing(case, inputs, expected, actual, grad=False) == set()
    other = "exact" if convention == "rounded" else "rounded"
    expected = oracle.evaluate(replace(case, norm_input=other), inputs, grad=False)
    assert _failing(case, inputs, expected, actual, grad=False) == {"y"}


@pytest.mark.parametrize("name", ["keras", "keras-jax"])
def test_batch_norm_training_deviates_only_by_the_biased_running_variance(adapters, name):
    case = Case("batch_norm", (6, 3, 5), "float32", 1e-5, training=True, momentum=0.1)
    inputs = make_inputs(case, grad=True)
    actual = _run(adapters[name], case, inputs)
    expected = oracle.evaluate(case, inputs, grad=True)
    assert _failing(case, inputs, expected, actual) == {"running_var"}
    # The ledger's reason, recomputed: Keras blends in the biased batch variance (divisor n, not n - 1).
    x = inputs["x"].astype(np.float64)
    biased = x.var(axis=(0, 2))
    expected = {**expected, "running_var": 0.9 * inputs["running_var"] + 0.1 * biased}
    assert _failing(case, inputs, expected, actual) == set()


OFFSET_GROUPS = Case("group_norm", (2, 6, 10), "float32", 1e-5, num_groups=3, dist="offset", bias=False)


def _two_pass_moments(x, axes, keepdims=False, synchronized=False):
    """keras.ops.moments of the torch backend with the variance of the centred values instead."""
    import torch

    mean = torch.mean(x, dim=axes, keepdim=True)
    variance = torch.mean(torch.square(x - mean), dim=axes, keepdim=True)
    return (mean, variance) if keepdims else (mean.squeeze(axes), variance.squeeze(axes))


def test_group_statistics_are_one_pass_on_the_torch_backend(adapters, monkeypatch):
    """The ledger's reason, recomputed: GroupNormalization's ops.moments is E[x^2] - E[x]^2 on Keras'
    torch backend, so y of offset groups (mean 1e3, spread 1) fails; the only change of a two-pass
    moments makes it pass."""
    if HERE != "torch":
        pytest.skip("the torch backend runs in a child process here")
    from keras.src.backend.torch import nn as torch_nn

    case = OFFSET_GROUPS
    inputs = make_inputs(case, grad=False)
    expected = oracle.evaluate(case, inputs, grad=False)
    one_pass = _run(adapters["keras"], case, inputs, grad=False)
    assert _failing(case, inputs, expected, one_pass, grad=False) == {"y"}
    monkeypatch.setattr(torch_nn, "moments", _two_pass_moments)
    two_pass = _run(adapters["keras"], case, inputs, grad=False)
    assert _failing(case, inputs, expected, two_pass, grad=False) == set()


def test_group_statistics_are_two_pass_on_the_jax_backend(adapters):
    """On JAX, ops.moments is jnp.var (two-pass): the same offset groups pass."""
    case = OFFSET_GROUPS
    inputs = make_inputs(case, grad=False)
    actual = _run(adapters["keras-jax"], case, inputs, grad=False)
    assert _failing(case, inputs, oracle.evaluate(case, inputs, grad=False), actual, grad=False) == set()


@pytest.mark.parametrize("name", ["keras", "keras-jax"])
def test_float64_runs_in_float32(adapters, name):
    """Keras' result_type maps float64 to float32 on its torch and JAX backends (the ledger's float64
    reason): y is, bit for bit, the float32 case's on the inputs rounded to float32, and every output
    fails float64's tolerance but passes float32's (XLA may order the float32 gradient differently)."""
    case = Case("layer_norm", (4, 24), "float64", 1e-5)
    inputs = make_inputs(case, grad=True)
    wide = _run(adapters[name], case, inputs)
    narrow_case = replace(case, dtype="float32")
    narrow_inputs = {k: round_to(v, "float32") for k, v in inputs.items()}
    narrow = _run(adapters[name], narrow_case, narrow_inputs)
    assert wide["y"].dtype == np.float64 and np.array_equal(wide["y"], narrow["y"].astype(np.float64))
    outputs = {"y", "dx", "dweight", "dbias"}
    assert _failing(case, inputs, oracle.evaluate(case, inputs, grad=True), wide) == outputs
    expected = oracle.evaluate(narrow_case, narrow_inputs, grad=True)
    as_float32 = {k: v.astype(np.float32) for k, v in wide.items()}
    assert _failing(narrow_case, narrow_inputs, expected, as_float32) == set()


@pytest.mark.parametrize("name", ["keras", "keras-jax"])
def test_repeated_calls_give_the_same_bits_and_leave_inputs_alone(adapters, name):
    case = Case("batch_norm", (4, 3, 5), "bfloat16", 1e-5, training=True, param_dtype="float32")
    inputs = make_inputs(case, grad=True)
    given = {k: v.copy() for k, v in inputs.items()}
    prepared = adapters[name].prepare(case, inputs, grad=True)
    results = []
    for _ in range(2):
        prepared()
        prepared.synchronize()
        results.append(prepared.outputs())
    for output, value in results[0].items():
        assert value.tobytes() == results[1][output].tobytes(), output
    assert all(np.array_equal(given[k].view(np.uint8), inputs[k].view(np.uint8)) for k in inputs)
    info = prepared.info()
    assert info["dtype_policy"] == "mixed_bfloat16" and "momentum=0.9" in info["layer"]
    assert info["keras_backend"] == {"keras": "torch", "keras-jax": "jax"}[name]


# ----------------------------------------------------------------------------- the child process
class _OnUnpickle:
    """Runs ``call(*args)`` when unpickled, i.e. in the child while it receives the request."""

    def __init__(self, call: Any, *args: Any) -> None:
        self.call, self.args = call, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.call, self.args)


SMALL = Case("layer_norm", (2, 8), "float32", 1e-5)


def _small(worker: Any, doom: Any = None) -> tuple[Any, Any]:
    plan = _plan(SMALL)
    if doom is not None:
        plan = replace(plan, kwargs={**plan.kwargs, "doom": doom})
    return worker.prepare(plan, {"x": make_inputs(SMALL, grad=False)["x"]}, False)


@pytest.fixture(scope="module")
def worker() -> Any:
    made = child.Worker("jax", timeout_s=120)
    yield made
    made.close()


def test_a_case_runs_in_the_child(worker):
    handle, info = _small(worker)
    assert info["keras_backend"] == "jax" and info["process"] == f"child pid {worker.pid}"
    worker.request(handle, "run")
    assert worker.request(handle, "outputs")["y"].shape == SMALL.shape


def test_a_dead_child_is_the_error_of_the_case_that_needed_it(worker):
    handle, _ = _small(worker)
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(child.ChildError, match="died with exit code -9 during run"):
        worker.request(handle, "run")
    with pytest.raises(child.ChildError, match="that prepared this case is gone"):
        worker.request(handle, "outputs")
    handle, _ = _small(worker)  # the next case starts a fresh child
    worker.request(handle, "run")


def test_a_child_that_crashes_mid_request_is_reported_with_its_exit_code(worker):
    with pytest.raises(child.ChildError, match="died with exit code 3 during prepare of layer_norm"):
        _small(worker, _OnUnpickle(os._exit, 3))
    handle, _ = _small(worker)
    worker.request(handle, "run")


def test_unsupported_and_exceptions_in_the_child_come_back(worker):
    x = {"x": make_inputs(SMALL, grad=False)["x"]}
    plan = replace(_plan(SMALL), layer="NoSuchNormalization")
    with pytest.raises(Unsupported, match=r"has no keras\.layers\.NoSuchNormalization"):
        worker.prepare(plan, x, False)
    plan = replace(_plan(SMALL), kwargs={**_plan(SMALL).kwargs, "no_such_argument": 1})
    with pytest.raises(child.ChildError, match="no_such_argument"):
        worker.prepare(plan, x, False)
    pid = worker.pid
    _small(worker)  # the child survives both
    assert worker.pid == pid


def test_a_hung_child_times_out_and_is_replaced(worker):
    worker.timeout_s = 3
    try:
        start = time.monotonic()
        with pytest.raises(child.ChildError, match="no reply within 3 s"):
            _small(worker, _OnUnpickle(time.sleep, 600))
        assert time.monotonic() - start < 30
    finally:
        worker.timeout_s = 120
    handle, _ = _small(worker)
    worker.request(handle, "run")


def test_a_request_abandoned_by_the_suite_does_not_block_the_next(worker):
    """The suite abandons a timed-out call in its thread; the next request kills the stuck child."""
    errors: list[BaseException] = []

    def abandoned() -> None:
        try:
            _small(worker, _OnUnpickle(time.sleep, 600))
        except child.ChildError as exc:
            errors.append(exc)

    stuck = threading.Thread(target=abandoned, daemon=True)
    stuck.start()
    time.sleep(2)
    start = time.monotonic()
    handle, _ = _small(worker)
    worker.request(handle, "run")
    assert time.monotonic() - start < 60
    stuck.join(10)
    assert not stuck.is_alive()
    assert errors and "died with exit code -9" in str(errors[0])


def test_the_child_exits_with_its_parent():
    code = (
        "import os; from backends.keras.child import Worker; from backends.keras.plan import plan;"
        "from conformance.model.case import Case; from conformance.model.inputs import make_inputs;"
        "case = Case('layer_norm', (2, 8), 'float32', 1e-5); inputs = make_inputs(case, grad=False);"
        "w = Worker('jax'); w.prepare(plan(case, inputs, None), {'x': inputs['x']}, False);"
        "print(w.pid, flush=True); os._exit(0)"  # no atexit: only the closed socket tells the child
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
