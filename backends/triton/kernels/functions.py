"""torch.autograd.Function wrappers: what the adapter (and any caller) uses.

LayerNorm / RMSNorm: inputs of any shape; the trailing ``normalized_shape`` dims are one row of
``n_cols`` elements, the leading dims are rows. GroupNorm / InstanceNorm: x is (N, C, spatial...) with
per-channel parameters. The fused residual add ops (and their in-place forms) live in add_functions.py
and are importable from here too. Gradients come back in the dtype of the tensor they belong to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from backends.triton.kernels import blocks, mode

mode.require_selected()

import torch  # noqa: E402

from backends.triton.kernels import launch, launcher, ops  # noqa: E402
from backends.triton.kernels.add_functions import add_layer_norm as add_layer_norm  # noqa: E402
from backends.triton.kernels.add_functions import add_layer_norm_ as add_layer_norm_  # noqa: E402
from backends.triton.kernels.add_functions import add_rms_norm as add_rms_norm  # noqa: E402
from backends.triton.kernels.add_functions import add_rms_norm_ as add_rms_norm_  # noqa: E402
from backends.triton.kernels.group_norm import (  # noqa: E402
    channel_sums,
    group_norm_dx,
    group_norm_fwd,
    running_update,
)
from backends.triton.kernels.launch import (  # noqa: E402
    acc_dtype,
    launch_options,
    policy,
    scalars,
    tile_options,
    tl_dtype,
)

__all__ = [
    "acc_dtype",
    "add_layer_norm",
    "add_layer_norm_",
    "add_rms_norm",
    "add_rms_norm_",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "policy",
    "rms_norm",
]


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        normalized_shape: tuple[int, ...],
        eps: float,
        pol: blocks.Policy,
    ) -> torch.Tensor:
        x2 = launch.rows(x, normalized_shape)
        w = None if weight is None else weight.contiguous()
        b_ = None if bias is None else bias.contiguous()
        y = torch.empty_like(x2)
        stats = launch.layer_norm_forward(x2, w, b_, eps, pol, y, save=launch.tracked(ctx))
        if stats is not None:
            ctx.save_for_backward(x2, w, b_, *stats)
            ctx.pol, ctx.shape = pol, x.shape
        return launch.shaped(y, x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, w, b_, mean, rstd = ctx.saved_tensors
        dx = torch.empty_like(x2)
        want = (ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        dy2 = launch.like_rows(dy, x2)
        dw, db = launch.layer_norm_backward(
            (x2, None), w, b_, (mean, rstd), dy2, launch.Grads(dx), want, ctx.pol
        )
        return launch.shaped(dx, ctx.shape), dw, db, None, None, None


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        normalized_shape: tuple[int, ...],
        eps: float,
        offset: float,
        pol: blocks.Policy,
    ) -> torch.Tensor:
        x2 = launch.rows(x, normalized_shape)
        w = None if weight is None else weight.contiguous()
        y = torch.empty_like(x2)
        stats = launch.rms_forward(x2, w, eps, offset, pol, y, save=launch.tracked(ctx))
        if stats is not None:
            rstd, consts = stats
            ctx.save_for_backward(x2, w, consts, rstd)
            ctx.pol, ctx.shape = pol, x.shape
        return launch.shaped(y, x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, w, consts, rstd = ctx.saved_tensors
        dx = torch.empty_like(x2)
        dy2 = launch.like_rows(dy, x2)
        grads = launch.Grads(dx)
        dw = launch.rms_backward((x2, None), w, consts, rstd, dy2, grads, ctx.needs_input_grad[1], ctx.pol)
        return launch.shaped(dx, ctx.shape), dw, None, None, None, None


class _GroupNorm(torch.autograd.Function):
    """GroupNorm, and InstanceNorm as its G = C case (optionally with running statistics)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        groups: int,
        use_input_stats: bool,
        momentum: float,
        eps: float,
        pol: blocks.Policy,
    ) -> torch.Tensor:
        n, channels, spatial = x.shape[0], x.shape[1], math.prod(x.shape[2:])
        cpg = channels // groups
        x2 = x.contiguous().view(n * groups, cpg * spatial)  # group rows
        (n_rows, n_cols), acc = x2.shape, acc_dtype(x, weight, bias, running_mean, running_var)
        w = None if weight is None else weight.contiguous()
        b_ = None if bias is None else bias.contiguous()
        given = not use_input_stats  # normalize with the running statistics (InstanceNorm eval)
        update = use_input_stats and running_mean is not None
        y = torch.empty_like(x2)
        mean = torch.empty(n_rows, dtype=acc, device=x.device)
        rstd = torch.empty(n_rows, dtype=acc, device=x.device)
        var = torch.empty(n_rows, dtype=acc, device=x.device) if update else mean
        consts = scalars(eps, momentum, acc, x.device)
        rm = x2 if running_mean is None else running_mean
        rv = x2 if running_var is None else running_var
        b = blocks.forward(n_rows, n_cols, pol, wide=acc == torch.float64)
        launcher.launch(
            group_norm_fwd, b.programs,
            x2, x2 if w is None else w, x2 if b_ is None else b_, rm, rv, consts, y, mean, rstd, var,
            n_rows, n_cols, spatial, cpg, groups,
            HAS_W=w is not None, HAS_B=b_ is not None, GIVEN_STATS=given, SAVE_VAR=update, ACC=tl_dtype(acc),
            **launch_options(b),
        )  # fmt: skip
        if update:
            # G = C here: the group rows are the (sample, channel) instances, [N, C] in memory.
            u = blocks.channels(channels, pol)
            launcher.launch(
                running_update, u.programs,
                mean, var, consts, rm, rv, n, channels,
                ACC=tl_dtype(acc), BLOCK_N=u.block_n, **launch.warp_options(u),
            )  # fmt: skip
        ctx.save_for_backward(x2, w, mean, rstd)
        ctx.pol, ctx.shape, ctx.bias, ctx.given = pol, x.shape, b_, given
        ctx.dims = (n, channels, spatial, groups)
        return launch.shaped(y, x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, w, mean, rstd = ctx.saved_tensors
        n, channels, spatial, groups = ctx.dims
        cpg, acc = channels // groups, mean.dtype
        want_dx = ctx.needs_input_grad[0]
        want_dw = w is not None and ctx.needs_input_grad[1]
        want_db = ctx.bias is not None and ctx.needs_input_grad[2]
        dy2 = launch.like_rows(dy, x2)
        # Per-(sample, channel) sums of dy * xhat and dy: dweight/dbias summed over the samples, and,
        # with the group's weights, the two means the dx of batch statistics needs.
        dw_sum = db_sum = mean
        if want_dw or want_db or (want_dx and not ctx.given):
            dw_sum = torch.empty(n * channels, dtype=acc, device=x2.device)
            db_sum = torch.empty(n * channels, dtype=acc, device=x2.device)
            b = blocks.forward(n * channels, spatial, ctx.pol, wide=acc == torch.float64)
            launcher.launch(
                channel_sums, b.programs,
                x2, dy2, mean, rstd, dw_sum, db_sum, n * channels, spatial, cpg,
                ACC=tl_dtype(acc), **tile_options(b),
            )  # fmt: skip
        dx = None
        if want_dx:
            dx = torch.empty_like(x2)
            (n_rows, n_cols) = x2.shape
            b = blocks.forward(n_rows, n_cols, ctx.pol, wide=acc == torch.float64)
            launcher.launch(
                group_norm_dx, b.programs,
                x2, x2 if w is None else w, dy2, mean, rstd, dw_sum, db_sum, dx,
                n_rows, n_cols, spatial, cpg, groups,
                HAS_W=w is not None, GIVEN_STATS=ctx.given, ACC=tl_dtype(acc), **tile_options(b),
            )  # fmt: skip
            dx = launch.shaped(dx, ctx.shape)
        dw, db = launch.sums(
            ((want_dw, dw_sum.view(n, channels), w), (want_db, db_sum.view(n, channels), ctx.bias)), ctx.pol
        )
        return (dx, dw, db) + (None,) * 7


def layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float,
    pol: blocks.Policy | None = None,
) -> torch.Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims (biased variance, eps inside the root).
    Under ``torch.compile``: the ``normconf::layer_norm`` operator (ops.py), with the device's policy."""
    if torch.compiler.is_compiling():
        return ops.layer_norm_y(x, normalized_shape, weight, bias, eps)
    # Function.apply is untyped in torch's stubs; the annotation states what it returns.
    out: torch.Tensor = launch.apply(
        _LayerNorm, x, weight, bias, tuple(normalized_shape), eps, pol or policy()
    )
    return out


