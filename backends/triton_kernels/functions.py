"""torch.autograd.Function wrappers and launchers: what the adapter (and any caller) uses.

LayerNorm / RMSNorm: inputs of any shape; the trailing ``normalized_shape`` dims are one row of
``n_cols`` elements, the leading dims are rows. GroupNorm / InstanceNorm: x is (N, C, spatial...) with
per-channel parameters. Gradients come back in the dtype of the tensor they belong to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from backends.triton_kernels import blocks, mode

mode.require_selected()

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from backends.triton_kernels.group_norm import (  # noqa: E402
    channel_sums,
    group_norm_dx,
    group_norm_fwd,
    running_update,
)
from backends.triton_kernels.layer_norm import layer_norm_bwd, layer_norm_fwd  # noqa: E402
from backends.triton_kernels.reduce import column_sum  # noqa: E402
from backends.triton_kernels.rms_norm import rms_norm_bwd, rms_norm_fwd  # noqa: E402


def policy() -> blocks.Policy:
    """The launch policy of this machine: the interpreter's, or the current GPU's."""
    if mode.select().interpreted:
        return blocks.INTERPRETED
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return blocks.native_policy(props.multi_processor_count)


def acc_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """Statistics and accumulation in float32, or float64 when any operand is float64."""
    wide = any(t is not None and t.dtype == torch.float64 for t in tensors)
    return torch.float64 if wide else torch.float32


def _tl(dtype: torch.dtype) -> Any:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _scalars(eps: float, second: float, acc: torch.dtype, device: torch.device) -> torch.Tensor:
    # A tensor, not kernel scalars: Triton passes Python floats as float32, and a float64 run needs
    # eps and the second scalar (RMSNorm's weight offset, InstanceNorm's momentum) exactly as given.
    return torch.tensor([eps, second], dtype=acc, device=device)


def _rows(x: torch.Tensor, normalized_shape: Sequence[int]) -> torch.Tensor:
    n_cols = math.prod(normalized_shape)
    if tuple(x.shape[x.ndim - len(normalized_shape) :]) != tuple(normalized_shape):
        raise ValueError(
            f"x of shape {tuple(x.shape)} does not end in normalized_shape={tuple(normalized_shape)}"
        )
    return x.reshape(-1, n_cols).contiguous()


def _reduce(part: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sum the partial rows [programs, n_cols] into a tensor shaped and typed like ``like``."""
    out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    b = blocks.column_sum(part.shape[0], part.shape[1])
    column_sum[(b.programs,)](
        part, out, part.shape[0], part.shape[1], BLOCK_M=b.block_m, BLOCK_N=b.block_n, num_warps=b.warps
    )
    return out


def _launch_options(b: blocks.Blocks) -> dict[str, Any]:
    return {"BLOCK_M": b.block_m, "BLOCK_N": b.block_n, "ONE_CHUNK": b.one_chunk, "num_warps": b.warps}


def _tile_options(b: blocks.Blocks) -> dict[str, Any]:
    """Launch options of the kernels that loop over every chunk whatever the row length."""
    return {"BLOCK_M": b.block_m, "BLOCK_N": b.block_n, "num_warps": b.warps}


def _partial(
    want: bool, b: blocks.Blocks, n_cols: int, acc: torch.dtype, dummy: torch.Tensor
) -> torch.Tensor:
    # Zeroed: a multi-chunk program adds each tile into its row; the dummy is never touched.
    return torch.zeros((b.programs, n_cols), dtype=acc, device=dummy.device) if want else dummy


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
        x2 = _rows(x, normalized_shape)
        (n_rows, n_cols), acc = x2.shape, acc_dtype(x, weight, bias)
        w = None if weight is None else weight.contiguous()
        b_ = None if bias is None else bias.contiguous()
        y = torch.empty_like(x2)
        mean = torch.empty(n_rows, dtype=acc, device=x.device)
        rstd = torch.empty(n_rows, dtype=acc, device=x.device)
        b = blocks.forward(n_rows, n_cols, pol)
        layer_norm_fwd[(b.programs,)](
            x2, x2 if w is None else w, x2 if b_ is None else b_, _scalars(eps, 0.0, acc, x.device),
            y, mean, rstd, n_rows, n_cols,
            HAS_W=w is not None, HAS_B=b_ is not None, ACC=_tl(acc), **_launch_options(b),
        )  # fmt: skip
        ctx.save_for_backward(x2, w, mean, rstd)
        ctx.pol, ctx.shape, ctx.bias = pol, x.shape, b_
        return y.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, w, mean, rstd = ctx.saved_tensors
        n_rows, n_cols = x2.shape
        want_dw = w is not None and ctx.needs_input_grad[1]
        want_db = ctx.bias is not None and ctx.needs_input_grad[2]
        b = blocks.backward(n_rows, n_cols, ctx.pol)
        dx = torch.empty_like(x2)
        dw_part = _partial(want_dw, b, n_cols, mean.dtype, mean)
        db_part = _partial(want_db, b, n_cols, mean.dtype, mean)
        layer_norm_bwd[(b.programs,)](
            x2, x2 if w is None else w, dy.reshape(x2.shape).contiguous(), mean, rstd, dx, dw_part, db_part,
            n_rows, n_cols,
            HAS_W=w is not None, WANT_DW=want_dw, WANT_DB=want_db, ACC=_tl(mean.dtype), **_launch_options(b),
        )  # fmt: skip
        dw = _reduce(dw_part, w) if want_dw else None
        db = _reduce(db_part, ctx.bias) if want_db else None
        return dx.view(ctx.shape), dw, db, None, None, None


