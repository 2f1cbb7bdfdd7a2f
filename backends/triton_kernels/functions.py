"""torch.autograd.Function wrappers and launchers: what the adapter (and any caller) uses.

Inputs of any shape: the trailing ``normalized_shape`` dims are one row of ``n_cols`` elements, the
leading dims are rows. Gradients come back in the dtype of the tensor they belong to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from backends.triton_kernels import blocks, mode

mode.require_selected()

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

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


def _scalars(eps: float, offset: float, acc: torch.dtype, device: torch.device) -> torch.Tensor:
    # A tensor, not kernel scalars: Triton passes Python floats as float32, and a float64 run needs
    # eps and the weight offset exactly as given.
    return torch.tensor([eps, offset], dtype=acc, device=device)


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
