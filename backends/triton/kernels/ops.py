"""The row kernels as PyTorch custom operators: ``torch.ops.normconf.{layer_norm, rms_norm, add_layer_norm,
add_rms_norm}`` and their ``*_backward``, with fake (meta) implementations and autograd.

``torch.compile(fullgraph=True)`` of a block that calls them traces each as one node, with no graph break,
and CUDA graphs capture them like any operator. The functions of functions.py and add_functions.py route
through them while ``torch.compiler.is_compiling()``; eagerly they keep their own thinner path (an
operator boundary costs host time on every call, docs/triton.md).

Registered with ``torch.library.custom_op`` rather than ``triton_op``: ``triton_op`` traces into the
kernels through ``wrap_triton``, which under the Triton interpreter (the CPU machines this package is
tested on) runs them on fake tensors and fails ``torch.library.opcheck``'s dispatch tests; an opaque
operator is checked the same way everywhere. The launch policy is the device's (``launch.policy()``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from backends.triton.kernels import mode

mode.require_selected()

import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from backends.triton.kernels import launch  # noqa: E402

# A tensor standing for an absent gradient in an operator's outputs (custom operators return tensors).
_NONE_SHAPE = (0,)


def _absent(like: Tensor) -> Tensor:
    return like.new_empty(_NONE_SHAPE)


def _stats(x: Tensor, n_rows: int, acc: torch.dtype) -> Tensor:
    return x.new_empty((n_rows,), dtype=acc)


def _rows(x: Tensor, normalized_shape: Sequence[int]) -> int:
    return x.numel() // max(math.prod(normalized_shape), 1)


# --------------------------------------------------------------------------------------------- RMSNorm


@torch.library.custom_op("normconf::rms_norm", mutates_args=())
def rms_norm(
    x: Tensor, weight: Tensor | None, normalized_shape: list[int], eps: float, weight_offset: float
) -> tuple[Tensor, Tensor]:
    """(y, rstd): RMSNorm with scale ``weight_offset + weight``, rstd per row in the accumulation dtype."""
    x2 = launch.rows(x, normalized_shape)
    w = None if weight is None else weight.contiguous()
    y = torch.empty_like(x2)
    rstd, _ = launch.saved(launch.rms_forward(x2, w, eps, weight_offset, launch.policy(), y))
    return y.view(x.shape), rstd


@rms_norm.register_fake
def _(x: Tensor, weight: Tensor | None, normalized_shape: list[int], eps: float, weight_offset: float) -> Any:
    return torch.empty_like(x), _stats(x, _rows(x, normalized_shape), launch.acc_dtype(x, weight))


@torch.library.custom_op("normconf::rms_norm_backward", mutates_args=())
def rms_norm_backward(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    rstd: Tensor,
    normalized_shape: list[int],
    eps: float,
    weight_offset: float,
    want_dweight: bool,
) -> tuple[Tensor, Tensor]:
    """(dx, dweight); dweight is an empty tensor unless wanted and there is a weight."""
    x2 = launch.rows(x, normalized_shape)
    w = None if weight is None else weight.contiguous()
    consts = launch.scalars(eps, weight_offset, rstd.dtype, x.device)
    dx = torch.empty_like(x2)
    dy2 = dy.reshape(x2.shape).contiguous()
    dw = launch.rms_backward(
        (x2, None), w, consts, rstd, dy2, launch.Grads(dx), want_dweight, launch.policy()
    )
    return dx.view(x.shape), _absent(x) if dw is None else dw


@rms_norm_backward.register_fake
def _(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    rstd: Tensor,
    normalized_shape: list[int],
    eps: float,
    weight_offset: float,
    want_dweight: bool,
) -> Any:
    dw = torch.empty_like(weight) if want_dweight and weight is not None else _absent(x)
    return torch.empty_like(x), dw


def _rms_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    x, weight, normalized_shape, eps, weight_offset = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.args = (list(normalized_shape), eps, weight_offset)


def _rms_backward(ctx: Any, dy: Tensor, _drstd: Tensor | None) -> tuple[Any, ...]:
    x, weight, rstd = ctx.saved_tensors
    want = weight is not None and ctx.needs_input_grad[1]
    dx, dw = torch.ops.normconf.rms_norm_backward(dy, x, weight, rstd, *ctx.args, want)
    return dx, dw if want else None, None, None, None


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


# ------------------------------------------------------------------------------------------- LayerNorm


@torch.library.custom_op("normconf::layer_norm", mutates_args=())
def layer_norm(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, normalized_shape: list[int], eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, mean, rstd): LayerNorm (biased variance, eps inside the root)."""
    x2 = launch.rows(x, normalized_shape)
    w = None if weight is None else weight.contiguous()
    b_ = None if bias is None else bias.contiguous()
    y = torch.empty_like(x2)
    mean, rstd = launch.saved(launch.layer_norm_forward(x2, w, b_, eps, launch.policy(), y))
    return y.view(x.shape), mean, rstd


