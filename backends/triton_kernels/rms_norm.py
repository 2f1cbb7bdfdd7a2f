"""RMSNorm kernels, optionally fused with the residual add (add_rms_norm): forward and backward.

y = h * rstd * (offset + w), rstd = rsqrt(mean(h^2) + eps), h = x or round(x + residual) (stored as
residual_out, and normalized as stored). Statistics accumulate in ACC; masked lanes read 0 and add 0.
"""

from __future__ import annotations

from backends.triton_kernels import mode

mode.require_selected()

import triton  # noqa: E402  (after the mode check: the interpreter must be chosen first)
import triton.language as tl  # noqa: E402

from backends.triton_kernels.common import add_up, load_param, load_tile, round_to, rsqrt  # noqa: E402


@triton.jit
def _input(X, RES, RES_OUT, offsets, ok, HAS_RES: tl.constexpr, ACC: tl.constexpr):
    """The normalized input of one [BLOCK_M, BLOCK_N] chunk (``offsets`` and ``ok`` have that shape):
    x, or h = x + residual rounded to the activation dtype and stored as residual_out (the residual
    stream keeps that dtype; the oracle normalizes the stored h)."""
    x = load_tile(X, offsets, ok, ACC)
    if HAS_RES:
        h = round_to(x + load_tile(RES, offsets, ok, ACC), RES_OUT.dtype.element_ty)
        tl.store(RES_OUT + offsets, h, mask=ok)
        x = h.to(ACC)
    return x


