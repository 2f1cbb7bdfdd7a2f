"""Executable models of known deviations: what a backend is understood to compute, as NumPy.

A model takes the case and its inputs (rounded to their dtypes, ``dy`` included) and returns the
outputs it explains, float64 or rounded. A ledger entry names one by its key in ``MODELS`` or, for a
third party's own, as ``"package.module:function"``. The judge compares a failing output with the
model's under the very tolerance rule that failed it: a model explains, it never widens a tolerance.
Each model is the reference with one convention changed, so it is as small as that change.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping

import numpy as np

from conformance import oracle
from conformance.model import residual
from conformance.model.case import GROUP_OPS, Case
from conformance.model.dtypes import round_to
from conformance.model.geometry import geometry

Arrays = Mapping[str, np.ndarray]
Model = Callable[[Case, Arrays], Arrays]


class ModelError(ValueError):
    """A model name that resolves to nothing callable; the message names it and the choices."""


def _grad(inputs: Arrays) -> bool:
    return "dy" in inputs


def eps_float32(case: Case, inputs: Arrays) -> Arrays:
    """eps rounded to float32 before use: an ONNX ``epsilon`` attribute is a FLOAT, and exporters hold
    a decomposed norm's eps as a float32 constant even in float64 graphs."""
    eps = float(np.float32(case.eps))
    return oracle.evaluate(dataclasses.replace(case, eps=eps), inputs, grad=_grad(inputs))


def momentum_zero(case: Case, inputs: Arrays) -> Arrays:
    """A training step that leaves the running statistics as they were (momentum 0): what
    ``torch.nn.InstanceNorm*d(momentum=None)`` passes to ``F.instance_norm``."""
    if not case.training:
        raise ModelError(f"momentum_zero models a training step; case {case.id} is not one")
    return oracle.evaluate(dataclasses.replace(case, momentum=0.0), inputs, grad=_grad(inputs))


def momentum_float32(case: Case, inputs: Arrays) -> Arrays:
    """ONNX's momentum attribute is a FLOAT holding the weight of the old running value (1 - m):
    the batch statistic is blended in with 1 - float32(1 - m)."""
    if case.momentum is None or not case.training:
        raise ModelError(f"momentum_float32 models a training step with a momentum, not case {case.id}")
    momentum = 1.0 - float(np.float32(1.0 - case.momentum))
    return oracle.evaluate(dataclasses.replace(case, momentum=momentum), inputs, grad=_grad(inputs))


def half_statistics(case: Case, inputs: Arrays) -> Arrays:
    """GroupNorm / InstanceNorm whose per-group mean and rstd are held in the activation dtype (torch's
    native_group_norm and native_batch_norm return them as float16/bfloat16 for half inputs) and read
    back by the forward's normalization and by the backward."""
    if case.op not in GROUP_OPS:
        raise ModelError(f"half_statistics models group_norm and instance_norm, not op={case.op}")
    geo = geometry(case)
    f64 = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    x = f64["x"].reshape(geo.shape)
    mean = x.mean(axis=geo.group_axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=geo.group_axes, keepdims=True)
    m_h = round_to(mean, case.dtype).astype(np.float64)
    r_h = round_to(1.0 / np.sqrt(var + case.eps), case.dtype).astype(np.float64)
    xhat = (x - m_h) * r_h
    w = f64["weight"].reshape(geo.param_shape) if case.weight else 1.0
    b = f64["bias"].reshape(geo.param_shape) if case.bias else 0.0
    out = {**oracle.evaluate(case, inputs, grad=_grad(inputs)), "y": (xhat * w + b).reshape(case.shape)}
    if _grad(inputs):
        dy = f64["dy"].reshape(geo.shape)
        g = dy * w
        mg = g.mean(axis=geo.group_axes, keepdims=True)
        mgx = (g * xhat).mean(axis=geo.group_axes, keepdims=True)
        out["dx"] = (r_h * (g - mg - xhat * mgx)).reshape(case.shape)
        if case.weight:
            out["dweight"] = (dy * xhat).sum(axis=geo.reduce_axes).reshape(-1)
    return out


def one_pass_sequential_float32(case: Case, inputs: Arrays) -> Arrays:
    """LayerNorm (and the add op's) whose row mean and mean square are accumulated element by element in
    float32 and whose variance is E[x^2] - E[x]^2 (clipped at 0): on offset rows the subtraction cancels
    most digits. ONNX Runtime's SkipLayerNormalization CPU kernel before 1.30 does this; the sequential
    order reproduces it to the bit where a pairwise sum would not."""
    if case.op not in ("layer_norm", "add_layer_norm") or case.norm_ndim != 1:
        raise ModelError(f"one_pass_sequential_float32 models one-axis LayerNorm rows, not case {case.id}")
    x = residual.normalized(case, inputs).astype(np.float32)
    rows = x.reshape(-1, x.shape[-1])
    total = np.zeros(rows.shape[0], np.float32)
    squares = np.zeros(rows.shape[0], np.float32)
    for column in rows.T:  # one float32 rounding per element added, in order
        total += column
        squares += column * column
    n = np.float32(rows.shape[1])
    mean = total / n
    var = np.maximum(squares / n - mean * mean, np.float32(0)).astype(np.float64)
    xhat = (rows.astype(np.float64) - mean[:, None].astype(np.float64)) / np.sqrt(var[:, None] + case.eps)
    w = np.asarray(inputs["weight"], np.float64) if case.weight else 1.0
    b = np.asarray(inputs["bias"], np.float64) if case.bias else 0.0
    y = (xhat * w + b).reshape(case.shape)
    return {**oracle.evaluate(case, inputs, grad=_grad(inputs)), "y": y}


MODELS: dict[str, Model] = {
    "one_pass_sequential_float32": one_pass_sequential_float32,
    "eps_float32": eps_float32,
    "momentum_zero": momentum_zero,
    "momentum_float32": momentum_float32,
    "half_statistics": half_statistics,
}


def resolve(name: str) -> Model:
    """A built-in model by key, or a third party's as ``package.module:function``."""
    if name in MODELS:
        return MODELS[name]
    module, _, attribute = name.partition(":")
    if not module or not attribute:
        raise ModelError(
            f"model={name!r} is not allowed; allowed: {', '.join(MODELS)} or 'package.module:function'"
        )
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"model={name!r} cannot be loaded: {exc}") from exc
    if not callable(found):
        raise ModelError(f"model={name!r} is not callable")
    model: Model = found
    return model
