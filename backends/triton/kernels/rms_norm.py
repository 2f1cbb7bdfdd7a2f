"""RMSNorm kernels, optionally fused with the residual add (add_rms_norm): forward and backward.

y = h * rstd * (offset + w), rstd = rsqrt(mean(h^2) + eps), h = x or the sum x + residual (stored as
residual_out in the stream's dtype; normalized as stored, or unrounded: common.py). Statistics
accumulate in ACC; masked lanes read 0 and add 0.
"""

from __future__ import annotations

from backends.triton.kernels import mode

mode.require_selected()

import triton  # noqa: E402  (after the mode check: the interpreter must be chosen first)
import triton.language as tl  # noqa: E402

from backends.triton.kernels.common import (  # noqa: E402
    add_up,
    load_param,
    load_tile,
    norm_input,
    round_to,
    rsqrt,
    saved_input,
    store_grads,
)


@triton.jit
def _scale(W, SCALARS, cols, col_ok, ACC: tl.constexpr):
    """offset + w for one chunk ([1, BLOCK_N]); Gemma stores w and scales by 1 + w."""
    return tl.load(SCALARS + 1) + load_param(W, cols, col_ok, ACC)


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def rms_norm_fwd(
    X,  # [n_rows, n_cols] activations, row-major
    RES,  # [n_rows, n_cols] residual, stream dtype (read only if HAS_RES)
    W,  # [n_cols] weight, param dtype (read only if HAS_W)
    SCALARS,  # [2] ACC: eps, weight offset (a tensor so float64 runs get them unrounded)
    Y,  # [n_rows, n_cols] output, activation dtype (may be X itself: see common.norm_input)
    RES_OUT,  # [n_rows, n_cols] output h = x + residual, stream dtype (written only if HAS_RES; may be RES)
    RSTD,  # [n_rows] ACC, saved for the backward (written only if SAVE_STATS)
    n_rows,  # M: rows (every leading dim flattened)
    n_cols,  # N: normalized elements per row
    HAS_RES: tl.constexpr,
    EXACT: tl.constexpr,  # normalize the ACC sum, not residual_out as stored
    HAS_W: tl.constexpr,
    SAVE_STATS: tl.constexpr,  # a backward will read rstd (else nothing is allocated for it)
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
        x = norm_input(X, RES, RES_OUT, base + lanes[None, :], ok, HAS_RES, EXACT, True, ACC)
        rstd = rsqrt(add_up(x * x, 1) / n_cols + eps, ACC)  # masked lanes are 0
        y = x * rstd[:, None]
        if HAS_W:
            y = y * _scale(W, SCALARS, lanes, col_ok, ACC)
        tl.store(Y + base + lanes[None, :], round_to(y, Y.dtype.element_ty), mask=ok)
    else:
        # The second pass forms the sum again from x and the residual (the same bits) and is the only
        # one that writes, so the kernel also runs in place.
        squares = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + lanes
            ok = row_ok[:, None] & (cols < n_cols)[None, :]
            x = norm_input(X, RES, RES_OUT, base + cols[None, :], ok, HAS_RES, EXACT, False, ACC)
            squares += x * x
        rstd = rsqrt(add_up(squares, 1) / n_cols + eps, ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + lanes
            col_ok = cols < n_cols
            ok = row_ok[:, None] & col_ok[None, :]
            x = norm_input(X, RES, RES_OUT, base + cols[None, :], ok, HAS_RES, EXACT, True, ACC)
            y = x * rstd[:, None]
            if HAS_W:
                y = y * _scale(W, SCALARS, cols, col_ok, ACC)
            tl.store(Y + base + cols[None, :], round_to(y, Y.dtype.element_ty), mask=ok)
    if SAVE_STATS:
        tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _chunk(
    H, RES, W, SCALARS, DY, base, cols, n_cols, row_ok, rstd, SUM: tl.constexpr, HAS_W: tl.constexpr,
    ACC: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_M, BLOCK_N] chunk of the backward: (ok, xhat, dy, g = dy * (offset + w)), 0 when masked."""
    col_ok = cols < n_cols
    ok = row_ok[:, None] & col_ok[None, :]
    offsets = base + cols[None, :]
    xhat = saved_input(H, RES, offsets, ok, SUM, ACC) * rstd[:, None]
    dy = load_tile(DY, offsets, ok, ACC)
    g = dy
    if HAS_W:
        g = dy * _scale(W, SCALARS, cols, col_ok, ACC)
    return ok, xhat, dy, g


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def rms_norm_bwd(
    H,  # [n_rows, n_cols] the normalized input: x, residual_out (add, rounded), or x (add, exact: + RES)
    RES,  # [n_rows, n_cols] residual, stream dtype (read only if SUM)
    W,  # [n_cols] weight, param dtype (read only if HAS_W)
    SCALARS,  # [2] ACC: eps, weight offset
    DY,  # [n_rows, n_cols] upstream gradient of y, activation dtype
    DRES_OUT,  # [n_rows, n_cols] upstream gradient of residual_out, stream dtype (read only if HAS_DRES_OUT)
    RSTD,  # [n_rows] ACC, from the forward
    DX,  # [n_rows, n_cols] output: dL/dx (for the add op dL/dh), activation dtype
    DRES,  # [n_rows, n_cols] output: dL/dresidual = dL/dh, stream dtype (written only if OWN_DRES)
    DW_PART,  # [programs, n_cols] ACC, uninitialized: row p = this program's sum of dy * xhat
    n_rows,  # M
    n_cols,  # N
    SUM: tl.constexpr,  # the normalized input is H + RES (the exact sum, not saved)
    HAS_DRES_OUT: tl.constexpr,
    OWN_DRES: tl.constexpr,  # dresidual has its own dtype, so its own buffer
    HAS_W: tl.constexpr,
    WANT_DW: tl.constexpr,
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
            ok, xhat, dy, g = _chunk(
                H, RES, W, SCALARS, DY, base, lanes, n_cols, row_ok, rstd, SUM, HAS_W, ACC
            )
            c1 = add_up(xhat * g, 1) / n_cols
            dx = (g - xhat * c1[:, None]) * rstd[:, None]
            store_grads(DX, DRES_OUT, DRES, base + lanes[None, :], ok, dx, HAS_DRES_OUT, OWN_DRES, ACC)
            if WANT_DW:
                dw += add_up(dy * xhat, 0)
        else:
            s1 = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
            for start in range(0, n_cols, BLOCK_N):
                ok, xhat, dy, g = _chunk(
                    H, RES, W, SCALARS, DY, base, start + lanes, n_cols, row_ok, rstd, SUM, HAS_W, ACC
                )
                s1 += xhat * g
            c1 = add_up(s1, 1) / n_cols
            for start in range(0, n_cols, BLOCK_N):
                cols = start + lanes
                ok, xhat, dy, g = _chunk(
                    H, RES, W, SCALARS, DY, base, cols, n_cols, row_ok, rstd, SUM, HAS_W, ACC
                )
                dx = (g - xhat * c1[:, None]) * rstd[:, None]
                store_grads(DX, DRES_OUT, DRES, base + cols[None, :], ok, dx, HAS_DRES_OUT, OWN_DRES, ACC)
                if WANT_DW:
                    # The program's first tile (tile == pid) starts its row: nothing to read yet (a
                    # vector mask: the interpreter cannot combine a scalar condition into one).
                    col_ok = cols < n_cols
                    read = col_ok & (cols * 0 + tile != pid)
                    acc = tl.load(DW_PART + part + cols, mask=read, other=0.0)
                    tl.store(DW_PART + part + cols, acc + add_up(dy * xhat, 0), mask=col_ok)
            # The next tile re-reads this program's partial row, possibly from other threads.
            tl.debug_barrier()
    if ONE_CHUNK and WANT_DW:
        tl.store(DW_PART + part + lanes, dw, mask=lanes < n_cols)
