"""Deterministic inputs for a Case: drawn in float64 from a named distribution, rounded to dtype.

The generator is seeded from a SHA-256 of the case id, so inputs are a pure function of the case on
every machine and Python (``hash()`` is salted per process and never used).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import numpy as np

from conformance.model.case import ADD_LAYER_NORM, ADD_OPS, BATCH_NORM, GROUP_OPS, Case
from conformance.model.dtypes import finfo, round_to
from conformance.model.residual import exact_sum

Draw = Callable[[np.random.Generator, Case], np.ndarray]

# Mean-to-spread ratio of the `offset` distribution per dtype. Large enough that statistics in the
# activation dtype or a one-pass E[x^2]-E[x]^2 lose most digits; small enough that the spread
# (sigma = 1) still spans several representable steps at that magnitude.
OFFSET_KAPPA: dict[str, float] = {"float64": 1e6, "float32": 1e3, "float16": 256.0, "bfloat16": 32.0}
# Scale of `large`: fp16 squares overflow fp16 (300^2 > 65504); fp32/bf16 squares near 2.5e35 stay
# finite, and so do their sums over rows of up to ~600 elements (x + residual doubles them for
# the add ops; the grids keep `large` rows at most 200 long), so float32 statistics are exercised
# near the top of their range (3.4e38) without leaving it.
LARGE_SCALE: dict[str, float] = {"float64": 1e150, "float32": 5e17, "float16": 300.0, "bfloat16": 5e17}
# Scale of `small`: squares fall into (or below) the dtype's subnormal range.
SMALL_SCALE: dict[str, float] = {"float64": 1e-160, "float32": 1e-20, "float16": 1e-3, "bfloat16": 1e-20}
# Size of the one huge element of `outlier`, representable in every dtype.
OUTLIER_VALUE: dict[str, float] = {"float64": 1e8, "float32": 1e6, "float16": 1e3, "bfloat16": 1e6}


def groups(case: Case) -> tuple[int, int]:
    """(groups, group length), as if x were reshaped so each row is one normalization group.

    LN/RMS groups are rows; BN groups are channels, each holding ``case.rows`` values; GN/IN groups
    are (sample, group) pairs, each holding its channels' spatial values, contiguous in x.
    """
    if case.op in GROUP_OPS:
        return case.rows, int(np.prod(case.shape)) // case.rows
    if case.op == BATCH_NORM:
        return case.shape[1], case.rows
    return case.rows, int(np.prod(case.shape)) // case.rows


def _to_layout(case: Case, grouped: np.ndarray) -> np.ndarray:
    """Inverse of grouping: BN groups are channels, laid out on axis 1."""
    if case.op != BATCH_NORM:
        return grouped.reshape(case.shape)
    n, c, rest = case.shape[0], case.shape[1], case.shape[2:]
    per_channel = grouped.reshape((c, n, *rest))
    return np.moveaxis(per_channel, 0, 1)


def _normal(rng: np.random.Generator, case: Case) -> np.ndarray:
    """Standard normal: the baseline every implementation should get right."""
    return rng.standard_normal(groups(case))


def _offset(rng: np.random.Generator, case: Case) -> np.ndarray:
    """Mean far from zero relative to the spread: catches low-precision and one-pass statistics."""
    return OFFSET_KAPPA[case.dtype] + rng.standard_normal(groups(case))


def _near_constant(rng: np.random.Generator, case: Case) -> np.ndarray:
    """Row variance far below eps: catches eps added outside the square root or dropped.

    The spread is 1% of sqrt(eps) (floored where float16 cannot hold it), so ``var + eps`` is
    dominated by eps and ``sqrt(var) + eps`` differs from ``sqrt(var + eps)`` by orders of magnitude.
    """
    spread = max(0.01 * float(np.sqrt(case.eps)), 1e-4 if case.dtype == "float16" else 0.0)
    values: np.ndarray = spread * rng.standard_normal(groups(case))
    return values


def _constant(rng: np.random.Generator, case: Case) -> np.ndarray:
    """Each group constant (zero variance): y must equal bias, dx must be finite, no 0/0."""
    rows, length = groups(case)
    return np.repeat(rng.standard_normal((rows, 1)), length, axis=1)


def _outlier(rng: np.random.Generator, case: Case) -> np.ndarray:
    """One huge element per group: catches overflowing squares and statistics it dominates."""
    values = rng.standard_normal(groups(case))
    rows, length = values.shape
    values[np.arange(rows), rng.integers(0, length, size=rows)] = OUTLIER_VALUE[case.dtype]
    return values


def _large(rng: np.random.Generator, case: Case) -> np.ndarray:
    """Values whose squares overflow the dtype (fp16) or approach its limit (fp32/bf16 near 5e17)."""
    return LARGE_SCALE[case.dtype] * rng.standard_normal(groups(case))


def _small(rng: np.random.Generator, case: Case) -> np.ndarray:
    """Values whose squares underflow into subnormals: catches statistics in the activation dtype."""
    return SMALL_SCALE[case.dtype] * rng.standard_normal(groups(case))


def _zeros(rng: np.random.Generator, case: Case) -> np.ndarray:
    """All zeros: y = bias, rstd = 1/sqrt(eps); catches 0/0 and eps dropped."""
    return np.zeros(groups(case))


DISTRIBUTIONS: dict[str, Draw] = {
    "normal": _normal,
    "offset": _offset,
    "near_constant": _near_constant,
    "constant": _constant,
    "outlier": _outlier,
    "large": _large,
    "small": _small,
    "zeros": _zeros,
}


# The caller's cotangents (handed to a backend only with gradients), and the activation-shaped inputs
# whose rows belong together (a row subset or permutation takes the same rows of each).
COTANGENTS: tuple[str, ...] = ("dy", "dresidual_out")
PER_ROW: tuple[str, ...] = ("x", "residual", "dy", "dresidual_out")


def for_call(inputs: Mapping[str, np.ndarray], *, grad: bool) -> dict[str, np.ndarray]:
    """What one backend call is given: every input, the cotangents only when it runs the backward."""
    return {k: v for k, v in inputs.items() if grad or k not in COTANGENTS}


def rng_for(case: Case, stream: str = "inputs") -> np.random.Generator:
    """A generator seeded from the case id and a stream name."""
    digest = hashlib.sha256(f"{case.id}|{case.seed}|{stream}".encode()).digest()
    return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))


def make_inputs(case: Case, *, grad: bool = True) -> dict[str, np.ndarray]:
    """All inputs of ``case`` rounded to their dtypes; ``dy`` only when ``grad``."""
    rng = rng_for(case)
    x = round_to(_to_layout(case, DISTRIBUTIONS[case.dist](rng, case)), case.dtype)
    inputs = {"x": x}
    if case.op in ADD_OPS:
        # The residual stream: same distribution, its own draw, in the stream's dtype.
        residual = DISTRIBUTIONS[case.dist](rng_for(case, "residual"), case)
        inputs["residual"] = round_to(_to_layout(case, residual), case.stream_dtype)
    inputs.update(_params(case, rng, x))
    if grad:
        # Random, never all ones: a backward that ignores dy's values must not pass by accident.
        inputs["dy"] = round_to(rng_for(case, "dy").standard_normal(case.shape), case.dtype)
        if case.op in ADD_OPS:
            # The next layer reads residual_out too: its gradient arrives beside dy.
            cotangent = rng_for(case, "dresidual_out").standard_normal(groups(case))
            cotangent *= _cotangent_scale(case, x, inputs["residual"])
            inputs["dresidual_out"] = round_to(_to_layout(case, cotangent), case.stream_dtype)
    return inputs


def specs(case: Case, *, grad: bool = True) -> dict[str, tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each input ``make_inputs(case, grad=grad)`` returns, without drawing any: for
    what needs only the inputs' geometry, such as recording a backend's kernel launches on large cases."""
    out = {"x": (case.shape, case.dtype)}
    if case.op in ADD_OPS:
        out["residual"] = (case.shape, case.stream_dtype)
    if case.weight:
        out["weight"] = (case.param_shape, case.weight_dtype)
    if case.bias:
        out["bias"] = (case.param_shape, case.weight_dtype)
    if case.track_running_stats:
        channels = (case.shape[1],)
        out |= {"running_mean": (channels, case.weight_dtype), "running_var": (channels, case.weight_dtype)}
    if grad:
        out["dy"] = (case.shape, case.dtype)
        if case.op in ADD_OPS:
            out["dresidual_out"] = (case.shape, case.stream_dtype)
    return out