@layer_norm.register_fake
def _(x: Tensor, weight: Tensor | None, bias: Tensor | None, normalized_shape: list[int], eps: float) -> Any:
    n_rows, acc = _rows(x, normalized_shape), launch.acc_dtype(x, weight, bias)
    return torch.empty_like(x), _stats(x, n_rows, acc), _stats(x, n_rows, acc)


@torch.library.custom_op("normconf::layer_norm_backward", mutates_args=())
def layer_norm_backward(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    normalized_shape: list[int],
    want_dweight: bool,
    want_dbias: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias); a parameter's gradient is an empty tensor unless wanted and present."""
    x2 = launch.rows(x, normalized_shape)
    w = None if weight is None else weight.contiguous()
    b_ = None if bias is None else bias.contiguous()
    dx = torch.empty_like(x2)
    dy2 = dy.reshape(x2.shape).contiguous()
    want = (want_dweight, want_dbias)
    dw, db = launch.layer_norm_backward(
        (x2, None), w, b_, (mean, rstd), dy2, launch.Grads(dx), want, launch.policy()
    )
    return dx.view(x.shape), _absent(x) if dw is None else dw, _absent(x) if db is None else db


@layer_norm_backward.register_fake
def _(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    normalized_shape: list[int],
    want_dweight: bool,
    want_dbias: bool,
) -> Any:
    dw = torch.empty_like(weight) if want_dweight and weight is not None else _absent(x)
    db = torch.empty_like(bias) if want_dbias and bias is not None else _absent(x)
    return torch.empty_like(x), dw, db


def _ln_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    x, weight, bias, normalized_shape, _eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.normalized_shape = list(normalized_shape)


def _ln_backward(ctx: Any, dy: Tensor, _dmean: Tensor | None, _drstd: Tensor | None) -> tuple[Any, ...]:
    x, weight, bias, mean, rstd = ctx.saved_tensors
    want_dw = weight is not None and ctx.needs_input_grad[1]
    want_db = bias is not None and ctx.needs_input_grad[2]
    dx, dw, db = torch.ops.normconf.layer_norm_backward(
        dy, x, weight, bias, mean, rstd, ctx.normalized_shape, want_dw, want_db
    )
    return dx, dw if want_dw else None, db if want_db else None, None, None


layer_norm.register_autograd(_ln_backward, setup_context=_ln_setup)


# --------------------------------------------------------------------------- the fused residual add ops


def _add_fake_grads(x: Tensor, residual: Tensor, want_dres: bool) -> tuple[Tensor, Tensor]:
    own = want_dres and residual.dtype != x.dtype
    return torch.empty_like(x), torch.empty_like(residual) if own else _absent(x)


