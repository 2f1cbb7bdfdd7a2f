"""Deliberately broken Triton kernels that the ahead-of-time check must fail, beside a sound twin it
must pass. Imported only in a process that chose ``mode.compile_only()``
(tests/backends/triton/test_triton_aot.py runs them in a subprocess), so the kernels are decorated for a GPU.

- ``row_scale``: a sound row kernel: 128-bit row loads and stores, few registers.
- ``row_scale_unspecialized``: the same body with ``do_not_specialize=["n_cols"]`` (a common way to
  avoid recompiles): Triton no longer knows rows start 16-byte aligned and loads element by element.
- ``row_scale_spilling``: a 16384-element row held by one warp across its own reduction: 512 live
  float32 values per thread on NVIDIA, beyond the 255 registers a thread may have; on AMD 256 a lane,
  and their exponentials, beyond its 512.
- ``tile_dot_staged``: a pipelined 256 x 256 x 128 half-precision matmul with 4 stages: ~512 KiB of
  shared memory a block, beyond any target's limit.
- ``not_a_kernel``: ``tl.dot`` of 1-D tensors, which no backend compiles.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from backends.triton.kernels.aot import build
from backends.triton.kernels.aot.launches import Arg, Launch


@triton.jit
def _row(X, n_cols, BLOCK_N: tl.constexpr):
    """(the row's offsets, its mask, x upcast): the row this program takes."""
    lanes = tl.arange(0, BLOCK_N)
    base = tl.program_id(0).to(tl.int64) * n_cols
    ok = lanes < n_cols
    return base + lanes, ok, tl.load(X + base + lanes, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def row_scale(X, Y, n_rows, n_cols, BLOCK_N: tl.constexpr):
    offsets, ok, x = _row(X, n_cols, BLOCK_N)
    tl.store(Y + offsets, (x * 2.0).to(Y.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["n_cols"])
def row_scale_unspecialized(X, Y, n_rows, n_cols, BLOCK_N: tl.constexpr):
    offsets, ok, x = _row(X, n_cols, BLOCK_N)
    tl.store(Y + offsets, (x * 2.0).to(Y.dtype.element_ty), mask=ok)


@triton.jit
def row_scale_spilling(X, Y, n_rows, n_cols, BLOCK_N: tl.constexpr):
    offsets, ok, x = _row(X, n_cols, BLOCK_N)
    # Every x stays live across the reduction: BLOCK_N / 32 values per thread of one NVIDIA warp.
    y = tl.exp(x) / tl.reduce(tl.exp(x), 0, _add) * tl.sqrt(x * x + 1.0)
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def tile_dot_staged(A, B, C, K, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(A + rows[:, None] * K + (k + ks)[None, :])
        b = tl.load(B + (k + ks)[:, None] * BLOCK + rows[None, :])
        acc += tl.dot(a, b)
    tl.store(C + rows[:, None] * BLOCK + rows[None, :], acc)


@triton.jit
def not_a_kernel(X, BLOCK: tl.constexpr):
    x = tl.load(X + tl.arange(0, BLOCK))
    tl.store(X + tl.arange(0, BLOCK), tl.dot(x, x))


for _name in ("row_scale", "row_scale_unspecialized", "row_scale_spilling"):
    build.register_row_kernel(_name, "n_cols", __name__)


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> Arg:
    return Arg(torch.empty(shape, dtype=dtype, device="meta"))


def _launch(kernel: Any, args: tuple[Any, ...], **kwargs: Any) -> Launch:
    return Launch(kernel, args, kwargs, 1, f"fake {kernel.__name__}", False)


ROWS = (_meta(4, 4096), _meta(4, 4096), 4, 4096)
LAUNCHES = {
    "row_scale": _launch(row_scale, ROWS, BLOCK_N=4096, num_warps=8),
    "row_scale_unspecialized": _launch(row_scale_unspecialized, ROWS, BLOCK_N=4096, num_warps=8),
    "row_scale_spilling": _launch(
        row_scale_spilling, (_meta(1, 16384), _meta(1, 16384), 1, 16384), BLOCK_N=16384, num_warps=1
    ),
    "tile_dot_staged": _launch(
        tile_dot_staged,
        (_meta(256, 1024, dtype=torch.float16), _meta(1024, 256, dtype=torch.float16), _meta(256, 256), 1024),
        BLOCK=256,
        BLOCK_K=128,
        num_warps=8,
        num_stages=4,
    ),
    "not_a_kernel": _launch(not_a_kernel, (_meta(64),), BLOCK=64, num_warps=1),
}
