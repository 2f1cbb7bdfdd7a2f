"""The axis-general pieces every oracle shares: moments, the inverse standard deviation, the affine
step, the centred backward and the parameter gradients, over whichever axes an op normalizes
(LayerNorm's trailing dims, BatchNorm's all-but-channel, a GroupNorm group)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from conformance.model.case import Case

Array = NDArray[np.float64]
Axes = tuple[int, ...]


def trailing_axes(ndim: int, norm_ndim: int) -> Axes:
    """The normalized axes of LN/RMS: the last ``norm_ndim`` of ``ndim``."""
    return tuple(range(ndim - norm_ndim, ndim))


def other_axes(ndim: int, axes: Axes) -> Axes:
    """The complement of ``axes``: what a parameter gradient sums over (or the statistics' shape)."""
    return tuple(axis for axis in range(ndim) if axis not in axes)


def moments(x: Array, axes: Axes) -> tuple[Array, Array, Array]:
    """(mean, x - mean, biased variance) over ``axes``, keepdims; two passes, never E[x^2] - E[x]^2.

    The mean gets one refinement step: ``x - rough`` is exact near the mean (Sterbenz), so centring
    with the small correction keeps all digits of the spread even when the mean is 1e6 times larger.
    """
    rough = x.mean(axis=axes, keepdims=True)
    shifted = x - rough
    correction = shifted.mean(axis=axes, keepdims=True)
    centred = shifted - correction
    return rough + correction, centred, np.square(centred).mean(axis=axes, keepdims=True)


def inverse_std(var: Array, eps: float) -> Array:
    """rstd = 1 / sqrt(var + eps), eps inside the root (PyTorch's convention)."""
    rstd: Array = 1.0 / np.sqrt(var + eps)
    return rstd


def affine(xhat: Array, scale: Array | None, bias: Array | None) -> Array:
    """y = xhat * scale + bias, either term optional."""
    y = xhat if scale is None else xhat * scale
    return y if bias is None else y + bias


def centred_backward(g: Array, xhat: Array, rstd: Array, axes: Axes) -> Array:
    """dx through xhat = (x - mean) * rstd with batch statistics, given g = dL/dxhat."""
    mean_g = g.mean(axis=axes, keepdims=True)
    mean_gx = (g * xhat).mean(axis=axes, keepdims=True)
    dx: Array = rstd * (g - mean_g - xhat * mean_gx)
    return dx


def param_grads(dy: Array, xhat: Array, reduce: Axes, case: Case) -> dict[str, Array]:
    """dweight = sum(dy * xhat), dbias = sum(dy) over the non-parameter axes, as the case asks."""
    grads: dict[str, Array] = {}
    if case.weight:
        grads["dweight"] = (dy * xhat).sum(axis=reduce)
    if case.bias:
        grads["dbias"] = dy.sum(axis=reduce)
    return grads


def optional(inputs: Mapping[str, Array], name: str, present: bool) -> Array | None:
    """``inputs[name]`` when the case has that parameter, else None (a missing key is a KeyError)."""
    return inputs[name] if present else None
