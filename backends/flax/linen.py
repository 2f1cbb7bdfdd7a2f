"""flax: Flax linen LayerNorm, RMSNorm, BatchNorm, GroupNorm and InstanceNorm (and the fused residual add
in front of LayerNorm / RMSNorm) under jax.jit, gradients through jax.vjp.

Each case is one jitted function of (params, batch_stats, x, residual, dy, dresidual_out), lowered and
compiled in prepare() (timed there and reported by info()); __call__ runs the compiled executable and
blocks. Conventions Flax lacks are translated exactly where a translation exists: PyTorch's momentum m
is Flax's 1 - m, Gemma's offset becomes the scale ``offset + w``, GroupNorm's channels-first x is
transposed to Flax's channels-last and back. Flax's defaults are kept otherwise
(``use_fast_variance=True``: one-pass E[x^2] - E[x]^2 statistics), so the suite sees what users get.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from backends.common import jax_support as jc
from backends.common.translate import offset_scale, old_value_momentum
from conformance.adapter.backend import FEATURES, Capabilities, Inputs, Outputs, Prepared, Unsupported
from conformance.model.case import (
    ADD_LAYER_NORM,
    ADD_RMS_NORM,
    BATCH_NORM,
    GROUP_NORM,
    INSTANCE_NORM,
    LAYER_NORM,
    RMS_NORM,
    Case,
)
from conformance.model.dtypes import DTYPES

OPS = frozenset(
    {"layer_norm", "rms_norm", "batch_norm", "add_rms_norm", "add_layer_norm", "group_norm", "instance_norm"}
)
# Not declared: linen.InstanceNorm keeps no running statistics (it has no batch_stats collection), and
# channels_last is a torch memory format; a JAX array has no memory layout an adapter could choose.
UNDECLARED = frozenset({"momentum_none", "running_stats", "channels_last"})
# Compiled executables kept per process; a ci run compiles each distinct (shape, dtype, option) once.
CACHE_SIZE = 512
NOTES = {
    "jit": "jax.jit(fn).lower(args).compile() in prepare(), timed there (info: compile_s, 0 when cached);"
    " __call__ runs the compiled executable and blocks until ready",
    "x64": "jax_enable_x64 is turned on: without it JAX computes float64 cases in float32",
    "use_fast_variance": "Flax's default True is kept: LayerNorm and BatchNorm (training) statistics are"
    " one-pass E[x^2] - E[x]^2 clipped at 0 (RMSNorm needs no mean), computed in at least float32",
    "param_dtype": "modules get dtype=activation dtype (y's dtype) and param_dtype=parameter dtype (Flax"
    " uses param_dtype only to create parameters; the loaded arrays carry the case's dtypes);"
    " statistics are at least float32 (force_float32_reductions default); batch_stats are held in"
    " float32 (float64 for float64 parameters) as Flax creates them, loaded exactly from the case's"
    " running statistics, and returned updated in that dtype",
    "weight_offset": "translated: linen.RMSNorm has no offset, so the scale is offset + w, held exactly"
    " in float32 or float64 (its gradient is dweight, reported in the parameter dtype)",
    "momentum": "translated: Flax keeps momentum of the old running value, so PyTorch's m is 1 - m;"
    " momentum=None (cumulative average) has no Flax equivalent and is not declared",
    "running_var": "Flax updates the running variance with the biased batch variance (PyTorch: unbiased);"
    " not translatable inside the module, reported as a deviation",
    ADD_RMS_NORM: "h = x + residual in the residual stream's dtype, then linen.RMSNorm(h) (add_layer_norm:"
    " linen.LayerNorm(h)), as a pre-norm block is written in Flax; XLA's default allow_excess_precision"
    " may skip the rounding of a bfloat16 sum inside the jitted graph (a deviation: see the fingerprint)",
    "residual_dtype": "residual in float32: h = x.astype(float32) + residual (JAX's promotion, spelled out)"
    " is residual_out; the module keeps dtype=the activation dtype, and Flax normalizes a float32 input in"
    " float32 and rounds only y to that dtype (dtype is the result's dtype, not the input's), so the norm"
    " reads the float32 h",
    "exact_sum": "norm_input exact: h32 = x.astype(w) + residual.astype(w), w = at least float32; the norm"
    " reads h32 (computed in float32, y rounded to the module's dtype) and residual_out is h32 rounded to"
    " the stream's dtype",
    "backward": "jax.vjp wrt x, the params and (add ops) residual, with the cotangents dy and (add ops)"
    " dresidual_out: dx and dresidual are both dL/dh, each in its input's dtype",
    "buffers": "buffers() reports the device buffers (unsafe_buffer_pointer, nbytes) of the prepared inputs"
    " and of the last call's outputs; every output is its own buffer (no donation; XLA copies an output"
    " returned twice), and JAX arrays are immutable, so no input is written",
    "threads": "XLA's CPU client sizes its own thread pool to the machine; --bench-threads does not apply",
    GROUP_NORM: "linen.GroupNorm(num_groups=G) takes channels last: x (N, C, spatial...) is transposed"
    " to (N, spatial..., C) before it and y back after it (exact: values move, none is computed);"
    " statistics over spatial and the group's channels, use_fast_variance default (one-pass)",
    INSTANCE_NORM: "linen.InstanceNorm(feature_axes=1): channels-first natively, statistics over the"
    " spatial axes, use_fast_variance default (one-pass); no running statistics (running_stats and"
    " training are not declared for it)",
    "channels_last": "not declared: torch's memory format has no JAX counterpart (XLA chooses layouts)",
}


@dataclass(frozen=True)
class Spec:
    """Everything the compiled function depends on (the cache key); parameter values are run-time inputs."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    scale_dtype: str  # the scale's dtype: the parameter dtype, or wider for a translated offset
    param_dtype: str  # the case's parameter dtype (bias, reported gradients)
    eps: float | None  # None: Flax's own default (the fingerprint's default-eps hook)
    norm_ndim: int
    weight: bool
    bias: bool
    training: bool
    momentum: float | None  # BatchNorm: Flax's momentum (already translated); None for other ops
    grad: bool
    num_groups: int | None  # GroupNorm's G; None for other ops
    transposed: bool  # x moved to (N, spatial..., C) for the module and y moved back (GroupNorm)
    stream_dtype: str  # add ops: the residual stream's dtype (residual, residual_out, dresidual)
    exact_sum: bool  # add ops: the norm reads the unrounded (at least float32) sum, not residual_out

    @classmethod
    def of(
        cls,
        case: Case,
        scale_dtype: str,
        *,
        grad: bool,
        eps: float | None,
        momentum: float | None,
        transposed: bool,
    ) -> Spec:
        return cls(
            case.op,
            case.shape,
            case.dtype,
            scale_dtype,
            case.weight_dtype,
            eps,
            case.norm_ndim,
            case.weight,
            bool(case.bias),
            case.training,
            momentum,
            grad,
            case.num_groups,
            transposed,
            case.stream_dtype,
            case.norm_input == "exact",
        )

    @property
    def axes(self) -> tuple[int, ...]:
        """LN/RMS: the trailing norm_ndim axes, both reduced over and carrying the parameters."""
        return tuple(range(-self.norm_ndim, 0))

    @property
    def stats_dtype(self) -> str:
        """Flax creates batch_stats in float32 (force_float32_reductions); float64 parameters keep float64."""
        return jc.promote(self.param_dtype, "float32")


