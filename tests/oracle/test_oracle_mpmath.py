"""The oracle's forward outputs agree with the definitions evaluated in 50-digit mpmath arithmetic."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from conformance.model.case import CHANNEL_OPS, GROUP_OPS, Case
from conformance.model.inputs import make_inputs
from conformance.oracle import evaluate

mpmath = pytest.importorskip("mpmath")
mpf = mpmath.mpf

# Norm-wise relative error of a float64 oracle against the exact value: a few roundings per output
# (1.1e-16 each) over sums of at most a few dozen terms, observed <= 2.2e-16; the refined mean keeps
# `offset` (mean 1e6 times the spread) at this level too, where a plain mean is off by ~1e-10.
MP_TOLERANCE = 2e-15

CASES = [
    Case("layer_norm", (3, 5), "float64", 1e-5),
    Case("layer_norm", (3, 7), "float64", 1e-5, dist="offset"),
    Case("layer_norm", (2, 3, 4), "float64", 1e-5, norm_ndim=2, dist="outlier"),
    Case("layer_norm", (3, 5), "float64", 1e-5, dist="near_constant"),
    Case("layer_norm", (3, 5), "float64", 1e-12, dist="large", bias=False),
    Case("layer_norm", (3, 5), "float64", 1e-5, dist="small", weight=False),
    Case("layer_norm", (2, 16), "float32", 1e-5, dist="offset"),
    Case("layer_norm", (2, 16), "bfloat16", 1e-5, param_dtype="float32", dist="offset"),
    Case("rms_norm", (3, 5), "float64", 1e-6),
    Case("rms_norm", (2, 3, 4), "float64", 1e-6, norm_ndim=2, weight_offset=1.0),
    Case("rms_norm", (3, 5), "float64", 1e-6, dist="large", weight=False),
    Case("rms_norm", (3, 5), "float64", 1e-6, dist="near_constant"),
    Case("rms_norm", (2, 16), "bfloat16", 1e-6, dist="outlier"),
    Case("batch_norm", (4, 3), "float64", 1e-5, training=True),
    Case("batch_norm", (2, 3, 4), "float64", 1e-5, training=True, momentum=None, dist="offset"),
    Case("batch_norm", (5, 2, 3), "float32", 1e-5, training=True, momentum=0.3, bias=False),
    Case("batch_norm", (4, 3), "float64", 1e-5),
    Case("batch_norm", (2, 3, 2, 2), "bfloat16", 1e-3, weight=False, dist="outlier"),
    Case("group_norm", (2, 6, 5), "float64", 1e-5, num_groups=3),
    Case("group_norm", (2, 4, 3, 2), "float64", 1e-5, num_groups=1, dist="offset"),
    Case("group_norm", (3, 8), "float64", 1e-5, num_groups=4, dist="near_constant"),
    Case("group_norm", (2, 6, 4), "float32", 1e-5, num_groups=6, dist="outlier", bias=False),
    Case("group_norm", (2, 4, 8), "bfloat16", 1e-5, num_groups=2, param_dtype="float32", dist="offset"),
    Case("group_norm", (2, 4, 3, 3), "float16", 1e-3, num_groups=2, weight=False, layout="channels_last"),
    Case("instance_norm", (2, 3, 5), "float64", 1e-5),
    Case("instance_norm", (2, 3, 2, 3), "float64", 1e-12, dist="large", weight=False, bias=False),
    Case("instance_norm", (2, 3, 6), "float64", 1e-5, dist="offset", track_running_stats=True),
    Case("instance_norm", (3, 2, 5), "float64", 1e-5, training=True, track_running_stats=True, momentum=0.3),
    Case(
        "instance_norm", (2, 3, 2, 2), "float32", 1e-5, training=True, track_running_stats=True, momentum=None
    ),
]

MpRow = list[Any]  # mpf values of one normalization group
Normalized = tuple[list[MpRow], dict[str, list[Any]]]  # (xhat rows, named per-group statistics)


def grouped(case: Case, values: np.ndarray) -> np.ndarray:
    """x as (groups, group length): LN/RMS rows, BN channels, or GN/IN (sample, group) pairs, whose
    channels and spatial values are contiguous in x."""
    if case.op == "batch_norm":
        return np.moveaxis(values, 1, 0).reshape(case.shape[1], -1)
    return values.reshape(case.rows, -1)


def ungrouped(case: Case, values: np.ndarray) -> np.ndarray:
    if case.op == "batch_norm":
        moved = (case.shape[1], case.shape[0], *case.shape[2:])
        return np.moveaxis(values.reshape(moved), 0, 1)
    return values.reshape(case.shape)


def to_mp(values: np.ndarray) -> list[MpRow]:
    return [[mpf(float(v)) for v in row] for row in np.atleast_2d(values.astype(np.float64))]


def mean(values: Sequence[Any]) -> Any:
    return mpmath.fsum(values) / len(values)


def centred_stats(row: MpRow, eps: Any) -> tuple[Any, Any, Any]:
    """(mean, biased variance, rstd) of one group."""
    mu = mean(row)
    var = mean([(v - mu) ** 2 for v in row])
    return mu, var, 1 / mpmath.sqrt(var + eps)


def reference(case: Case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The Case's forward outputs from the textbook definitions, at 50 digits, rounded to float64."""
    with mpmath.workdps(50):
        eps = mpf(case.eps)
        rows = to_mp(grouped(case, inputs["x"].astype(np.float64)))
        normalize = NORMALIZERS[(case.op, case.training, case.uses_batch_stats)]
        xhat, stats = normalize(case, inputs, rows, eps)
        out = {name: np.array([float(v) for v in values]) for name, values in stats.items()}
        out["y"] = ungrouped(case, np.array([[float(v) for v in row] for row in affine(case, inputs, xhat)]))
    for name in ("mean", "rstd"):
        if name in out and case.op in GROUP_OPS:
            out[name] = out[name].reshape(case.shape[0], case.groups)
        elif name in out and case.op != "batch_norm":
            out[name] = out[name].reshape(case.shape[: len(case.shape) - case.norm_ndim])
    return out