def _rms_forward(
    x2: torch.Tensor,
    res2: torch.Tensor | None,
    w: torch.Tensor | None,
    eps: float,
    offset: float,
    pol: blocks.Policy,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(y, residual_out or None, rstd) of [n_rows, n_cols] rows."""
    (n_rows, n_cols), acc = x2.shape, acc_dtype(x2, w)
    y = torch.empty_like(x2)
    h = None if res2 is None else torch.empty_like(x2)
    rstd = torch.empty(n_rows, dtype=acc, device=x2.device)
    b = blocks.forward(n_rows, n_cols, pol)
    rms_norm_fwd[(b.programs,)](
        x2, x2 if res2 is None else res2, x2 if w is None else w, _scalars(eps, offset, acc, x2.device),
        y, y if h is None else h, rstd, n_rows, n_cols,
        HAS_RES=res2 is not None, HAS_W=w is not None, ACC=_tl(acc), **_launch_options(b),
    )  # fmt: skip
    return y, h, rstd


def _rms_backward(
    ctx: Any, dy: torch.Tensor | None, dres: torch.Tensor | None, want_dw: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dx as [n_rows, n_cols], dweight or None) from the saved (h, weight, scalars, rstd)."""
    h, w, scalars, rstd = ctx.saved_tensors
    n_rows, n_cols = h.shape
    dy2 = torch.zeros_like(h) if dy is None else dy.reshape(h.shape).contiguous()
    b = blocks.backward(n_rows, n_cols, ctx.pol)
    dx = torch.empty_like(h)
    dw_part = _partial(want_dw, b, n_cols, rstd.dtype, rstd)
    rms_norm_bwd[(b.programs,)](
        h, h if w is None else w, scalars, dy2, h if dres is None else dres.reshape(h.shape).contiguous(),
        rstd, dx, dw_part, n_rows, n_cols,
        HAS_W=w is not None, WANT_DW=want_dw, HAS_DRES=dres is not None, ACC=_tl(rstd.dtype),
        **_launch_options(b),
    )  # fmt: skip
    return dx, _reduce(dw_part, w) if want_dw else None


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
        x2 = _rows(x, normalized_shape)
        w = None if weight is None else weight.contiguous()
        y, _, rstd = _rms_forward(x2, None, w, eps, offset, pol)
        ctx.save_for_backward(x2, w, _scalars(eps, offset, rstd.dtype, x.device), rstd)
        ctx.pol, ctx.shape = pol, x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        want_dw = ctx.saved_tensors[1] is not None and ctx.needs_input_grad[1]
        dx, dw = _rms_backward(ctx, dy, None, want_dw)
        return dx.view(ctx.shape), dw, None, None, None, None


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor | None,
        normalized_shape: tuple[int, ...],
        eps: float,
        offset: float,
        pol: blocks.Policy,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(
                f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}"
            )
        x2, res2 = _rows(x, normalized_shape), _rows(residual, normalized_shape)
        w = None if weight is None else weight.contiguous()
        y, h, rstd = _rms_forward(x2, res2, w, eps, offset, pol)
        assert h is not None, "the fused forward writes residual_out"
        ctx.save_for_backward(h, w, _scalars(eps, offset, rstd.dtype, x.device), rstd)
        ctx.pol, ctx.shape = pol, x.shape
        # Without an upstream gradient for residual_out, backward gets None rather than zeros.
        ctx.set_materialize_grads(False)
        return y.view(x.shape), h.view(x.shape)

    @staticmethod
    def backward(
        ctx: Any, dy: torch.Tensor | None, dres: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        want_dw = ctx.saved_tensors[1] is not None and ctx.needs_input_grad[2]
        dx, dw = _rms_backward(ctx, dy, dres, want_dw)
        dh = dx.view(ctx.shape)
        # h = x + residual: x and residual receive the same gradient.
        return dh, dh, dw, None, None, None, None


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
        scalars = _scalars(eps, momentum, acc, x.device)
        rm = x2 if running_mean is None else running_mean
        rv = x2 if running_var is None else running_var
        b = blocks.forward(n_rows, n_cols, pol)
        group_norm_fwd[(b.programs,)](
            x2, x2 if w is None else w, x2 if b_ is None else b_, rm, rv, scalars, y, mean, rstd, var,
            n_rows, n_cols, spatial, cpg, groups,
            HAS_W=w is not None, HAS_B=b_ is not None, GIVEN_STATS=given, SAVE_VAR=update, ACC=_tl(acc),
            **_launch_options(b),
        )  # fmt: skip
        if update:
            # G = C here: the group rows are the (sample, channel) instances, [N, C] in memory.
            u = blocks.channels(channels)
            running_update[(u.programs,)](
                mean, var, scalars, rm, rv, n, channels, ACC=_tl(acc), BLOCK_N=u.block_n, num_warps=u.warps
            )
        ctx.save_for_backward(x2, w, mean, rstd)
        ctx.pol, ctx.shape, ctx.bias, ctx.given = pol, x.shape, b_, given
        ctx.dims = (n, channels, spatial, groups)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, w, mean, rstd = ctx.saved_tensors
        n, channels, spatial, groups = ctx.dims
        cpg, acc = channels // groups, mean.dtype
        want_dx = ctx.needs_input_grad[0]
        want_dw = w is not None and ctx.needs_input_grad[1]
        want_db = ctx.bias is not None and ctx.needs_input_grad[2]
        dy2 = dy.reshape(x2.shape).contiguous()
        # Per-(sample, channel) sums of dy * xhat and dy: dweight/dbias summed over the samples, and,
        # with the group's weights, the two means the dx of batch statistics needs.
        dw_sum = db_sum = mean
        if want_dw or want_db or (want_dx and not ctx.given):
            dw_sum = torch.empty(n * channels, dtype=acc, device=x2.device)
            db_sum = torch.empty(n * channels, dtype=acc, device=x2.device)
            b = blocks.forward(n * channels, spatial, ctx.pol)
            channel_sums[(b.programs,)](
                x2, dy2, mean, rstd, dw_sum, db_sum, n * channels, spatial, cpg,
                ACC=_tl(acc), **_tile_options(b),
            )  # fmt: skip
        dx = None
        if want_dx:
            dx = torch.empty_like(x2)
            (n_rows, n_cols) = x2.shape
            b = blocks.forward(n_rows, n_cols, ctx.pol)
            group_norm_dx[(b.programs,)](
                x2, x2 if w is None else w, dy2, mean, rstd, dw_sum, db_sum, dx,
                n_rows, n_cols, spatial, cpg, groups,
                HAS_W=w is not None, GIVEN_STATS=ctx.given, ACC=_tl(acc), **_tile_options(b),
            )  # fmt: skip
            dx = dx.view(ctx.shape)
        dw = _reduce(dw_sum.view(n, channels), w) if want_dw else None
        db = _reduce(db_sum.view(n, channels), ctx.bias) if want_db else None
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
    """LayerNorm over the trailing ``normalized_shape`` dims (biased variance, eps inside the root)."""
    # Function.apply is untyped in torch's stubs; the annotation states what it returns.
    apply: Any = _LayerNorm.apply
    out: torch.Tensor = apply(x, weight, bias, tuple(normalized_shape), eps, pol or policy())
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
    """RMSNorm with scale ``weight_offset + weight`` (Gemma: 1.0) and eps inside the root."""
    apply: Any = _RMSNorm.apply  # untyped in torch's stubs
    out: torch.Tensor = apply(x, weight, tuple(normalized_shape), eps, weight_offset, pol or policy())
    return out


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    *,
    eps: float,
    weight_offset: float = 0.0,
    pol: blocks.Policy | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(h), h) with h = x + residual rounded to x's dtype: the fused pre-norm residual step."""
    apply: Any = _AddRMSNorm.apply  # untyped in torch's stubs
    y, h = apply(x, residual, weight, tuple(normalized_shape), eps, weight_offset, pol or policy())
    return y, h


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
    apply: Any = _GroupNorm.apply  # untyped in torch's stubs
    out: torch.Tensor = apply(x, weight, bias, None, None, num_groups, True, 0.0, eps, pol or policy())
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
    apply: Any = _GroupNorm.apply  # untyped in torch's stubs
    out: torch.Tensor = apply(
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