def _eps(spec: Spec) -> dict[str, Any]:
    """``epsilon=case.eps``, or nothing when the fingerprint asks for Flax's own default."""
    return {} if spec.eps is None else {"epsilon": spec.eps}


def _dtypes(spec: Spec) -> dict[str, Any]:
    # dtype: the computation's result dtype (y in the activation dtype; statistics are promoted to at
    # least float32 by Flax); param_dtype: what the parameters are created (and here loaded) in.
    return {"dtype": jc.jax_dtype(spec.dtype), "param_dtype": jc.jax_dtype(spec.scale_dtype)}


# use_fast_variance is deliberately not passed: Flax's default (True) is what its users run.
def layer_norm_module(spec: Spec) -> nn.Module:
    return nn.LayerNorm(
        **_eps(spec),
        **_dtypes(spec),
        use_bias=spec.bias,
        use_scale=spec.weight,
        reduction_axes=spec.axes,
        feature_axes=spec.axes,
    )


def rms_norm_module(spec: Spec) -> nn.Module:
    return nn.RMSNorm(
        **_eps(spec), **_dtypes(spec), use_scale=spec.weight, reduction_axes=spec.axes, feature_axes=spec.axes
    )


def batch_norm_module(spec: Spec) -> nn.Module:
    assert spec.momentum is not None, "the backend translates every BatchNorm momentum"
    return nn.BatchNorm(
        use_running_average=not spec.training,
        axis=1,  # the case's channel axis (NCHW-like); Flax's default is the last axis
        momentum=spec.momentum,
        **_eps(spec),
        **_dtypes(spec),
        use_bias=spec.bias,
        use_scale=spec.weight,
    )


