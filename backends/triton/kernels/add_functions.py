"""The fused residual add + norm ops: autograd wrappers, and in-place forms as production kernels do it.

``add_layer_norm`` / ``add_rms_norm`` return (y, residual_out): h = x + residual formed in float32
(float64 when an operand is), stored as residual_out in residual's dtype (the stream's: x's, or float32
for "residual in fp32"), and normalized as stored or, with ``exact=True``, unrounded. Backward through
both outputs: dL/dh = the norm's backward of dy plus residual_out's cotangent, handed to x (in x's
dtype) and to residual (in the stream's); with one dtype both get the same tensor, as autograd's own
add does. ``add_layer_norm_`` / ``add_rms_norm_`` write y into x and residual_out into residual
(vLLM's fused_add_rms_norm contract), forward only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.triton.kernels import blocks, mode

mode.require_selected()

import torch  # noqa: E402

from backends.triton.kernels import launch, ops  # noqa: E402


def _handed_out(ctx: Any, grads: launch.Grads) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dresidual) shaped like x: h = x + residual passes dL/dh to both unchanged."""
    dx = launch.shaped(grads.dx, ctx.shape)
    return dx, dx if grads.dres is None else launch.shaped(grads.dres, ctx.shape)


def _remember(ctx: Any, x: torch.Tensor, residual: torch.Tensor, pol: blocks.Policy) -> None:
    ctx.pol, ctx.shape, ctx.x_dtype, ctx.res_dtype = pol, x.shape, x.dtype, residual.dtype
    # Without an upstream gradient for one output, backward gets None rather than a zeros tensor.
    ctx.set_materialize_grads(False)


class _AddLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        normalized_shape: tuple[int, ...],
        eps: float,
        exact: bool,
        pol: blocks.Policy,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, res2 = launch.stream_rows(x, residual, normalized_shape)
        w = None if weight is None else weight.contiguous()
        b_ = None if bias is None else bias.contiguous()
        y, stream = torch.empty_like(x2), launch.Stream(res2, torch.empty_like(res2), exact)
        stats = launch.layer_norm_forward(x2, w, b_, eps, pol, y, stream, save=launch.tracked(ctx))
        if stats is not None:
            mean, rstd = stats
            h, res = launch.saved_input(x2, stream, mean.dtype)
            ctx.save_for_backward(h, res, w, b_, mean, rstd)
            _remember(ctx, x, residual, pol)
        return launch.shaped(y, x.shape), launch.shaped(stream.out, x.shape)

    @staticmethod
    def backward(
        ctx: Any, dy: torch.Tensor | None, dres_out: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        h, res, w, b_, mean, rstd = ctx.saved_tensors
        grads = launch.add_grads(h, ctx.x_dtype, ctx.res_dtype, dres_out, ctx.needs_input_grad[1])
        want = (ctx.needs_input_grad[2], ctx.needs_input_grad[3])
        dy2 = launch.dy_rows(dy, h, ctx.x_dtype)
        dw, db = launch.layer_norm_backward((h, res), w, b_, (mean, rstd), dy2, grads, want, ctx.pol)
        return (*_handed_out(ctx, grads), dw, db, None, None, None, None)


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
        exact: bool,
        pol: blocks.Policy,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, res2 = launch.stream_rows(x, residual, normalized_shape)
        w = None if weight is None else weight.contiguous()
        y, stream = torch.empty_like(x2), launch.Stream(res2, torch.empty_like(res2), exact)
        stats = launch.rms_forward(x2, w, eps, offset, pol, y, stream, save=launch.tracked(ctx))
        if stats is not None:
            rstd, consts = stats
            h, res = launch.saved_input(x2, stream, rstd.dtype)
            ctx.save_for_backward(h, res, w, consts, rstd)
            _remember(ctx, x, residual, pol)
        return launch.shaped(y, x.shape), launch.shaped(stream.out, x.shape)

    @staticmethod
    def backward(
        ctx: Any, dy: torch.Tensor | None, dres_out: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        h, res, w, consts, rstd = ctx.saved_tensors
        grads = launch.add_grads(h, ctx.x_dtype, ctx.res_dtype, dres_out, ctx.needs_input_grad[1])
        dy2 = launch.dy_rows(dy, h, ctx.x_dtype)
        dw = launch.rms_backward((h, res), w, consts, rstd, dy2, grads, ctx.needs_input_grad[2], ctx.pol)
        return (*_handed_out(ctx, grads), dw, None, None, None, None, None)


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float,
    exact: bool = False,
    pol: blocks.Policy | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(LayerNorm(h), h) with h = x + residual stored in residual's dtype; the norm reads h as stored,
    or with ``exact`` the unrounded sum. Under ``torch.compile``: the ``normconf::add_layer_norm``
    operator (ops.py), with the device's policy."""
    if torch.compiler.is_compiling():
        return ops.add_layer_norm_y(x, residual, normalized_shape, weight, bias, eps, exact)
    args = (x, residual, weight, bias, tuple(normalized_shape), eps, exact, pol or launch.policy())
    y, h = launch.apply(_AddLayerNorm, *args)
    return y, h


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    *,
    eps: float,
    weight_offset: float = 0.0,
    exact: bool = False,
    pol: blocks.Policy | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(h), h) with h = x + residual stored in residual's dtype, scale ``weight_offset + weight``;
    the norm reads h as stored, or with ``exact`` the unrounded sum: the fused pre-norm residual step.
    Under ``torch.compile``: the ``normconf::add_rms_norm`` operator (ops.py), with the device's policy."""
    if torch.compiler.is_compiling():
        return ops.add_rms_norm_y(x, residual, normalized_shape, weight, eps, weight_offset, exact)
    args = (x, residual, weight, tuple(normalized_shape), eps, weight_offset, exact, pol or launch.policy())
    y, h = launch.apply(_AddRMSNorm, *args)
    return y, h


def _in_place_rows(
    x: torch.Tensor, residual: torch.Tensor, normalized_shape: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """[n_rows, n_cols] views of the very buffers: a copy would leave the caller's tensors unwritten."""
    if not (x.is_contiguous() and residual.is_contiguous()):
        raise ValueError("in-place add + norm writes x and residual: both must be contiguous")
    x2, res2 = launch.stream_rows(x, residual, normalized_shape)
    assert x2.data_ptr() == x.data_ptr() and res2.data_ptr() == residual.data_ptr(), "views, not copies"
    return x2, res2


@torch.no_grad()
def add_layer_norm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float,
    exact: bool = False,
    pol: blocks.Policy | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """add_layer_norm in place: y written into x, residual_out into residual; returns (x, residual)."""
    x2, res2 = _in_place_rows(x, residual, normalized_shape)
    w = None if weight is None else weight.contiguous()
    b_ = None if bias is None else bias.contiguous()
    stream = launch.Stream(res2, res2, exact)
    launch.layer_norm_forward(x2, w, b_, eps, pol or launch.policy(), x2, stream, save=False)
    return x, residual


@torch.no_grad()
def add_rms_norm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    *,
    eps: float,
    weight_offset: float = 0.0,
    exact: bool = False,
    pol: blocks.Policy | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm in place, as vLLM's fused_add_rms_norm: y written into x, residual_out into
    residual; returns (x, residual)."""
    x2, res2 = _in_place_rows(x, residual, normalized_shape)
    w = None if weight is None else weight.contiguous()
    stream = launch.Stream(res2, res2, exact)
    launch.rms_forward(x2, w, eps, weight_offset, pol or launch.policy(), x2, stream, save=False)
    return x, residual
