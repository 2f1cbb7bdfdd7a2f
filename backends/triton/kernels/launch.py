"""Launch plumbing shared by the autograd wrappers: the launch policy, accumulation dtypes, rows,
the second reduction, and the row-norm kernels' launches (LayerNorm and RMSNorm, optionally with the
fused residual add).

The row launchers take [n_rows, n_cols] tensors and the output buffers they write, so the same launch
serves an out-of-place call and an in-place one (y into x, residual_out into residual).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends.triton.kernels import blocks, mode

mode.require_selected()

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from backends.triton.kernels.layer_norm import layer_norm_bwd, layer_norm_fwd  # noqa: E402
from backends.triton.kernels.reduce import column_sum  # noqa: E402
from backends.triton.kernels.rms_norm import rms_norm_bwd, rms_norm_fwd  # noqa: E402


def policy() -> blocks.Policy:
    """The launch policy of this machine: the interpreter's, or the current GPU's."""
    if mode.select().interpreted:
        return blocks.INTERPRETED
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    # ROCm builds of torch report HIP devices through torch.cuda too: the register bound is NVIDIA's.
    registers = blocks.NVIDIA_MAX_REGISTERS if torch.version.hip is None else None
    return blocks.native_policy(props.multi_processor_count, registers)


def acc_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """Statistics and accumulation in float32, or float64 when any operand is float64."""
    wide = any(t is not None and t.dtype == torch.float64 for t in tensors)
    return torch.float64 if wide else torch.float32


def tl_dtype(dtype: torch.dtype) -> Any:
    return tl.float64 if dtype == torch.float64 else tl.float32


def scalars(eps: float, second: float, acc: torch.dtype, device: torch.device) -> torch.Tensor:
    # A tensor, not kernel scalars: Triton passes Python floats as float32, and a float64 run needs
    # eps and the second scalar (RMSNorm's weight offset, InstanceNorm's momentum) exactly as given.
    return torch.tensor([eps, second], dtype=acc, device=device)


def rows(x: torch.Tensor, normalized_shape: Sequence[int]) -> torch.Tensor:
    """x as [n_rows, n_cols] (a view when x is contiguous, else a contiguous copy)."""
    n_cols = math.prod(normalized_shape)
    if tuple(x.shape[x.ndim - len(normalized_shape) :]) != tuple(normalized_shape):
        raise ValueError(
            f"x of shape {tuple(x.shape)} does not end in normalized_shape={tuple(normalized_shape)}"
        )
    return x.reshape(-1, n_cols).contiguous()


def reduce(part: torch.Tensor, like: torch.Tensor, pol: blocks.Policy) -> torch.Tensor:
    """Sum the partial rows [programs, n_cols] into a tensor shaped and typed like ``like``."""
    out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    b = blocks.column_sum(part.shape[0], part.shape[1], pol)
    column_sum[(b.programs,)](part, out, part.shape[0], part.shape[1], **tile_options(b))
    return out


def launch_options(b: blocks.Blocks) -> dict[str, Any]:
    return tile_options(b) | {"ONE_CHUNK": b.one_chunk}


def tile_options(b: blocks.Blocks) -> dict[str, Any]:
    """Launch options of the kernels that loop over every chunk whatever the row length."""
    return {"BLOCK_M": b.block_m, "BLOCK_N": b.block_n, **warp_options(b)}


def warp_options(b: blocks.Blocks) -> dict[str, Any]:
    """num_warps, and on NVIDIA the register bound (blocks.Policy.max_registers)."""
    if b.max_registers is None:
        return {"num_warps": b.warps}
    return {"num_warps": b.warps, "maxnreg": b.max_registers}


def partial(want: bool, b: blocks.Blocks, n_cols: int, acc: torch.dtype, dummy: torch.Tensor) -> torch.Tensor:
    # Zeroed: a multi-chunk program adds each tile into its row; the dummy is never touched.
    return torch.zeros((b.programs, n_cols), dtype=acc, device=dummy.device) if want else dummy


@dataclass(frozen=True)
class Stream:
    """The fused residual add of one forward launch, all [n_rows, n_cols]: ``residual`` in, ``out``
    (residual_out, in residual's dtype: it may be residual itself) written; ``exact``: the norm reads
    the unrounded sum rather than residual_out as stored."""

    residual: torch.Tensor
    out: torch.Tensor
    exact: bool = False


@dataclass(frozen=True)
class Grads:
    """Where a row backward writes dL/dx ([n_rows, n_cols]) and what the add ops add to it:
    residual_out's cotangent ``dres_out`` and a separate ``dres`` buffer when the stream's dtype differs
    from x's (with one dtype, dL/dresidual is dL/dx itself and the caller hands dx out twice)."""

    dx: torch.Tensor
    dres_out: torch.Tensor | None = None
    dres: torch.Tensor | None = None

    def kernel_args(self) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, bool]]:
        """(DX, DRES_OUT, DRES) pointers, dummies where absent, and the flags that say which are real."""
        dx, dres_out, dres = self.dx, self.dres_out, self.dres
        pointers = (dx, dx if dres_out is None else dres_out, dx if dres is None else dres)
        return pointers, {"HAS_DRES_OUT": self.dres_out is not None, "OWN_DRES": self.dres is not None}