def group_norm_module(spec: Spec) -> nn.Module:
    """linen.GroupNorm, whose feature axis is always the last: it is given x channels last."""
    return nn.GroupNorm(
        num_groups=spec.num_groups,
        group_size=None,  # one of the two; Flax's default num_groups (32) is replaced by the case's G
        **_eps(spec),
        **_dtypes(spec),
        use_bias=spec.bias,
        use_scale=spec.weight,
        # Flax's default, spelled out: every axis but the batch; the last (channels) is split into
        # (G, C/G) and reduced over C/G, so each group covers its channels and every spatial value.
        reduction_axes=tuple(range(1, len(spec.shape))),
    )


def instance_norm_module(spec: Spec) -> nn.Module:
    """linen.InstanceNorm with the channel axis 1: it reduces every axis but the batch and the channel."""
    return nn.InstanceNorm(
        **_eps(spec), **_dtypes(spec), use_bias=spec.bias, use_scale=spec.weight, feature_axes=1
    )


MODULES: dict[str, Callable[[Spec], nn.Module]] = {
    LAYER_NORM: layer_norm_module,
    RMS_NORM: rms_norm_module,
    BATCH_NORM: batch_norm_module,
    ADD_RMS_NORM: rms_norm_module,
    ADD_LAYER_NORM: layer_norm_module,
    GROUP_NORM: group_norm_module,
    INSTANCE_NORM: instance_norm_module,
}

Tree = dict[str, Any]
# (params, batch_stats, x, residual) -> ((y,) or (y, residual_out), the outputs nothing differentiates).
Forward = Callable[[Tree, Tree, jax.Array, Any], tuple[tuple[jax.Array, ...], Tree]]


def forward_fn(spec: Spec, module: nn.Module) -> Forward:
    """The forward pass the way a Flax user applies the module (a pre-norm block for the add ops)."""

    def forward(params: Tree, stats: Tree, x: jax.Array, residual: Any) -> tuple[tuple[jax.Array, ...], Tree]:
        variables = {"params": params, **({"batch_stats": stats} if stats else {})}
        if residual is not None:
            stored, read = jc.residual_sum(x, residual, spec.stream_dtype, exact=spec.exact_sum)
            # dtype=the activation dtype: Flax normalizes ``read`` (float32 under residual_dtype or an
            # exact sum) in float32 and rounds only y to it.
            normed: Any = module.apply(variables, read)
            return (normed, stored), {}
        if spec.transposed:
            # (N, C, spatial...) -> (N, spatial..., C) and back: a pure permutation, exact both ways,
            # and jax.vjp carries dy through the same permutations.
            moved: Any = module.apply(variables, jnp.moveaxis(x, 1, -1))
            return (jnp.moveaxis(moved, -1, 1),), {}
        if not spec.training:
            plain: Any = module.apply(variables, x)
            return (plain,), {}
        applied: Any = module.apply(variables, x, mutable=["batch_stats"])
        y, updated = applied
        return (y,), {
            "running_mean": updated["batch_stats"]["mean"],
            "running_var": updated["batch_stats"]["var"],
        }

    return forward


# The differentiated outputs, in the order forward() returns them (their cotangents: dy, dresidual_out).
PRIMALS = ("y", "residual_out")


def step_fn(spec: Spec) -> Callable[..., Tree]:
    """The function jax.jit compiles: the forward, and with dy the vjp wrt x, the params and the residual
    (the add ops' cotangents are dy and dresidual_out: the next layer reads both outputs)."""
    forward = forward_fn(spec, MODULES[spec.op](spec))

    def step(params: Tree, stats: Tree, x: jax.Array, residual: Any, dy: Any, dresidual_out: Any) -> Tree:
        if dy is None:
            primal, extra = forward(params, stats, x, residual)
            return {**dict(zip(PRIMALS, primal, strict=False)), **extra}

        def differentiated(x: jax.Array, params: Tree, residual: Any) -> tuple[tuple[jax.Array, ...], Tree]:
            return forward(params, stats, x, residual)

        # residual None (no add) is an empty pytree: its cotangent comes back None.
        primal, vjp, extra = jax.vjp(differentiated, x, params, residual, has_aux=True)
        dx, dparams, dresidual = vjp((dy,) if residual is None else (dy, dresidual_out))
        grads = {"dx": dx}
        if dresidual is not None:
            grads["dresidual"] = dresidual
        if "scale" in dparams:
            grads["dweight"] = dparams["scale"]
        if "bias" in dparams:
            grads["dbias"] = dparams["bias"]
        return {**dict(zip(PRIMALS, primal, strict=False)), **extra, **grads}

    return step