def _cotangent_scale(case: Case, x: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """Per row, the size of the norm's own gradient: 1 / sigma of h = x + residual (centred for
    add_layer_norm), clipped to [sqrt(tiny), sqrt(max)] of the stream dtype.

    dx = d norm(h)/dh . dy + dresidual_out, and the first term is ~|dy| / sigma: on `large` rows
    (sigma ~ 1e18) a unit dresidual_out would outweigh it by 18 decades and dx would judge nothing
    of the norm's backward; on `small` or `zeros` rows the norm's term would hide a mishandled
    dresidual_out. Scaled to 1 / sigma, both terms count in every row. The clip keeps the cotangent
    and its squares finite and normal in the stream dtype.
    """
    rows = exact_sum({"x": x, "residual": residual}).reshape(groups(case))
    if case.op == ADD_LAYER_NORM:
        rows = rows - rows.mean(axis=1, keepdims=True)
    sigma = np.sqrt(np.mean(rows * rows, axis=1) + case.eps)
    info = finfo(case.stream_dtype)
    scale: np.ndarray = np.clip(1.0 / sigma, np.sqrt(float(info.tiny)), np.sqrt(float(info.max)))
    return scale[:, None]


def _params(case: Case, rng: np.random.Generator, x: np.ndarray) -> dict[str, np.ndarray]:
    params: dict[str, np.ndarray] = {}
    shape = case.param_shape
    if case.weight:
        # Gemma-style (1 + w) stores w near 0; plain weights scatter around 1.
        centre = 0.0 if case.weight_offset else 1.0
        params["weight"] = round_to(centre + 0.5 * rng.standard_normal(shape), case.weight_dtype)
    if case.bias:
        params["bias"] = round_to(0.5 * rng.standard_normal(shape), case.weight_dtype)
    if case.track_running_stats:
        params.update(_running_stats(case, rng, x))
    return params


def _running_stats(case: Case, rng: np.random.Generator, x: np.ndarray) -> dict[str, np.ndarray]:
    """Running statistics near the batch's own, so eval-mode outputs stay in a sensible range."""
    axes = (0, *range(2, x.ndim))
    values = x.astype(np.float64)
    mean, std = values.mean(axis=axes), values.std(axis=axes)
    channels = case.shape[1]
    running_mean = mean + 0.1 * std * rng.standard_normal(channels)
    running_var = std**2 * rng.uniform(0.5, 2.0, channels)
    # `large` fp16 batches have variances beyond float16; keep the running stats representable.
    # `large`/`offset` batches can exceed a narrower parameter dtype; keep the running stats finite.
    limit = float(finfo(case.weight_dtype).max) / 4
    running_mean = np.clip(running_mean, -limit, limit)
    running_var = np.minimum(running_var, limit)
    return {
        "running_mean": round_to(running_mean, case.weight_dtype),
        "running_var": round_to(running_var, case.weight_dtype),
    }