@torch.library.custom_op("normconf::add_rms_norm", mutates_args=())
def add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor | None,
    normalized_shape: list[int],
    eps: float,
    weight_offset: float,
    exact: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, residual_out, rstd): h = x + residual stored in residual's dtype, RMSNorm of h as stored (or,
    ``exact``, of the unrounded sum)."""
    x2, res2 = launch.stream_rows(x, residual, normalized_shape)
    w = None if weight is None else weight.contiguous()
    y, stream = torch.empty_like(x2), launch.Stream(res2, torch.empty_like(res2), exact)
    rstd, _ = launch.saved(launch.rms_forward(x2, w, eps, weight_offset, launch.policy(), y, stream))
    return y.view(x.shape), stream.out.view(x.shape), rstd


@add_rms_norm.register_fake
def _(
    x: Tensor,
    residual: Tensor,
    weight: Tensor | None,
    normalized_shape: list[int],
    eps: float,
    weight_offset: float,
    exact: bool,
) -> Any:
    acc = launch.acc_dtype(x, weight, residual)
    return torch.empty_like(x), torch.empty_like(residual), _stats(x, _rows(x, normalized_shape), acc)


@torch.library.custom_op("normconf::add_rms_norm_backward", mutates_args=())
def add_rms_norm_backward(
    dy: Tensor | None,
    dres_out: Tensor | None,
    x: Tensor,
    residual: Tensor,
    residual_out: Tensor,
    weight: Tensor | None,
    rstd: Tensor,
    normalized_shape: list[int],
    eps: float,
    weight_offset: float,
    exact: bool,
    want_dweight: bool,
    want_dresidual: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dresidual, dweight): dresidual an empty tensor where it is dx itself (one dtype) or not
    wanted, dweight one unless wanted and present."""
    x2, res2 = launch.stream_rows(x, residual, normalized_shape)
    w = None if weight is None else weight.contiguous()
    saved = launch.saved_input(
        x2, launch.Stream(res2, launch.rows(residual_out, normalized_shape), exact), rstd.dtype
    )
    consts = launch.scalars(eps, weight_offset, rstd.dtype, x.device)
    grads = launch.add_grads(x2, x.dtype, residual.dtype, dres_out, want_dresidual)
    dy2 = launch.dy_rows(dy, x2, x.dtype)
    dw = launch.rms_backward(saved, w, consts, rstd, dy2, grads, want_dweight, launch.policy())
    dres = _absent(x) if grads.dres is None else grads.dres.view(x.shape)
    return grads.dx.view(x.shape), dres, _absent(x) if dw is None else dw


@add_rms_norm_backward.register_fake
def _(
    dy: Tensor | None,
    dres_out: Tensor | None,
    x: Tensor,
    residual: Tensor,
    residual_out: Tensor,
    weight: Tensor | None,
    rstd: Tensor,
    normalized_shape: list[int],
    eps: float,
    weight_offset: float,
    exact: bool,
    want_dweight: bool,
    want_dresidual: bool,
) -> Any:
    dw = torch.empty_like(weight) if want_dweight and weight is not None else _absent(x)
    return (*_add_fake_grads(x, residual, want_dresidual), dw)


def _add_rms_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    x, residual, weight, normalized_shape, eps, weight_offset, exact = inputs
    ctx.save_for_backward(x, residual, output[1], weight, output[2])
    ctx.args = (list(normalized_shape), eps, weight_offset, exact)


def _handed(ctx: Any, x: Tensor, residual: Tensor, dx: Tensor, dres: Tensor) -> tuple[Tensor, Tensor | None]:
    """(dx, dresidual): h = x + residual passes dL/dh to both, in each one's dtype (dresidual is dx itself
    with one dtype)."""
    if not ctx.needs_input_grad[1]:
        return dx, None
    return dx, dres if residual.dtype != x.dtype else dx


def _add_rms_backward(ctx: Any, dy: Tensor | None, dres_out: Tensor | None, _drstd: Any) -> tuple[Any, ...]:
    x, residual, residual_out, weight, rstd = ctx.saved_tensors
    want_dw = weight is not None and ctx.needs_input_grad[2]
    dx, dres, dw = torch.ops.normconf.add_rms_norm_backward(
        dy, dres_out, x, residual, residual_out, weight, rstd, *ctx.args, want_dw, ctx.needs_input_grad[1]
    )
    return (*_handed(ctx, x, residual, dx, dres), dw if want_dw else None, None, None, None, None)


add_rms_norm.register_autograd(_add_rms_backward, setup_context=_add_rms_setup)