@triton.jit
def _scale(W, SCALARS, cols, col_ok, ACC: tl.constexpr):
    """offset + w for one chunk ([1, BLOCK_N]); Gemma stores w and scales by 1 + w."""
    return tl.load(SCALARS + 1) + load_param(W, cols, col_ok, ACC)


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def rms_norm_fwd(
    X,  # [n_rows, n_cols] activations, row-major
    RES,  # [n_rows, n_cols] residual, activation dtype (read only if HAS_RES)
    W,  # [n_cols] weight, param dtype (read only if HAS_W)
    SCALARS,  # [2] ACC: eps, weight offset (a tensor so float64 runs get them unrounded)
    Y,  # [n_rows, n_cols] output, activation dtype
    RES_OUT,  # [n_rows, n_cols] output h = x + residual, activation dtype (written only if HAS_RES)
    RSTD,  # [n_rows] ACC, saved for the backward
    n_rows,  # M: rows (every leading dim flattened)
    n_cols,  # N: normalized elements per row
    HAS_RES: tl.constexpr,
    HAS_W: tl.constexpr,
    ACC: tl.constexpr,  # tl.float32 or tl.float64
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # columns per chunk, a power of two
    ONE_CHUNK: tl.constexpr,  # n_cols <= BLOCK_N: the row tile stays in registers
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    row_ok = rows < n_rows
    base = rows.to(tl.int64)[:, None] * n_cols  # [BLOCK_M, 1]
    lanes = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    eps = tl.load(SCALARS)
    if ONE_CHUNK:
        col_ok = lanes < n_cols
        ok = row_ok[:, None] & col_ok[None, :]
        x = _input(X, RES, RES_OUT, base + lanes[None, :], ok, HAS_RES, ACC)
        rstd = rsqrt(add_up(x * x, 1) / n_cols + eps, ACC)  # masked lanes are 0
        y = x * rstd[:, None]
        if HAS_W:
            y = y * _scale(W, SCALARS, lanes, col_ok, ACC)
        tl.store(Y + base + lanes[None, :], round_to(y, Y.dtype.element_ty), mask=ok)
    else:
        squares = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + lanes
            ok = row_ok[:, None] & (cols < n_cols)[None, :]
            x = _input(X, RES, RES_OUT, base + cols[None, :], ok, HAS_RES, ACC)
            squares += x * x
        rstd = rsqrt(add_up(squares, 1) / n_cols + eps, ACC)
        if HAS_RES:
            # The second pass reads h back from residual_out, written by other threads of this program.
            tl.debug_barrier()
        for start in range(0, n_cols, BLOCK_N):
            cols = start + lanes
            col_ok = cols < n_cols
            ok = row_ok[:, None] & col_ok[None, :]
            if HAS_RES:
                x = load_tile(RES_OUT, base + cols[None, :], ok, ACC)
            else:
                x = load_tile(X, base + cols[None, :], ok, ACC)
            y = x * rstd[:, None]
            if HAS_W:
                y = y * _scale(W, SCALARS, cols, col_ok, ACC)
            tl.store(Y + base + cols[None, :], round_to(y, Y.dtype.element_ty), mask=ok)
    tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _chunk(H, W, SCALARS, DY, base, cols, n_cols, row_ok, rstd, HAS_W: tl.constexpr, ACC: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] chunk of the backward: (ok, xhat, dy, g = dy * (offset + w)), 0 when masked."""
    col_ok = cols < n_cols
    ok = row_ok[:, None] & col_ok[None, :]
    offsets = base + cols[None, :]
    xhat = load_tile(H, offsets, ok, ACC) * rstd[:, None]
    dy = load_tile(DY, offsets, ok, ACC)
    g = dy
    if HAS_W:
        g = dy * _scale(W, SCALARS, cols, col_ok, ACC)
    return ok, xhat, dy, g


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def rms_norm_bwd(
    H,  # [n_rows, n_cols] the normalized input: x, or residual_out for add_rms_norm
    W,  # [n_cols] weight, param dtype (read only if HAS_W)
    SCALARS,  # [2] ACC: eps, weight offset
    DY,  # [n_rows, n_cols] upstream gradient of y, activation dtype
    DRES,  # [n_rows, n_cols] upstream gradient of residual_out (read only if HAS_DRES)
    RSTD,  # [n_rows] ACC, from the forward
    DX,  # [n_rows, n_cols] output: dL/dh (= dL/dx = dL/dresidual for add_rms_norm), activation dtype
    DW_PART,  # [programs, n_cols] ACC, zeroed: row p = this program's sum of dy * xhat
    n_rows,  # M
    n_cols,  # N
    HAS_W: tl.constexpr,
    WANT_DW: tl.constexpr,
    HAS_DRES: tl.constexpr,
    ACC: tl.constexpr,  # tl.float32 or tl.float64
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,  # columns per chunk, a power of two
    ONE_CHUNK: tl.constexpr,  # n_cols <= BLOCK_N
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    part = pid.to(tl.int64) * n_cols  # this program's row of the partial buffer
    dw = tl.full([BLOCK_N], 0.0, ACC)
    # Program p takes tiles p, p + programs, ...: a fixed assignment, so dweight adds in one order.
    for tile in range(pid, (n_rows + BLOCK_M - 1) // BLOCK_M, programs):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
        row_ok = rows < n_rows
        base = rows.to(tl.int64)[:, None] * n_cols  # [BLOCK_M, 1]
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        if ONE_CHUNK:
            ok, xhat, dy, g = _chunk(H, W, SCALARS, DY, base, lanes, n_cols, row_ok, rstd, HAS_W, ACC)
            c1 = add_up(xhat * g, 1) / n_cols
            dx = (g - xhat * c1[:, None]) * rstd[:, None]
            if HAS_DRES:
                dx += load_tile(DRES, base + lanes[None, :], ok, ACC)
            tl.store(DX + base + lanes[None, :], round_to(dx, DX.dtype.element_ty), mask=ok)
            if WANT_DW:
                dw += add_up(dy * xhat, 0)
        else:
            s1 = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
            for start in range(0, n_cols, BLOCK_N):
                ok, xhat, dy, g = _chunk(
                    H, W, SCALARS, DY, base, start + lanes, n_cols, row_ok, rstd, HAS_W, ACC
                )
                s1 += xhat * g
            c1 = add_up(s1, 1) / n_cols
            for start in range(0, n_cols, BLOCK_N):
                cols = start + lanes
                ok, xhat, dy, g = _chunk(H, W, SCALARS, DY, base, cols, n_cols, row_ok, rstd, HAS_W, ACC)
                dx = (g - xhat * c1[:, None]) * rstd[:, None]
                if HAS_DRES:
                    dx += load_tile(DRES, base + cols[None, :], ok, ACC)
                tl.store(DX + base + cols[None, :], round_to(dx, DX.dtype.element_ty), mask=ok)
                if WANT_DW:
                    col_ok = cols < n_cols
                    acc = tl.load(DW_PART + part + cols, mask=col_ok, other=0.0)
                    tl.store(DW_PART + part + cols, acc + add_up(dy * xhat, 0), mask=col_ok)
            # The next tile re-reads this program's partial row, possibly from other threads.
            tl.debug_barrier()
    if ONE_CHUNK and WANT_DW:
        tl.store(DW_PART + part + lanes, dw, mask=lanes < n_cols)