def layer_norm(case: Case, inputs: dict[str, np.ndarray], rows: list[MpRow], eps: Any) -> Normalized:
    stats = [centred_stats(row, eps) for row in rows]
    xhat = [[(v - mu) * rstd for v in row] for row, (mu, _, rstd) in zip(rows, stats, strict=True)]
    return xhat, {"mean": [s[0] for s in stats], "rstd": [s[2] for s in stats]}


def rms_norm(case: Case, inputs: dict[str, np.ndarray], rows: list[MpRow], eps: Any) -> Normalized:
    rstds = [1 / mpmath.sqrt(mean([v**2 for v in row]) + eps) for row in rows]
    return [[v * rstd for v in row] for row, rstd in zip(rows, rstds, strict=True)], {"rstd": rstds}


def batch_norm_training(case: Case, inputs: dict[str, np.ndarray], rows: list[MpRow], eps: Any) -> Normalized:
    xhat, stats = layer_norm(case, inputs, rows, eps)
    m = mpf(1.0 if case.momentum is None else case.momentum)
    count = len(rows[0])
    unbiased = [
        mean([(v - mu) ** 2 for v in row]) * count / (count - 1)
        for row, mu in zip(rows, stats["mean"], strict=True)
    ]
    old_mean, old_var = to_mp(inputs["running_mean"])[0], to_mp(inputs["running_var"])[0]
    stats["running_mean"] = [(1 - m) * r + m * b for r, b in zip(old_mean, stats["mean"], strict=True)]
    stats["running_var"] = [(1 - m) * r + m * b for r, b in zip(old_var, unbiased, strict=True)]
    return xhat, stats