def rms_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    *,
    eps: float,
    weight_offset: float = 0.0,
    pol: blocks.Policy | None = None,
) -> torch.Tensor:
    """RMSNorm with scale ``weight_offset + weight`` (Gemma: 1.0) and eps inside the root. Under
    ``torch.compile``: the ``normconf::rms_norm`` operator (ops.py), with the device's policy."""
    if torch.compiler.is_compiling():
        return ops.rms_norm_y(x, normalized_shape, weight, eps, weight_offset)
    args = (x, weight, tuple(normalized_shape), eps, weight_offset, pol or policy())
    out: torch.Tensor = launch.apply(_RMSNorm, *args)
    return out


def _check_params(x: torch.Tensor, *params: torch.Tensor | None) -> None:
    for p in params:
        if p is not None and (p.shape != (x.shape[1],) or not p.is_contiguous()):
            raise ValueError(
                f"per-channel tensors must be contiguous of shape ({x.shape[1]},): got {p.shape}"
            )


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float,
    pol: blocks.Policy | None = None,
) -> torch.Tensor:
    """GroupNorm of x (N, C, spatial...): per sample, ``num_groups`` groups of C/num_groups channels
    normalized with their mean and biased variance (eps inside the root), then per-channel affine."""
    if x.ndim < 2 or num_groups < 1 or x.shape[1] % num_groups:
        raise ValueError(
            f"num_groups={num_groups} must divide C of x (N, C, spatial...): got {tuple(x.shape)}"
        )
    _check_params(x, weight, bias)
    args = (x, weight, bias, None, None, num_groups, True, 0.0, eps, pol or policy())
    out: torch.Tensor = launch.apply(_GroupNorm, *args)
    return out


