"""GroupNorm / InstanceNorm kernels: forward (y, per-group mean and rstd), the backward's per-channel
sums and dx, and InstanceNorm's running-statistics update.

x is (N, C, spatial...) and C-contiguous, so the C/G channels of one group and their S spatial values
are one contiguous run of L = C/G * S values, a *group row*: the forward and dx kernels tile group rows
as the LayerNorm kernels tile rows, and the element at column j of group row r belongs to channel
(r % G) * C/G + j // S, which picks its weight and bias. The parameter gradients are sums per channel,
so the channel-sum kernel tiles *channel rows* (N * C rows of S values) instead and writes one sum per
(sample, channel); a fixed-order column sum over the samples turns them into dweight/dbias (no atomics).

Statistics accumulate in ACC (float32, or float64 when an operand is float64): half inputs are upcast
as they are loaded. Two-pass variance; eps inside the root; masked lanes never enter a sum.
InstanceNorm is the G = C case; with running statistics in eval, the given statistics replace the
computed ones (a per-channel affine).
"""

# Kernel bodies are Triton's DSL and stay unannotated, with the settings pyproject.toml gives the other
# kernel modules (an annotation on a kernel parameter changes how Triton specializes it).

from __future__ import annotations

from backends.triton.kernels import mode

mode.require_selected()

import triton  # noqa: E402  (after the mode check: the interpreter must be chosen first)
import triton.language as tl  # noqa: E402

from backends.triton.kernels.common import add_up, load_tile, round_to, rsqrt  # noqa: E402


@triton.jit
def _channels(rows, cols, groups, cpg, spatial):
    """The channel of each element of a [BLOCK_M, BLOCK_N] chunk of group rows."""
    return (rows % groups)[:, None] * cpg + cols[None, :] // spatial


@triton.jit
def _affine(y, W, B, ch, ok, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACC: tl.constexpr):
    """y * w[ch] + b[ch] on one chunk: every element gathers its own channel's parameters."""
    if HAS_W:
        y = y * tl.load(W + ch, mask=ok, other=0.0).to(ACC)
    if HAS_B:
        y = y + tl.load(B + ch, mask=ok, other=0.0).to(ACC)
    return y