def batch_norm_eval(case: Case, inputs: dict[str, np.ndarray], rows: list[MpRow], eps: Any) -> Normalized:
    means, variances = to_mp(inputs["running_mean"])[0], to_mp(inputs["running_var"])[0]
    rstds = [1 / mpmath.sqrt(var + eps) for var in variances]
    return [[(v - mu) * r for v in row] for row, mu, r in zip(rows, means, rstds, strict=True)], {}


def instance_norm_training(
    case: Case, inputs: dict[str, np.ndarray], rows: list[MpRow], eps: Any
) -> Normalized:
    """Instance statistics; running = (1 - m) running + m * the sample average of each channel's
    instance means and unbiased instance variances (rows are (sample, channel), channel fastest)."""
    xhat, stats = layer_norm(case, inputs, rows, eps)
    m = mpf(1.0 if case.momentum is None else case.momentum)
    samples, channels, count = case.shape[0], case.shape[1], len(rows[0])
    unbiased = [
        mean([(v - mu) ** 2 for v in row]) * count / (count - 1)
        for row, mu in zip(rows, stats["mean"], strict=True)
    ]
    for name, batch in (("running_mean", stats["mean"]), ("running_var", unbiased)):
        average = [
            mpmath.fsum(batch[n * channels + c] for n in range(samples)) / samples for c in range(channels)
        ]
        old = to_mp(inputs[name])[0]
        stats[name] = [(1 - m) * r + m * b for r, b in zip(old, average, strict=True)]
    return xhat, stats


def instance_norm_eval(case: Case, inputs: dict[str, np.ndarray], rows: list[MpRow], eps: Any) -> Normalized:
    """Running statistics of channel c normalize every row (n, c)."""
    channels = case.shape[1]
    means, variances = to_mp(inputs["running_mean"])[0], to_mp(inputs["running_var"])[0]
    rstds = [1 / mpmath.sqrt(var + eps) for var in variances]
    return [[(v - means[i % channels]) * rstds[i % channels] for v in row] for i, row in enumerate(rows)], {}


# Keyed by (op, training, normalizes with batch statistics).
NORMALIZERS: dict[tuple[str, bool, bool], Callable[..., Normalized]] = {
    ("layer_norm", False, True): layer_norm,
    ("rms_norm", False, True): rms_norm,
    ("batch_norm", True, True): batch_norm_training,
    ("batch_norm", False, False): batch_norm_eval,
    ("group_norm", False, True): layer_norm,
    ("instance_norm", False, True): layer_norm,
    ("instance_norm", True, True): instance_norm_training,
    ("instance_norm", False, False): instance_norm_eval,
}


def affine(case: Case, inputs: dict[str, np.ndarray], xhat: list[MpRow]) -> list[MpRow]:
    """xhat * (offset + weight) + bias; each parameter broadcast to x (per trailing position for
    LN/RMS, per channel for BN/GN/IN) and grouped like x."""
    shape = (-1,) + (1,) * (len(case.shape) - 2) if case.op in CHANNEL_OPS else case.param_shape
    ones, zeros = np.ones(case.param_shape), np.zeros(case.param_shape)
    scale = to_mp(grouped(case, np.broadcast_to(inputs.get("weight", ones).reshape(shape), case.shape)))
    bias = to_mp(grouped(case, np.broadcast_to(inputs.get("bias", zeros).reshape(shape), case.shape)))
    offset = mpf(case.weight_offset)
    return [
        [h * (offset + s) + b for h, s, b in zip(*triple, strict=True)]
        for triple in zip(xhat, scale, bias, strict=True)
    ]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_forward_matches_mpmath(case: Case) -> None:
    inputs = make_inputs(case, grad=False)
    actual = evaluate(case, inputs, grad=False)
    expected = reference(case, inputs)
    assert set(expected) <= set(actual)
    for name, values in expected.items():
        error = np.max(np.abs(actual[name] - values))
        scale = max(np.max(np.abs(values)), np.finfo(np.float64).tiny)
        assert error <= MP_TOLERANCE * scale, f"{name}: norm-wise error {error / scale:.3g}"