def instance_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    running_mean: torch.Tensor | None = None,
    running_var: torch.Tensor | None = None,
    *,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float,
    pol: blocks.Policy | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.instance_norm``'s contract: each (sample, channel) of x (N, C, spatial...)
    normalized over its spatial values; with ``use_input_stats=False`` by the running statistics instead.
    With input statistics and running statistics given, these are updated in place:
    ``running = (1 - momentum) * running + momentum * batch`` with the batch average of the instance
    means and of the unbiased instance variances."""
    if x.ndim < 3:
        raise ValueError(f"x must be (N, C, spatial...) for instance_norm: got {tuple(x.shape)}")
    if use_input_stats and math.prod(x.shape[2:]) < 2:
        raise ValueError(f"instance statistics need more than one spatial value: got {tuple(x.shape)}")
    if (running_mean is None) != (running_var is None) or (not use_input_stats and running_mean is None):
        raise ValueError("running_mean and running_var come together, and use_input_stats=False needs them")
    _check_params(x, weight, bias, running_mean, running_var)
    out: torch.Tensor = launch.apply(
        _GroupNorm,
        x,
        weight,
        bias,
        running_mean,
        running_var,
        x.shape[1],
        use_input_stats,
        momentum,
        eps,
        pol or policy(),
    )
    return out
