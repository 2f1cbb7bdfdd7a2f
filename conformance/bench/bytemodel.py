"""One byte model for every backend: the compulsory bytes a check moves, weights and stats apart.

Forward LN/RMS/BN/GN/IN reads x and writes y; backward reads x and dy and writes dx. The fused add ops'
forward moves four tensors (x, residual in; y, residual_out out) and their backward five (h as saved,
dy and dresidual_out in; dx and dresidual out); the residual stream's tensors count in its own dtype
(float32 for "residual in fp32"). The ``backward`` benchmark times
forward and backward together, so its bytes are the sum of both passes. Parameters, running
statistics, their gradients and the per-group statistics (mean/rstd per LN/RMS row, BN channel or
GN/IN (sample, group), float32, saved by the forward for the backward) are counted in ``weights``,
never in ``activations``: GB/s and roofline fractions use the activations alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from conformance.model.case import ADD_OPS, BATCH_NORM, RMS_OPS, Case
from conformance.model.dtypes import numpy_dtype

CHECKS: tuple[str, ...] = ("forward", "backward")
_STAT_BYTES = 4  # mean and rstd are float32 (float64 for float64 activations) in every reference kernel


@dataclass(frozen=True)
class Traffic:
    """Bytes one timed call moves: ``activations`` (compulsory tensors) and ``weights`` (params, stats)."""

    activations: int
    weights: int


def _itemsize(dtype: str) -> int:
    return numpy_dtype(dtype).itemsize


def _forward_bytes(case: Case, elements: int) -> int:
    """Full-size tensors the forward reads or writes once each: x and y, and the add ops' residual and
    residual_out in the stream's dtype."""
    act = 2 * elements * _itemsize(case.dtype)
    return act + 2 * elements * _itemsize(case.stream_dtype) if case.op in ADD_OPS else act


def _backward_bytes(case: Case, elements: int) -> int:
    """Full-size tensors the backward alone moves: read x and dy, write dx; the add ops read h (as
    saved, stream dtype), dy and dresidual_out and write dx and dresidual."""
    act = elements * _itemsize(case.dtype)
    if case.op in ADD_OPS:
        return 2 * act + 3 * elements * _itemsize(case.stream_dtype)
    return 3 * act


def _forward_params(case: Case) -> int:
    """Parameter-sized tensors a forward moves: weight and bias read; BN (and InstanceNorm with
    track_running_stats) also reads its running statistics, and a training step writes them back."""
    count = int(case.weight) + int(bool(case.bias))
    if case.track_running_stats:
        count += 4 if case.training else 2
    return count


def _backward_params(case: Case) -> int:
    """Parameter-sized tensors the backward alone moves: read weight, write dweight and dbias; eval
    with running statistics reads them again (rstd for dx, mean and rstd for dweight's xhat)."""
    count = 2 * int(case.weight) + int(bool(case.bias))
    return count if case.uses_batch_stats else count + 2


def _stat_bytes(case: Case) -> int:
    """Per-group statistics a forward saves for its backward: mean and rstd (RMSNorm: rstd only) of
    every LN/RMS row, BN channel or GN/IN (sample, group); none where the running statistics
    normalize (eval), since the backward reads those instead."""
    if not case.uses_batch_stats:
        return 0
    groups = case.shape[1] if case.op == BATCH_NORM else case.rows  # GN/IN: samples x groups
    per_group = 1 if case.op in RMS_OPS else 2
    return groups * per_group * (8 if case.dtype == "float64" else _STAT_BYTES)


def traffic(case: Case, check: str) -> Traffic:
    """The byte model of one timed call of ``check`` (forward, or forward + backward)."""
    if check not in CHECKS:
        raise ValueError(f"check={check!r} is not allowed; allowed: {', '.join(CHECKS)}")
    elements = math.prod(case.shape)
    param = math.prod(case.param_shape) * _itemsize(case.weight_dtype)
    forward = Traffic(_forward_bytes(case, elements), _forward_params(case) * param)
    if check == "forward":
        return forward
    # The statistics are written by the forward and read back by the backward.
    weights = forward.weights + _backward_params(case) * param + 2 * _stat_bytes(case)
    return Traffic(forward.activations + _backward_bytes(case, elements), weights)
