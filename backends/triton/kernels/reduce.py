"""The second, deterministic reduction: per-program dweight/dbias partial rows summed in fixed order."""

from __future__ import annotations

from backends.triton.kernels import mode

mode.require_selected()

import triton  # noqa: E402  (after the mode check: the interpreter must be chosen first)
import triton.language as tl  # noqa: E402

from backends.triton.kernels.common import add_up, round_to  # noqa: E402


@triton.jit
def _total(PART, OUT, cols, col_ok, n_parts, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT[cols] = the sum over the partial rows of PART's columns ``cols``."""
    total = tl.full([BLOCK_M, BLOCK_N], 0.0, PART.dtype.element_ty)
    # Element-wise adds over the steps, then one tree sum: the order depends only on n_parts.
    for start in range(0, n_parts, BLOCK_M):
        parts = start + tl.arange(0, BLOCK_M)  # [BLOCK_M]
        ok = (parts < n_parts)[:, None] & col_ok[None, :]
        offsets = parts.to(tl.int64)[:, None] * n_cols + cols[None, :]  # a tile of partial rows
        total += tl.load(PART + offsets, mask=ok, other=0.0)
    tl.store(OUT + cols, round_to(add_up(total, 0), OUT.dtype.element_ty), mask=col_ok)


@triton.jit(do_not_specialize=["n_parts"])  # it only bounds loops and masks: no variants
def column_sum(
    PART,  # [n_parts, n_cols] ACC partial sums, one row per backward program
    OUT,  # [n_cols] output, param dtype
    PART2,  # [n_parts, n_cols] a second partial buffer, e.g. dbias beside dweight (read only if TWO)
    OUT2,  # [n_cols] its output (written only if TWO)
    n_parts,  # rows of PART (backward programs)
    n_cols,  # N
    TWO: tl.constexpr,  # reduce PART2 too: dweight and dbias in one launch
    BLOCK_M: tl.constexpr,  # partial rows per step
    BLOCK_N: tl.constexpr,  # columns per program
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    col_ok = cols < n_cols
    _total(PART, OUT, cols, col_ok, n_parts, n_cols, BLOCK_M, BLOCK_N)
    if TWO:
        _total(PART2, OUT2, cols, col_ok, n_parts, n_cols, BLOCK_M, BLOCK_N)