@torch.library.custom_op("normconf::add_layer_norm", mutates_args=())
def add_layer_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    normalized_shape: list[int],
    eps: float,
    exact: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, residual_out, mean, rstd): LayerNorm of h = x + residual, as add_rms_norm."""
    x2, res2 = launch.stream_rows(x, residual, normalized_shape)
    w = None if weight is None else weight.contiguous()
    b_ = None if bias is None else bias.contiguous()
    y, stream = torch.empty_like(x2), launch.Stream(res2, torch.empty_like(res2), exact)
    mean, rstd = launch.saved(launch.layer_norm_forward(x2, w, b_, eps, launch.policy(), y, stream))
    return y.view(x.shape), stream.out.view(x.shape), mean, rstd


@add_layer_norm.register_fake
def _(
    x: Tensor,
    residual: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    normalized_shape: list[int],
    eps: float,
    exact: bool,
) -> Any:
    n_rows, acc = _rows(x, normalized_shape), launch.acc_dtype(x, weight, bias, residual)
    return torch.empty_like(x), torch.empty_like(residual), _stats(x, n_rows, acc), _stats(x, n_rows, acc)


@torch.library.custom_op("normconf::add_layer_norm_backward", mutates_args=())
def add_layer_norm_backward(
    dy: Tensor | None,
    dres_out: Tensor | None,
    x: Tensor,
    residual: Tensor,
    residual_out: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    normalized_shape: list[int],
    exact: bool,
    want_dweight: bool,
    want_dbias: bool,
    want_dresidual: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dresidual, dweight, dbias), absent ones as empty tensors (see add_rms_norm_backward)."""
    x2, res2 = launch.stream_rows(x, residual, normalized_shape)
    w = None if weight is None else weight.contiguous()
    b_ = None if bias is None else bias.contiguous()
    saved = launch.saved_input(
        x2, launch.Stream(res2, launch.rows(residual_out, normalized_shape), exact), rstd.dtype
    )
    grads = launch.add_grads(x2, x.dtype, residual.dtype, dres_out, want_dresidual)
    dy2, want = launch.dy_rows(dy, x2, x.dtype), (want_dweight, want_dbias)
    dw, db = launch.layer_norm_backward(saved, w, b_, (mean, rstd), dy2, grads, want, launch.policy())
    dres = _absent(x) if grads.dres is None else grads.dres.view(x.shape)
    return grads.dx.view(x.shape), dres, _absent(x) if dw is None else dw, _absent(x) if db is None else db


@add_layer_norm_backward.register_fake
def _(
    dy: Tensor | None,
    dres_out: Tensor | None,
    x: Tensor,
    residual: Tensor,
    residual_out: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    normalized_shape: list[int],
    exact: bool,
    want_dweight: bool,
    want_dbias: bool,
    want_dresidual: bool,
) -> Any:
    dw = torch.empty_like(weight) if want_dweight and weight is not None else _absent(x)
    db = torch.empty_like(bias) if want_dbias and bias is not None else _absent(x)
    return (*_add_fake_grads(x, residual, want_dresidual), dw, db)


def _add_ln_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    x, residual, weight, bias, normalized_shape, _eps, exact = inputs
    ctx.save_for_backward(x, residual, output[1], weight, bias, output[2], output[3])
    ctx.args = (list(normalized_shape), exact)


def _add_ln_backward(ctx: Any, dy: Tensor | None, dres_out: Tensor | None, *_stats: Any) -> tuple[Any, ...]:
    x, residual, residual_out, weight, bias, mean, rstd = ctx.saved_tensors
    want_dw = weight is not None and ctx.needs_input_grad[2]
    want_db = bias is not None and ctx.needs_input_grad[3]
    dx, dres, dw, db = torch.ops.normconf.add_layer_norm_backward(
        dy, dres_out, x, residual, residual_out, weight, bias, mean, rstd, *ctx.args,
        want_dw, want_db, ctx.needs_input_grad[1],
    )  # fmt: skip
    handed = _handed(ctx, x, residual, dx, dres)
    return (*handed, dw if want_dw else None, db if want_db else None, None, None, None)


add_layer_norm.register_autograd(_add_ln_backward, setup_context=_add_ln_setup)


# ------------------------------------------------------------------------------ what functions.py calls


def rms_norm_y(
    x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float, weight_offset: float
) -> Tensor:
    y: Tensor = torch.ops.normconf.rms_norm(x, weight, list(normalized_shape), eps, weight_offset)[0]
    return y


def layer_norm_y(
    x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    y: Tensor = torch.ops.normconf.layer_norm(x, weight, bias, list(normalized_shape), eps)[0]
    return y


def add_rms_norm_y(
    x: Tensor,
    residual: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    eps: float,
    weight_offset: float,
    exact: bool,
) -> tuple[Tensor, Tensor]:
    y, h, _ = torch.ops.normconf.add_rms_norm(
        x, residual, weight, list(normalized_shape), eps, weight_offset, exact
    )
    return y, h


def add_layer_norm_y(
    x: Tensor,
    residual: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    exact: bool,
) -> tuple[Tensor, Tensor]:
    y, h, _, _ = torch.ops.normconf.add_layer_norm(
        x, residual, weight, bias, list(normalized_shape), eps, exact
    )
    return y, h