@triton.jit
def _given(RM, RV, eps, rows, row_ok, groups, ACC: tl.constexpr):
    """(mean, rstd) of each group row from running statistics; only InstanceNorm has them, where
    G = C and group row r is channel r % C."""
    ch = rows % groups
    mean = tl.load(RM + ch, mask=row_ok, other=0.0).to(ACC)
    return mean, rsqrt(tl.load(RV + ch, mask=row_ok, other=1.0).to(ACC) + eps, ACC)


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def group_norm_fwd(
    X,  # [n_rows, n_cols] activations: x (N, C, S) viewed as group rows
    W,  # [C] weight, param dtype (read only if HAS_W)
    B,  # [C] bias, param dtype (read only if HAS_B)
    RM,  # [C] running mean (read only if GIVEN_STATS)
    RV,  # [C] running variance (read only if GIVEN_STATS)
    SCALARS,  # [2] ACC: eps, momentum factor (a tensor so float64 runs get them unrounded)
    Y,  # [n_rows, n_cols] output, activation dtype
    MEAN,  # [n_rows] ACC, saved for the backward
    RSTD,  # [n_rows] ACC, saved for the backward
    VAR,  # [n_rows] ACC: unbiased variance of each group row (written only if SAVE_VAR)
    n_rows,  # N * G
    n_cols,  # L = C/G * S
    spatial,  # S: values per channel
    cpg,  # C/G: channels per group
    groups,  # G
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    GIVEN_STATS: tl.constexpr,  # normalize with RM/RV instead of the rows' own statistics
    SAVE_VAR: tl.constexpr,  # the running update needs the unbiased variance
    ACC: tl.constexpr,  # tl.float32 or tl.float64
    BLOCK_M: tl.constexpr,  # group rows per program
    BLOCK_N: tl.constexpr,  # columns per chunk, a power of two
    ONE_CHUNK: tl.constexpr,  # n_cols <= BLOCK_N: the row tile stays in registers
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    row_ok = rows < n_rows
    base = rows.to(tl.int64)[:, None] * n_cols  # [BLOCK_M, 1]
    lanes = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    eps = tl.load(SCALARS)
    if ONE_CHUNK:
        ok = row_ok[:, None] & (lanes < n_cols)[None, :]
        x = load_tile(X, base + lanes[None, :], ok, ACC)
        if GIVEN_STATS:
            mean, rstd = _given(RM, RV, eps, rows, row_ok, groups, ACC)
            xc = x - mean[:, None]
        else:
            mean = add_up(x, 1) / n_cols  # masked lanes read 0: they add nothing
            xc = tl.where(ok, x - mean[:, None], 0.0)  # but x - mean is not 0 there: keep them out
            squares = add_up(xc * xc, 1)
            rstd = rsqrt(squares / n_cols + eps, ACC)
            if SAVE_VAR:
                tl.store(VAR + rows, squares / (n_cols - 1), mask=row_ok)
        ch = _channels(rows, lanes, groups, cpg, spatial)
        y = _affine(xc * rstd[:, None], W, B, ch, ok, HAS_W, HAS_B, ACC)
        tl.store(Y + base + lanes[None, :], round_to(y, Y.dtype.element_ty), mask=ok)
    else:
        if GIVEN_STATS:
            mean, rstd = _given(RM, RV, eps, rows, row_ok, groups, ACC)
        else:
            total = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
            for start in range(0, n_cols, BLOCK_N):
                cols = start + lanes
                ok = row_ok[:, None] & (cols < n_cols)[None, :]
                total += load_tile(X, base + cols[None, :], ok, ACC)
            mean = add_up(total, 1) / n_cols
            acc = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
            for start in range(0, n_cols, BLOCK_N):  # second pass over x: two-pass variance
                cols = start + lanes
                ok = row_ok[:, None] & (cols < n_cols)[None, :]
                xc = tl.where(ok, load_tile(X, base + cols[None, :], ok, ACC) - mean[:, None], 0.0)
                acc += xc * xc
            squares = add_up(acc, 1)
            rstd = rsqrt(squares / n_cols + eps, ACC)
            if SAVE_VAR:
                tl.store(VAR + rows, squares / (n_cols - 1), mask=row_ok)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + lanes
            ok = row_ok[:, None] & (cols < n_cols)[None, :]
            xc = load_tile(X, base + cols[None, :], ok, ACC) - mean[:, None]
            ch = _channels(rows, cols, groups, cpg, spatial)
            y = _affine(xc * rstd[:, None], W, B, ch, ok, HAS_W, HAS_B, ACC)
            tl.store(Y + base + cols[None, :], round_to(y, Y.dtype.element_ty), mask=ok)
    tl.store(MEAN + rows, mean, mask=row_ok)
    tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def channel_sums(
    X,  # [n_rows, spatial] activations: x (N, C, S) viewed as channel rows
    DY,  # [n_rows, spatial] upstream gradient, activation dtype
    MEAN,  # [N * G] ACC, from the forward
    RSTD,  # [N * G] ACC, from the forward
    DW_SUM,  # [n_rows] ACC output: sum over the channel row of dy * xhat
    DB_SUM,  # [n_rows] ACC output: sum over the channel row of dy
    n_rows,  # N * C
    spatial,  # S
    cpg,  # C/G: channel row r lies in group row r // cpg
    ACC: tl.constexpr,  # tl.float32 or tl.float64
    BLOCK_M: tl.constexpr,  # channel rows per program
    BLOCK_N: tl.constexpr,  # spatial values per chunk, a power of two
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    row_ok = rows < n_rows
    base = rows.to(tl.int64)[:, None] * spatial  # [BLOCK_M, 1]
    lanes = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    mean = tl.load(MEAN + rows // cpg, mask=row_ok, other=0.0)[:, None]
    rstd = tl.load(RSTD + rows // cpg, mask=row_ok, other=0.0)[:, None]
    s_w = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
    s_b = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
    # Each program owns whole channel rows: every sum is one program's, in one order, on every run.
    for start in range(0, spatial, BLOCK_N):
        cols = start + lanes
        ok = row_ok[:, None] & (cols < spatial)[None, :]
        dy = load_tile(DY, base + cols[None, :], ok, ACC)  # 0 on masked lanes: they add nothing
        s_w += dy * ((load_tile(X, base + cols[None, :], ok, ACC) - mean) * rstd)
        s_b += dy
    tl.store(DW_SUM + rows, add_up(s_w, 1), mask=row_ok)
    tl.store(DB_SUM + rows, add_up(s_b, 1), mask=row_ok)


@triton.jit(do_not_specialize=["n_rows"])  # it only bounds loops and masks: no variants
def group_norm_dx(
    X,  # [n_rows, n_cols] activations as group rows
    W,  # [C] weight, param dtype (read only if HAS_W)
    DY,  # [n_rows, n_cols] upstream gradient, activation dtype
    MEAN,  # [n_rows] ACC, from the forward
    RSTD,  # [n_rows] ACC, from the forward
    DW_SUM,  # [n_rows, cpg] ACC, from channel_sums (read unless GIVEN_STATS)
    DB_SUM,  # [n_rows, cpg] ACC, from channel_sums (read unless GIVEN_STATS)
    DX,  # [n_rows, n_cols] output, activation dtype
    n_rows,  # N * G
    n_cols,  # L = C/G * S
    spatial,  # S
    cpg,  # C/G
    groups,  # G
    HAS_W: tl.constexpr,
    GIVEN_STATS: tl.constexpr,  # the statistics were constants: dx = dy * w * rstd
    ACC: tl.constexpr,  # tl.float32 or tl.float64
    BLOCK_M: tl.constexpr,  # group rows per program
    BLOCK_N: tl.constexpr,  # columns per chunk, a power of two
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    row_ok = rows < n_rows
    base = rows.to(tl.int64)[:, None] * n_cols  # [BLOCK_M, 1]
    lanes = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
    if not GIVEN_STATS:
        # c1 = mean over the group of g * xhat, c2 = mean of g (g = dy * w): the group's channel sums
        # weighted by their channel's weight. Group row r's channels are entries r * cpg + k.
        s1 = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
        s2 = tl.full([BLOCK_M, BLOCK_N], 0.0, ACC)
        for start in range(0, cpg, BLOCK_N):
            k = start + lanes
            ok = row_ok[:, None] & (k < cpg)[None, :]
            sums = rows.to(tl.int64)[:, None] * cpg + k[None, :]
            s_w = tl.load(DW_SUM + sums, mask=ok, other=0.0)
            s_b = tl.load(DB_SUM + sums, mask=ok, other=0.0)
            if HAS_W:
                w = tl.load(W + (rows % groups)[:, None] * cpg + k[None, :], mask=ok, other=0.0).to(ACC)
                s_w = s_w * w
                s_b = s_b * w
            s1 += s_w
            s2 += s_b
        c1 = (add_up(s1, 1) / n_cols)[:, None]
        c2 = (add_up(s2, 1) / n_cols)[:, None]
    for start in range(0, n_cols, BLOCK_N):
        cols = start + lanes
        ok = row_ok[:, None] & (cols < n_cols)[None, :]
        g = load_tile(DY, base + cols[None, :], ok, ACC)
        if HAS_W:
            ch = _channels(rows, cols, groups, cpg, spatial)
            g = g * tl.load(W + ch, mask=ok, other=0.0).to(ACC)
        if GIVEN_STATS:
            dx = g * rstd[:, None]
        else:
            xhat = (load_tile(X, base + cols[None, :], ok, ACC) - mean[:, None]) * rstd[:, None]
            dx = (g - c2 - xhat * c1) * rstd[:, None]
        tl.store(DX + base + cols[None, :], round_to(dx, DX.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["n_samples"])  # it only bounds the loop: no variants
def running_update(
    MEAN,  # [n_samples, channels] ACC: instance means, from the forward
    VAR,  # [n_samples, channels] ACC: unbiased instance variances, from the forward
    SCALARS,  # [2] ACC: eps (unused), momentum factor m
    RM,  # [channels] running mean, param dtype: read, then overwritten with the update
    RV,  # [channels] running variance, param dtype: read, then overwritten with the update
    n_samples,  # N
    channels,  # C
    ACC: tl.constexpr,  # tl.float32 or tl.float64
    BLOCK_N: tl.constexpr,  # channels per program
):
    """running = (1 - m) * running + m * (batch average of the instance statistics), PyTorch's
    convention. Each lane owns one channel and adds the samples in order: same bits every run."""
    ch = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    ok = ch < channels
    s_mean = tl.full([BLOCK_N], 0.0, ACC)
    s_var = tl.full([BLOCK_N], 0.0, ACC)
    for n in range(0, n_samples):
        at = n * channels + ch
        s_mean += tl.load(MEAN + at, mask=ok, other=0.0)
        s_var += tl.load(VAR + at, mask=ok, other=0.0)
    m = tl.load(SCALARS + 1)
    # Each lane reads its own channel before writing it: the in-place update is race free.
    mean = (1.0 - m) * tl.load(RM + ch, mask=ok, other=0.0).to(ACC) + m * (s_mean / n_samples)
    var = (1.0 - m) * tl.load(RV + ch, mask=ok, other=0.0).to(ACC) + m * (s_var / n_samples)
    tl.store(RM + ch, round_to(mean, RM.dtype.element_ty), mask=ok)
    tl.store(RV + ch, round_to(var, RV.dtype.element_ty), mask=ok)
