"""Where a case's normalization groups and parameters lie, as axes of one reshaped view of x.

LayerNorm groups are trailing axes and BatchNorm groups are every axis but the channel; a GroupNorm
group is a slice of the channel axis times the spatial axes, which no axis of x spans on its own.
Reshaping x (C-contiguous, so a view) to (N, groups, channels per group, spatial) makes every op's
groups and parameters plain axes, so the judging code asks one question of every op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from conformance.model.case import BATCH_NORM, GROUP_OPS, Case

Axes = tuple[int, ...]


@dataclass(frozen=True)
class Geometry:
    """x reshaped to ``shape``: statistics reduce ``group_axes``, parameter gradients ``reduce_axes``,
    and the parameters broadcast once reshaped to ``param_shape``."""

    shape: tuple[int, ...]
    group_axes: Axes
    reduce_axes: Axes
    param_shape: tuple[int, ...]

    @property
    def stats_shape(self) -> tuple[int, ...]:
        """The shape of per-group statistics kept as broadcastable dims (keepdims)."""
        return tuple(1 if axis in self.group_axes else size for axis, size in enumerate(self.shape))


def geometry(case: Case) -> Geometry:
    shape = case.shape
    if case.op in GROUP_OPS:
        n, channels, groups = shape[0], shape[1], case.groups
        view = (n, groups, channels // groups, math.prod(shape[2:]))
        return Geometry(view, (2, 3), (0, 3), (groups, channels // groups, 1))
    if case.op == BATCH_NORM:
        axes = (0, *range(2, len(shape)))
        return Geometry(shape, axes, axes, (shape[1],) + (1,) * (len(shape) - 2))
    trailing = tuple(range(len(shape) - case.norm_ndim, len(shape)))
    others = tuple(axis for axis in range(len(shape)) if axis not in trailing)
    return Geometry(shape, trailing, others, case.param_shape)
