"""A case translated into Keras terms: which layer, its constructor arguments, its dtype policy and
the values of its variables. Pure data and NumPy (no keras import), so the translation is computed
once in the adapter's process and pickled to a child process that runs Keras on another backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from backends.common.translate import offset_scale, old_value_momentum
from conformance.adapter.backend import Inputs, Unsupported
from conformance.model.case import (
    ADD_LAYER_NORM,
    ADD_OPS,
    ADD_RMS_NORM,
    BATCH_NORM,
    CHANNEL_OPS,
    GROUP_NORM,
    INSTANCE_NORM,
    LAYER_NORM,
    RMS_NORM,
    Case,
)
from conformance.model.dtypes import round_to, stats_dtype

# The Keras layer of each op; the add ops are h = x + residual (in the residual stream's dtype), then the
# layer on h, as a pre-norm block is written with keras.ops (backends/keras/run.residual_sum).
# Keras 3 has no InstanceNormalization: GroupNormalization(groups=-1) is its documented spelling (one
# group per channel), with statistics of each instance only (no running statistics).
LAYERS: dict[str, str] = {
    LAYER_NORM: "LayerNormalization",
    RMS_NORM: "RMSNormalization",
    BATCH_NORM: "BatchNormalization",
    ADD_RMS_NORM: "RMSNormalization",
    ADD_LAYER_NORM: "LayerNormalization",
    GROUP_NORM: "GroupNormalization",
    INSTANCE_NORM: "GroupNormalization",
}
# The add ops' layers that cast their floating inputs to the policy's compute dtype (Keras' default
# autocast; LayerNormalization opts out with self.autocast = False). Checked against Keras in tests.
AUTOCASTS = frozenset({"RMSNormalization"})
# Layers with separate center (beta) and scale (gamma) switches; RMSNormalization has a scale only.
AFFINE_SWITCHES = frozenset({"LayerNormalization", "BatchNormalization", "GroupNormalization"})
# GroupNormalization's ``groups`` for InstanceNorm: -1 makes it the channel count at build time.
INSTANCE_GROUPS = -1
# Keras' own epsilon defaults (keras 3.15 source: layers/normalization/*.py); the fingerprint's
# default-eps hook leaves epsilon out so these apply. Checked against the installed Keras in tests.
DEFAULT_EPS: dict[str, float] = {
    "LayerNormalization": 1e-3,
    "RMSNormalization": 1e-6,
    "BatchNormalization": 1e-3,
    "GroupNormalization": 1e-3,
}
# Keras' DTypePolicy names a compute dtype with its variable dtype: "<dtype>" (both equal) or one of
# the two mixed policies below (keras.src.dtype_policies.DTypePolicy._parse_name). Any other pairing
# of activation and parameter dtypes has no policy.
MIXED_POLICIES: dict[tuple[str, str], str] = {
    ("float16", "float32"): "mixed_float16",
    ("bfloat16", "float32"): "mixed_bfloat16",
}


@dataclass(frozen=True)
class Plan:
    """Everything a Keras process needs to build and run one case (plus x, residual, dy).

    ``variables`` maps each Keras variable name of the built layer (gamma, beta, scale, moving_mean,
    moving_variance) to its value in the variable dtype; ``grads`` maps a contract output (dweight,
    dbias) to the variable it is the gradient of. The add ops (``residual``) compute h = x + residual
    in ``sum_dtype``, store it as residual_out in ``stream_dtype`` and normalize the ``sum_dtype`` h;
    ``casts`` maps outputs to the dtype they are returned in where the layer's policy differs from
    the case's dtypes (a norm of a float32 sum: y to the activation dtype, gradients to the parameters').
    """

    case_id: str
    op: str
    layer: str
    kwargs: Mapping[str, object]
    policy: str
    shape: tuple[int, ...]
    dtype: str
    variables: Mapping[str, np.ndarray] = field(default_factory=dict)
    grads: Mapping[str, str] = field(default_factory=dict)
    training: bool | None = None
    residual: bool = False
    stream_dtype: str = ""
    sum_dtype: str = ""
    casts: Mapping[str, str] = field(default_factory=dict)

    @property
    def variable_dtype(self) -> str:
        return _variable_dtype(self.policy)


def _variable_dtype(policy: str) -> str:
    return "float32" if policy in MIXED_POLICIES.values() else policy


def policy_name(case: Case) -> str:
    """The Keras dtype policy of the case: compute dtype = activations, variable dtype = parameters."""
    if case.weight_dtype == case.dtype:
        return case.dtype
    name = MIXED_POLICIES.get((case.dtype, case.weight_dtype))
    if name is None:
        raise Unsupported(
            f"Keras has no dtype policy with compute dtype {case.dtype} and variable dtype "
            f"{case.weight_dtype} (policies: one dtype for both, or {', '.join(MIXED_POLICIES.values())})"
        )
    return name


def sum_dtype(case: Case) -> str:
    """The dtype the add ops' sum is computed in and normalized: the stream's, or for an exact sum at
    least float32 (the unrounded sum of two half-precision values is exact there)."""
    return stats_dtype(case.stream_dtype) if case.norm_input == "exact" else case.stream_dtype


def norm_policy(case: Case) -> str:
    """The policy of the norm layer: the case's, except where a layer that autocasts must read a float32
    sum of half-precision activations (residual in float32, or an exact sum).

    Keras casts a layer's floating inputs to its compute dtype unless the layer opts out (Layer.__call__
    -> DTypePolicy.convert_input): LayerNormalization sets ``autocast = False`` and normalizes a float32
    input in float32, rounding only y to the compute dtype, so the case's policy already reads the
    float32 sum; RMSNormalization autocasts, so under a bfloat16/float16 policy it would normalize the
    sum rounded to the activation dtype. It runs under the sum's policy instead (Keras' mixed-precision
    idiom for a sensitive layer), y cast to the activation dtype after it, the parameters held exactly
    (checked) in float32 variables.
    """
    if case.op in ADD_OPS and LAYERS[case.op] in AUTOCASTS and sum_dtype(case) != case.dtype:
        return sum_dtype(case)
    return policy_name(case)


def _casts(case: Case, policy: str) -> dict[str, str]:
    """Outputs returned in another dtype than the policy computes them in (see norm_policy)."""
    if policy == policy_name(case):
        return {}
    return {"y": case.dtype, "dweight": case.weight_dtype, "dbias": case.weight_dtype}


def keras_momentum(momentum: float | None) -> float:
    """Keras' BatchNormalization momentum for the contract's (PyTorch's) momentum ``m``: Keras keeps
    ``momentum`` of the OLD value, so it is 1 - m (see old_value_momentum)."""
    if momentum is None:
        # PyTorch's cumulative average (1 / batches seen) has no Keras spelling: Keras' momentum is
        # one fixed float. (A single step from a fresh counter equals momentum 0, but claiming that
        # would tell a porting user that Keras averages cumulatively; it does not.)
        raise Unsupported(
            "momentum=None (cumulative average): Keras' BatchNormalization has only a fixed momentum"
        )
    return old_value_momentum(momentum)


def axis(case: Case) -> int | list[int]:
    """LN/RMS: the trailing ``norm_ndim`` axes; BN, GN, IN: the channel axis 1 (Keras' default is -1,
    channels last; GroupNormalization splits the axis it is given into groups, so axis=1 takes the
    case's channels-first x as it is, without a transpose)."""
    if case.op in CHANNEL_OPS:
        return 1
    return -1 if case.norm_ndim == 1 else list(range(-case.norm_ndim, 0))


def layer_kwargs(case: Case, momentum: float | None, *, default_eps: bool = False) -> dict[str, object]:
    """The layer's constructor arguments, every one explicit (epsilon left out only for the
    fingerprint's default-eps hook, so Keras' own default applies)."""
    kwargs: dict[str, object] = {"axis": axis(case)}
    if not default_eps:
        kwargs["epsilon"] = case.eps
    if LAYERS[case.op] in AFFINE_SWITCHES:
        # Keras has separate switches: center (beta) and scale (gamma), so no frozen stand-ins.
        kwargs["center"] = bool(case.bias)
        kwargs["scale"] = case.weight
    if case.op == GROUP_NORM:
        kwargs["groups"] = case.num_groups
    if case.op == INSTANCE_NORM:
        kwargs["groups"] = INSTANCE_GROUPS
    if case.op == BATCH_NORM:
        assert momentum is not None, "BatchNormalization needs a Keras momentum (keras_momentum)"
        kwargs["momentum"] = momentum
    return kwargs


def _variables(
    case: Case, inputs: Inputs, variable_dtype: str
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Variable values (held in the variable dtype) and the gradient each output is."""
    values: dict[str, np.ndarray] = {}
    grads: dict[str, str] = {}
    weight_name = "scale" if LAYERS[case.op] == "RMSNormalization" else "gamma"
    if case.weight:
        values[weight_name] = _scale(case, inputs)
        grads["dweight"] = weight_name
    elif weight_name == "scale":
        # RMSNormalization always has a scale: ones are exact (x * 1 == x) and are not differentiated.
        values["scale"] = np.ones(case.param_shape)
    if case.bias:
        values["beta"] = inputs["bias"]
        grads["dbias"] = "beta"
    if case.op == BATCH_NORM:
        values["moving_mean"] = inputs["running_mean"]
        values["moving_variance"] = inputs["running_var"]
    held = {name: round_to(np.asarray(v, dtype=np.float64), variable_dtype) for name, v in values.items()}
    # The variable dtype is the parameter dtype or, for a norm of a float32 sum, float32: each value must
    # be exact in it (float64 parameters are not).
    for name, value in values.items():
        exact = held[name].astype(np.float64)
        if not np.array_equal(exact, np.asarray(value, dtype=np.float64), equal_nan=True):
            raise Unsupported(
                f"the {name} values of {case.weight_dtype} are not exact in {variable_dtype}, the dtype of "
                f"the {LAYERS[case.op]} variables (policy {variable_dtype})"
            )
    return held, grads


def _scale(case: Case, inputs: Inputs) -> np.ndarray:
    """The weight, or Gemma's ``offset + w`` where it is held exactly in the parameter dtype.

    Keras' RMSNormalization has no offset. The translated scale must be exact where Keras holds it:
    a half-precision compute policy casts the scale to that dtype inside the layer (autocast), even
    a float32 variable of a mixed policy, and a float32 variable cannot hold a wider value, so a
    scale that needs more bits than the parameter dtype (offset_scale widened it) cannot be given.
    """
    weight = inputs["weight"]
    if not case.weight_offset:
        return weight
    scale = offset_scale(weight, case.weight_offset, case.weight_dtype).astype(np.float64)
    if not np.array_equal(round_to(scale, case.weight_dtype).astype(np.float64), scale):
        raise Unsupported(
            f"weight_offset={case.weight_offset}: Keras' RMSNormalization has no offset, and the "
            f"translated scale {case.weight_offset} + w is not exact in {case.weight_dtype}, the dtype "
            "Keras holds and applies the scale in"
        )
    return scale


def refuse(case: Case) -> None:
    """Unsupported for what the capabilities leave out, for callers that prepare without asking them."""
    if case.op == INSTANCE_NORM and case.track_running_stats:
        raise Unsupported(
            "track_running_stats=True: Keras has no InstanceNorm with running statistics "
            "(GroupNormalization(groups=-1) normalizes each instance with its own statistics only)"
        )
    if case.layout != "contiguous":
        raise Unsupported(f"layout={case.layout}: a torch memory format, which Keras layers do not take")


def plan(case: Case, inputs: Inputs, momentum: float | None, *, default_eps: bool = False) -> Plan:
    """Translate ``case`` into a Plan; ``momentum`` is BatchNormalization's Keras momentum (see
    keras_momentum; None for the other layers).

    Raises Unsupported for what Keras cannot express (a dtype pairing without a policy, an inexact
    Gemma offset, InstanceNorm's running statistics, a torch memory layout).
    """
    refuse(case)
    policy = norm_policy(case)
    values, grads = _variables(case, inputs, _variable_dtype(policy))
    training = case.training if case.op == BATCH_NORM else None
    residual = case.op in ADD_OPS
    return Plan(
        case_id=case.id,
        op=case.op,
        layer=LAYERS[case.op],
        kwargs=layer_kwargs(case, momentum, default_eps=default_eps),
        policy=policy,
        shape=case.shape,
        dtype=case.dtype,
        variables=values,
        grads=grads,
        training=training,
        residual=residual,
        stream_dtype=case.stream_dtype if residual else "",
        sum_dtype=sum_dtype(case) if residual else "",
        casts=_casts(case, policy),
    )