@dataclass(frozen=True)
class Loaded:
    """A case's inputs on the device, as the compiled step takes them."""

    params: Tree
    stats: Tree
    x: jax.Array
    residual: jax.Array | None
    dy: jax.Array | None
    dresidual_out: jax.Array | None

    def args(self) -> tuple[Any, ...]:
        return (self.params, self.stats, self.x, self.residual, self.dy, self.dresidual_out)

    def named(self) -> dict[str, jax.Array]:
        """The arrays under the contract's input names (the scale is ``weight``: under an offset the
        translated offset + w, the buffer the module reads in its place)."""
        names = {"scale": "weight", "bias": "bias", "mean": "running_mean", "var": "running_var"}
        found = {"x": self.x, "residual": self.residual, "dy": self.dy, "dresidual_out": self.dresidual_out}
        found.update({names[k]: v for k, v in {**self.params, **self.stats}.items()})
        return {name: value for name, value in found.items() if value is not None}


def scale(case: Case, inputs: Inputs) -> np.ndarray | None:
    """The scale Flax gets: the weight, or under an offset the scale offset + w held exactly (linen.RMSNorm
    has no offset; see offset_scale), in its exact, possibly wider dtype."""
    if not case.weight:
        return None
    weight = inputs["weight"]
    return offset_scale(weight, case.weight_offset, case.weight_dtype) if case.weight_offset else weight


def scale_dtype(case: Case, scale: np.ndarray | None) -> str:
    """The scale's dtype: the parameter dtype, or offset_scale's exact (wider) dtype under an offset."""
    return str(scale.dtype) if case.weight_offset and scale is not None else case.weight_dtype


def to_device(case: Case, spec: Spec, inputs: Inputs, scale: np.ndarray | None) -> Loaded:
    """Copy the inputs to the device under Flax's variable names (params: scale, bias; batch_stats)."""
    params: Tree = {}
    if scale is not None:
        params["scale"] = jc.to_jax(scale, spec.scale_dtype)
    if case.bias:
        params["bias"] = jc.to_jax(inputs["bias"])
    stats: Tree = {}
    if case.op == BATCH_NORM:
        # Exact upcasts: the case's running statistics in the dtype Flax keeps batch_stats in.
        stats = {
            "mean": jc.to_jax(inputs["running_mean"], spec.stats_dtype),
            "var": jc.to_jax(inputs["running_var"], spec.stats_dtype),
        }
    # The residual arrives in the stream's dtype (float32 under residual_dtype="float32").
    residual = jc.to_jax(inputs["residual"]) if "residual" in inputs else None
    dy = jc.to_jax(inputs["dy"]) if spec.grad else None
    dresidual_out = jc.to_jax(inputs["dresidual_out"]) if spec.grad and residual is not None else None
    return Loaded(params, stats, jc.to_jax(inputs["x"]), residual, dy, dresidual_out)


class FlaxPrepared:
    """One case compiled; each call runs the executable on the prepared arrays (JAX arrays are immutable,
    so every call starts from the prepared running statistics and parameters)."""

    def __init__(self, compiled: jc.Compiled, loaded: Loaded, spec: Spec, info: Mapping[str, Any]) -> None:
        self._executable = compiled.executable
        self._args = loaded.args()
        self._inputs = loaded.named()
        self._spec = spec
        self._info = dict(info)
        self._results: Tree = {}

    def __call__(self) -> None:
        self._results = jc.block(self._executable(*self._args))

    def synchronize(self) -> None:
        jc.block(self._results)

    def outputs(self) -> Outputs:
        if not self._results:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        # A translated (wider) scale's gradient is reported in the parameter dtype, as dweight of a
        # parameter of that dtype would be.
        casts = {"dweight": self._spec.param_dtype}
        return {name: jc.to_numpy(value, casts.get(name)) for name, value in self._results.items()}

    def buffers(self) -> dict[str, tuple[int, int]]:
        """The device buffers the executable reads and (after a call) writes, for the aliasing check."""
        return jc.buffers(self._inputs, self._results)

    def info(self) -> dict[str, Any]:
        return dict(self._info)


