"""LayerNorm kernels, optionally fused with the residual add (add_layer_norm): forward (y, mean, rstd;
residual_out) and backward (dx; dresidual; per-program dweight/dbias partials).

Statistics accumulate in ACC (float32, or float64 when an operand is float64); two-pass variance;
eps inside the root; masked lanes (past the row end, past the last row) never enter a sum. The residual
stream's conventions (what is stored, what is normalized, dL/dh) are in common.py.
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
def _affine(y, W, B, cols, col_ok, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACC: tl.constexpr):
    """y * w + b on one chunk: y [BLOCK_M, BLOCK_N], cols and col_ok [BLOCK_N]."""
    if HAS_W:
        y = y * load_param(W, cols, col_ok, ACC)
    if HAS_B:
        y = y + load_param(B, cols, col_ok, ACC)
    return y


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def layer_norm_fwd(
    X,  # [n_rows, n_cols] activations, row-major
    RES,  # [n_rows, n_cols] residual, stream dtype (read only if HAS_RES)
    W,  # [n_cols] weight, param dtype (read only if HAS_W)
    B,  # [n_cols] bias, param dtype (read only if HAS_B)
    SCALARS,  # [2] ACC: eps, unused (a tensor so float64 runs get eps unrounded)
    Y,  # [n_rows, n_cols] output, activation dtype (may be X itself: see common.norm_input)
    RES_OUT,  # [n_rows, n_cols] output h = x + residual, stream dtype (written only if HAS_RES; may be RES)
    MEAN,  # [n_rows] ACC, saved for the backward (written only if SAVE_STATS)
    RSTD,  # [n_rows] ACC, saved for the backward (written only if SAVE_STATS)
    n_rows,  # M: rows (every leading dim flattened)
    n_cols,  # N: normalized elements per row (every trailing normalized dim flattened)
    HAS_RES: tl.constexpr,
    EXACT: tl.constexpr,  # normalize the ACC sum, not residual_out as stored
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    SAVE_STATS: tl.constexpr,  # a backward will read mean and rstd (else nothing is allocated for them)
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
        mean = add_up(x, 1) / n_cols  # masked lanes read 0: they add nothing
        xc = tl.where(ok, x - mean[:, None], 0.0)  # but x - mean is not 0 there: keep them out
        var = add_up(xc * xc, 1) / n_cols
        rstd = rsqrt(var + eps, ACC)
        y = _affine(xc * rstd[:, None], W, B, lanes, col_ok, HAS_W, HAS_B, ACC)
        tl.store(Y + base + lanes[None, :], round_to(y, Y.dtype.element_ty), mask=ok)
    else:
        # Each pass re-reads x (and the residual: the sum is formed again, the same bits each time);
        # only the last writes, so the kernel also runs in place.
        total = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + lanes
            ok = row_ok[:, None] & (cols < n_cols)[None, :]
            total += norm_input(X, RES, RES_OUT, base + cols[None, :], ok, HAS_RES, EXACT, False, ACC)
        mean = add_up(total, 1) / n_cols
        squares = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
        for start in range(0, n_cols, BLOCK_N):  # second pass over x: two-pass variance
            cols = start + lanes
            ok = row_ok[:, None] & (cols < n_cols)[None, :]
            x = norm_input(X, RES, RES_OUT, base + cols[None, :], ok, HAS_RES, EXACT, False, ACC)
            xc = tl.where(ok, x - mean[:, None], 0.0)
            squares += xc * xc
        var = add_up(squares, 1) / n_cols
        rstd = rsqrt(var + eps, ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + lanes
            col_ok = cols < n_cols
            ok = row_ok[:, None] & col_ok[None, :]
            x = norm_input(X, RES, RES_OUT, base + cols[None, :], ok, HAS_RES, EXACT, True, ACC)
            xc = x - mean[:, None]
            y = _affine(xc * rstd[:, None], W, B, cols, col_ok, HAS_W, HAS_B, ACC)
            tl.store(Y + base + cols[None, :], round_to(y, Y.dtype.element_ty), mask=ok)
    if SAVE_STATS:
        tl.store(MEAN + rows, mean, mask=row_ok)
        tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _chunk(
    H, RES, W, DY, base, cols, n_cols, row_ok, mean, rstd, SUM: tl.constexpr, HAS_W: tl.constexpr,
    ACC: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_M, BLOCK_N] chunk of the backward: (ok, xhat, dy, g = dy * w), 0 on masked lanes."""
    col_ok = cols < n_cols
    ok = row_ok[:, None] & col_ok[None, :]
    offsets = base + cols[None, :]
    xhat = tl.where(ok, (saved_input(H, RES, offsets, ok, SUM, ACC) - mean[:, None]) * rstd[:, None], 0.0)
    dy = load_tile(DY, offsets, ok, ACC)
    g = dy
    if HAS_W:
        g = dy * load_param(W, cols, col_ok, ACC)
    return ok, xhat, dy, g


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def layer_norm_bwd(
    H,  # [n_rows, n_cols] the normalized input: x, residual_out (add, rounded), or x (add, exact: + RES)
    RES,  # [n_rows, n_cols] residual, stream dtype (read only if SUM)
    W,  # [n_cols] weight, param dtype (read only if HAS_W)
    DY,  # [n_rows, n_cols] upstream gradient of y, activation dtype
    DRES_OUT,  # [n_rows, n_cols] upstream gradient of residual_out, stream dtype (read only if HAS_DRES_OUT)
    MEAN,  # [n_rows] ACC, from the forward
    RSTD,  # [n_rows] ACC, from the forward
    DX,  # [n_rows, n_cols] output: dL/dx (for the add op dL/dh), activation dtype
    DRES,  # [n_rows, n_cols] output: dL/dresidual = dL/dh, stream dtype (written only if OWN_DRES)
    DW_PART,  # [programs, n_cols] ACC, uninitialized: row p = this program's sum of dy * xhat
    DB_PART,  # [programs, n_cols] ACC, uninitialized: row p = this program's sum of dy
    n_rows,  # M
    n_cols,  # N
    SUM: tl.constexpr,  # the normalized input is H + RES (the exact sum, not saved)
    HAS_DRES_OUT: tl.constexpr,
    OWN_DRES: tl.constexpr,  # dresidual has its own dtype, so its own buffer
    HAS_W: tl.constexpr,
    WANT_DW: tl.constexpr,
    WANT_DB: tl.constexpr,
    ACC: tl.constexpr,  # tl.float32 or tl.float64
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,  # columns per chunk, a power of two
    ONE_CHUNK: tl.constexpr,  # n_cols <= BLOCK_N
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    part = pid.to(tl.int64) * n_cols  # this program's row of the partial buffers
    dw = tl.full([BLOCK_N], 0.0, ACC)
    db = tl.full([BLOCK_N], 0.0, ACC)
    # Program p takes tiles p, p + programs, ...: a fixed assignment, so the partial sums (and the
    # second reduction over them) add in the same order on every run.
    for tile in range(pid, (n_rows + BLOCK_M - 1) // BLOCK_M, programs):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
        row_ok = rows < n_rows
        base = rows.to(tl.int64)[:, None] * n_cols  # [BLOCK_M, 1]
        mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        if ONE_CHUNK:
            ok, xhat, dy, g = _chunk(H, RES, W, DY, base, lanes, n_cols, row_ok, mean, rstd, SUM, HAS_W, ACC)
            c1 = add_up(xhat * g, 1) / n_cols
            c2 = add_up(g, 1) / n_cols
            dx = (g - c2[:, None] - xhat * c1[:, None]) * rstd[:, None]
            offsets = base + lanes[None, :]
            store_grads(DX, DRES_OUT, DRES, offsets, ok, dx, HAS_DRES_OUT, OWN_DRES, ACC)
            if WANT_DW:
                dw += add_up(dy * xhat, 0)
            if WANT_DB:
                db += add_up(dy, 0)
        else:
            s1 = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
            s2 = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
            for start in range(0, n_cols, BLOCK_N):
                ok, xhat, dy, g = _chunk(
                    H, RES, W, DY, base, start + lanes, n_cols, row_ok, mean, rstd, SUM, HAS_W, ACC
                )
                s1 += xhat * g
                s2 += g
            c1 = add_up(s1, 1) / n_cols
            c2 = add_up(s2, 1) / n_cols
            for start in range(0, n_cols, BLOCK_N):
                cols = start + lanes
                ok, xhat, dy, g = _chunk(
                    H, RES, W, DY, base, cols, n_cols, row_ok, mean, rstd, SUM, HAS_W, ACC
                )
                dx = (g - c2[:, None] - xhat * c1[:, None]) * rstd[:, None]
                store_grads(DX, DRES_OUT, DRES, base + cols[None, :], ok, dx, HAS_DRES_OUT, OWN_DRES, ACC)
                col_ok = cols < n_cols
                # The program's first tile (tile == pid) starts its row: nothing to read yet (a vector
                # mask: the interpreter cannot combine a scalar condition into one).
                read = col_ok & (cols * 0 + tile != pid)
                if WANT_DW:
                    acc = tl.load(DW_PART + part + cols, mask=read, other=0.0)
                    tl.store(DW_PART + part + cols, acc + add_up(dy * xhat, 0), mask=col_ok)
                if WANT_DB:
                    acc = tl.load(DB_PART + part + cols, mask=read, other=0.0)
                    tl.store(DB_PART + part + cols, acc + add_up(dy, 0), mask=col_ok)
            # The next tile re-reads this program's partial row, possibly from other threads.
            tl.debug_barrier()
    if ONE_CHUNK:
        if WANT_DW:
            tl.store(DW_PART + part + lanes, dw, mask=lanes < n_cols)
        if WANT_DB:
            tl.store(DB_PART + part + lanes, db, mask=lanes < n_cols)