def saved_input(
    x2: torch.Tensor, stream: Stream | None, acc: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(H, RES or None): what the backward reads as the normalized input. x; residual_out when the norm
    read it as stored, or when the stream's dtype is the accumulation dtype (then residual_out holds the
    kernel's unrounded sum bit for bit); otherwise x and residual, which the backward adds again."""
    if stream is None:
        return x2, None
    if not stream.exact or stream.out.dtype == acc:
        return stream.out, None
    return x2, stream.residual


def layer_norm_forward(
    x2: torch.Tensor,
    w: torch.Tensor | None,
    b_: torch.Tensor | None,
    eps: float,
    pol: blocks.Policy,
    y: torch.Tensor,
    stream: Stream | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Writes y (and the stream's residual_out); returns (mean, rstd) in the accumulation dtype."""
    (n_rows, n_cols), acc = x2.shape, acc_dtype(x2, w, b_, None if stream is None else stream.residual)
    mean = torch.empty(n_rows, dtype=acc, device=x2.device)
    rstd = torch.empty(n_rows, dtype=acc, device=x2.device)
    b = blocks.forward(n_rows, n_cols, pol, wide=acc == torch.float64)
    res, out = (x2, y) if stream is None else (stream.residual, stream.out)
    layer_norm_fwd[(b.programs,)](
        x2, res, x2 if w is None else w, x2 if b_ is None else b_, scalars(eps, 0.0, acc, x2.device),
        y, out, mean, rstd, n_rows, n_cols,
        HAS_RES=stream is not None, EXACT=stream is not None and stream.exact, HAS_W=w is not None,
        HAS_B=b_ is not None, ACC=tl_dtype(acc), **launch_options(b),
    )  # fmt: skip
    return mean, rstd


def layer_norm_backward(
    saved: tuple[torch.Tensor, torch.Tensor | None],
    w: torch.Tensor | None,
    bias: torch.Tensor | None,
    stats: tuple[torch.Tensor, torch.Tensor],
    dy: torch.Tensor,
    grads: Grads,
    want: tuple[bool, bool],
    pol: blocks.Policy,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Writes ``grads``; returns (dweight, dbias), each None unless ``want``-ed (and present)."""
    (h, res), (mean, rstd) = saved, stats
    n_rows, n_cols = h.shape
    want_dw, want_db = want[0] and w is not None, want[1] and bias is not None
    b = blocks.backward(n_rows, n_cols, pol, wide=mean.dtype == torch.float64)
    dw_part = partial(want_dw, b, n_cols, mean.dtype, mean)
    db_part = partial(want_db, b, n_cols, mean.dtype, mean)
    (dx, dres_out, dres), flags = grads.kernel_args()
    layer_norm_bwd[(b.programs,)](
        h, h if res is None else res, h if w is None else w, dy, dres_out, mean, rstd, dx, dres,
        dw_part, db_part, n_rows, n_cols,
        SUM=res is not None, **flags, HAS_W=w is not None, WANT_DW=want_dw, WANT_DB=want_db,
        ACC=tl_dtype(mean.dtype), **launch_options(b),
    )  # fmt: skip
    dw = reduce(dw_part, w, pol) if want_dw and w is not None else None
    db = reduce(db_part, bias, pol) if want_db and bias is not None else None
    return dw, db


def rms_forward(
    x2: torch.Tensor,
    w: torch.Tensor | None,
    eps: float,
    offset: float,
    pol: blocks.Policy,
    y: torch.Tensor,
    stream: Stream | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Writes y (and the stream's residual_out); returns (rstd, the scalars eps and offset) in the
    accumulation dtype."""
    (n_rows, n_cols), acc = x2.shape, acc_dtype(x2, w, None if stream is None else stream.residual)
    rstd = torch.empty(n_rows, dtype=acc, device=x2.device)
    consts = scalars(eps, offset, acc, x2.device)
    b = blocks.forward(n_rows, n_cols, pol, wide=acc == torch.float64)
    res, out = (x2, y) if stream is None else (stream.residual, stream.out)
    rms_norm_fwd[(b.programs,)](
        x2, res, x2 if w is None else w, consts, y, out, rstd, n_rows, n_cols,
        HAS_RES=stream is not None, EXACT=stream is not None and stream.exact, HAS_W=w is not None,
        ACC=tl_dtype(acc), **launch_options(b),
    )  # fmt: skip
    return rstd, consts


def rms_backward(
    saved: tuple[torch.Tensor, torch.Tensor | None],
    w: torch.Tensor | None,
    consts: torch.Tensor,
    rstd: torch.Tensor,
    dy: torch.Tensor,
    grads: Grads,
    want_dw: bool,
    pol: blocks.Policy,
) -> torch.Tensor | None:
    """Writes ``grads``; returns dweight when ``want_dw`` (and there is a weight), else None."""
    h, res = saved
    n_rows, n_cols = h.shape
    want_dw = want_dw and w is not None
    b = blocks.backward(n_rows, n_cols, pol, wide=rstd.dtype == torch.float64)
    dw_part = partial(want_dw, b, n_cols, rstd.dtype, rstd)
    (dx, dres_out, dres), flags = grads.kernel_args()
    rms_norm_bwd[(b.programs,)](
        h, h if res is None else res, h if w is None else w, consts, dy, dres_out, rstd, dx, dres,
        dw_part, n_rows, n_cols,
        SUM=res is not None, **flags, HAS_W=w is not None, WANT_DW=want_dw, ACC=tl_dtype(rstd.dtype),
        **launch_options(b),
    )  # fmt: skip
    return reduce(dw_part, w, pol) if want_dw and w is not None else None
