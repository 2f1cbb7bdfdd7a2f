"""Device helpers shared by the kernels: the sum, rounding to the output dtype, rsqrt, loads."""

from __future__ import annotations

from backends.triton_kernels import mode

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