class FlaxLinen:
    """flax.linen normalization modules, jitted, on JAX's default device."""

    name = "flax"

    def __init__(self) -> None:
        self._cache = jc.Executables(CACHE_SIZE)

    def capabilities(self) -> Capabilities:
        jc.enable_x64()
        return Capabilities(
            ops=OPS,
            dtypes=frozenset(DTYPES),
            features=frozenset(FEATURES) - UNDECLARED,
            device=jc.device_type(),
            device_name=jc.device_name(),
            notes={"flax": flax.__version__, **jc.versions(), **NOTES},
        )

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        return self._prepare(case, inputs, grad=grad, default_eps=False)

    def prepare_default_eps(self, case: Case, inputs: Inputs) -> Prepared:
        """The fingerprint's hook: the module built without epsilon (Flax's own default)."""
        return self._prepare(case, inputs, grad=False, default_eps=True)

    def epsilon(self, case: Case, default_eps: bool) -> float | None:
        """Flax's epsilon: the case's, passed explicitly; None (Flax's default) only for the hook."""
        return None if default_eps else case.eps

    def flax_momentum(self, case: Case) -> float | None:
        """Flax's BatchNorm momentum for the case (None for other ops)."""
        if case.op != BATCH_NORM:
            return None
        if case.momentum is None:
            raise Unsupported("momentum=None (cumulative average) has no Flax BatchNorm equivalent")
        # In eval mode momentum is unused; the case's (0.1) is translated all the same.
        # Flax's BatchNorm weights the old running value: 1 - m (see old_value_momentum).
        return old_value_momentum(case.momentum)

    def transposes(self, case: Case) -> bool:
        """Whether x is transposed to channels last around the module: linen.GroupNorm's feature axis
        is always the last one (InstanceNorm takes feature_axes=1, BatchNorm axis=1 instead)."""
        return case.op == GROUP_NORM

    def _prepare(self, case: Case, inputs: Inputs, *, grad: bool, default_eps: bool) -> FlaxPrepared:
        jc.enable_x64()
        refuse(case)
        eps, momentum = self.epsilon(case, default_eps), self.flax_momentum(case)
        weight = scale(case, inputs)
        layout = self.transposes(case)
        spec = Spec.of(
            case, scale_dtype(case, weight), grad=grad, eps=eps, momentum=momentum, transposed=layout
        )
        loaded = to_device(case, spec, inputs, weight)
        compiled, hit = self._cache.get(spec, lambda: jax.jit(step_fn(spec)).lower(*loaded.args()).compile())
        module = MODULES[spec.op](spec)
        info: dict[str, Any] = {
            "compile_s": 0.0 if hit else compiled.compile_s,
            "cached": hit,
            "use_fast_variance": bool(getattr(module, "use_fast_variance", False)),
            "epsilon": float(module.epsilon),
            "dtype": spec.dtype,
            "param_dtype": spec.scale_dtype,
        }
        if case.op == BATCH_NORM:
            info["flax_momentum"] = float(module.momentum)
            info["batch_stats_dtype"] = spec.stats_dtype
        if case.op == GROUP_NORM:
            info["num_groups"] = int(module.num_groups)
        if spec.transposed:
            info["layout"] = "x transposed to channels last for the module, y transposed back"
        return FlaxPrepared(compiled, loaded, spec, info)


def refuse(case: Case) -> None:
    """Unsupported for what the capabilities leave out, for callers that prepare without asking them."""
    if case.op == INSTANCE_NORM and case.track_running_stats:
        raise Unsupported("linen.InstanceNorm keeps no running statistics (track_running_stats=True)")
    if case.layout != "contiguous":
        raise Unsupported(f"layout={case.layout}: a torch memory format; JAX arrays have no memory layout")


def default_eps(op: str) -> float:
    """Flax's own default epsilon of the op's module, read from the module class."""
    module = {
        LAYER_NORM: nn.LayerNorm,
        RMS_NORM: nn.RMSNorm,
        BATCH_NORM: nn.BatchNorm,
        GROUP_NORM: nn.GroupNorm,
        INSTANCE_NORM: nn.InstanceNorm,
        ADD_RMS_NORM: nn.RMSNorm,
        ADD_LAYER_NORM: nn.LayerNorm,
    }
    cls = module[op]
    (epsilon,) = (f for f in dataclasses.fields(cls) if f.name == "epsilon")
    return float(epsilon.default)  # type: ignore[arg-type]
