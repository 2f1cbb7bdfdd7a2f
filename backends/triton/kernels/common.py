"""Device helpers shared by the kernels: the sum, rounding to the output dtype, rsqrt, loads, and the
residual stream of the fused add kernels.

The stream: h = x + residual is formed in ACC (float32, or float64) from the upcast loads; residual_out
stores it rounded once to the stream's dtype (RES_OUT's: the activation dtype, or float32 for "residual
in fp32"); the norm reads that stored value (``norm_input`` "rounded") or the ACC sum ("exact", EXACT).
"""

from __future__ import annotations

from backends.triton.kernels import mode

mode.require_selected()

import triton  # noqa: E402  (after the mode check: the interpreter must be chosen first)
import triton.language as tl  # noqa: E402
from triton.language.standard import _sum_combine  # noqa: E402


@triton.jit
def add_up(x, AXIS: tl.constexpr):
    """``tl.sum(x, AXIS)`` for float tiles ([BLOCK_M, BLOCK_N] -> [BLOCK_N] or [BLOCK_M]).

    Interpreted kernels can only call functions decorated while TRITON_INTERPRET=1 was set, and
    ``tl.sum`` was decorated when Triton was first imported, which another library in the process
    (torch.export imports Triton) may have done before normconf could set it. ``tl.reduce`` is a
    builtin the interpreter replaces, and with Triton's own sum combiner it runs as ``np.sum``.
    """
    return tl.reduce(x, AXIS, _sum_combine)


@triton.jit
def round_to(v, DTYPE: tl.constexpr):
    """``v`` (float32 or float64 values) rounded to nearest-even in ``DTYPE``.

    bfloat16 is rounded by hand on the float32 bits: the Triton interpreter truncates float32 ->
    bfloat16 casts, which would add up to one bfloat16 ulp. On a GPU the result equals
    cvt.rn.bf16.f32, so both modes produce the same bits.
    """
    if DTYPE == tl.bfloat16:  # noqa: SIM300 (DTYPE is a kernel parameter, not a constant)
        bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
        # Add 0x7FFF plus the lowest kept bit, then drop 16 bits: round half to even.
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        # NaN stays a quiet NaN (the addition could carry a small payload into infinity).
        rounded = tl.where(v != v, 0x7FC0, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(DTYPE)


@triton.jit
def rsqrt(v, ACC: tl.constexpr):
    """1 / sqrt(v) in the accumulation dtype: the rsqrt instruction for float32; float64 has none, so
    it takes a correctly rounded sqrt and a division."""
    if ACC == tl.float64:  # noqa: SIM300 (ACC is a kernel parameter, not a constant)
        return 1.0 / tl.sqrt(v)
    else:
        return tl.math.rsqrt(v)


@triton.jit
def load_param(P, cols, col_ok, ACC: tl.constexpr):
    """A chunk of a per-column parameter (weight or bias), upcast: [BLOCK_N] -> [1, BLOCK_N]."""
    return tl.load(P + cols, mask=col_ok, other=0.0).to(ACC)[None, :]


@triton.jit
def load_tile(P, offsets, ok, ACC: tl.constexpr):
    """A [BLOCK_M, BLOCK_N] tile upcast to the accumulation dtype; masked lanes read as 0."""
    return tl.load(P + offsets, mask=ok, other=0.0).to(ACC)


# ----------------------------------------------------------------- the residual stream


@triton.jit
def norm_input(
    X, RES, RES_OUT, offsets, ok, HAS_RES: tl.constexpr, EXACT: tl.constexpr, STORE: tl.constexpr,
    ACC: tl.constexpr,
):  # fmt: skip
    """What the norm reads on one [BLOCK_M, BLOCK_N] tile (``offsets`` and ``ok`` have that shape), in ACC:
    x; or with HAS_RES the sum, rounded to the stream dtype as stored or (EXACT) not. STORE writes
    residual_out: only in a kernel's last pass over a row, so that every earlier pass can still read x and
    residual, and the kernel may run in place (residual_out into residual, y into x)."""
    x = load_tile(X, offsets, ok, ACC)
    if HAS_RES:
        total = x + load_tile(RES, offsets, ok, ACC)
        h = round_to(total, RES_OUT.dtype.element_ty)
        if STORE:
            tl.store(RES_OUT + offsets, h, mask=ok)
        x = total if EXACT else h.to(ACC)
    return x


@triton.jit
def saved_input(H, RES, offsets, ok, SUM: tl.constexpr, ACC: tl.constexpr):
    """The backward's normalized input on one tile, in ACC: H as saved (x, or residual_out when the
    norm read the stored sum), or with SUM the exact sum H + RES of the saved x and residual."""
    h = load_tile(H, offsets, ok, ACC)
    if SUM:
        h += load_tile(RES, offsets, ok, ACC)
    return h


@triton.jit
def store_grads(
    DX, DRES_OUT, DRES, offsets, ok, dh, HAS_DRES_OUT: tl.constexpr, OWN_DRES: tl.constexpr,
    ACC: tl.constexpr,
):  # fmt: skip
    """dL/dh = the norm's backward ``dh`` plus residual_out's own cotangent (HAS_DRES_OUT), stored as dx
    in x's dtype and, when the stream's dtype differs (OWN_DRES), as dresidual in the stream's. With one
    dtype dx and dresidual are the same values: the caller hands out one tensor for both."""
    if HAS_DRES_OUT:
        dh += load_tile(DRES_OUT, offsets, ok, ACC)
    tl.store(DX + offsets, round_to(dh, DX.dtype.element_ty), mask=ok)
    if OWN_DRES:
        tl.store(DRES + offsets, round_to(dh, DRES.dtype.element_ty), mask=ok)
