"""Launch shapes: rows per program, column chunk, warps and grid size, chosen from the row length.

Pure Python (no Triton import), so the choices are unit-tested and recorded in each result's info.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

# One column chunk holds at most 4096 lanes. At 8 warps that is 16 float32 values per thread per live
# tile; the backward keeps x, dy, the weight and the dweight partial live at once, and wider chunks
# start to spill registers. Longer rows loop over chunks (two-pass statistics re-read x, from L2).
MAX_BLOCK_N = 4096


def _stable_hash(*values: int | None) -> int:
    """The hash a Policy or Blocks keeps: of integers only (None as -1), so that it is the same in every
    process and a pickled copy's kept hash stays right (None's hash is its address before Python 3.12)."""
    return hash(tuple(-1 if v is None else v for v in values))


@dataclass(frozen=True)
class Policy:
    """How launch shapes are chosen on one kind of machine."""

    max_block_n: int  # widest column chunk (a power of two)
    tile: int  # target elements per program tile: narrow rows are packed several to a program
    max_programs: int  # cap on the backward grid = rows of the dweight/dbias partial buffers
    # NVIDIA: the register bound every launch states (maxnreg): Triton 3.9 runs ptxas with
    # --regAllocOptLevel=2, which without a bound aims at full occupancy and spills a few registers of
    # the backward and GroupNorm kernels at 48 to 80 registers (the ahead-of-time check found 21 such
    # specializations, docs/triton.md); bounded by the per-thread maximum it allocates what a kernel
    # needs and none spills. None: no bound (AMD, the interpreter).
    max_registers: int | None = None
    # Half the tile and chunk when statistics accumulate in float64: two registers a value (on a GPU
    # the float64 backward at full tiles needs over 255 registers and spills; the interpreter keeps its
    # tiles, where only the number of steps costs).
    halve_wide: bool = False
    # Policies key the memoized launch shapes below, on every launch: hashed once, not per lookup.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_block_n < 1 or self.max_block_n & (self.max_block_n - 1):
            raise ValueError(f"max_block_n={self.max_block_n} is not allowed; allowed: a power of two")
        if self.tile < 1 or self.max_programs < 1:
            raise ValueError(f"tile={self.tile}, max_programs={self.max_programs}: both must be >= 1")
        fields = (self.max_block_n, self.tile, self.max_programs, self.max_registers, self.halve_wide)
        object.__setattr__(self, "_hash", _stable_hash(*fields))

    def __hash__(self) -> int:
        return self._hash


# Elements per program tile on a GPU for rows of up to 1024 (longer rows take one row per program, in
# chunks of up to MAX_BLOCK_N): 8 per thread at 8 warps, one or two 128-bit loads of each tile. Tiles of
# 4096 elements of narrow rows (16 x 256) took 152 to 254 registers in the backward (12.5% occupancy on
# every NVIDIA target) against 63 to 147 at 8 x 256 (the ahead-of-time check, docs/triton.md).
NATIVE_TILE = 2048
# The most registers one thread may use on NVIDIA GPUs: the bound the native launches state.
NVIDIA_MAX_REGISTERS = 255


def native_policy(multiprocessors: int, max_registers: int | None = None) -> Policy:
    """On a GPU: 2048-element tiles of rows up to 1024, one row per program beyond, keep each
    program's loads large enough to cover HBM latency; the backward grid is two programs per
    multiprocessor, enough to fill the GPU while the float32 partial buffer (programs x n_cols) stays
    a small fraction of the x/dy/dx traffic. ``max_registers``: NVIDIA_MAX_REGISTERS on NVIDIA GPUs."""
    return Policy(
        max_block_n=MAX_BLOCK_N,
        tile=NATIVE_TILE,
        max_programs=2 * max(multiprocessors, 1),
        max_registers=max_registers,
        halve_wide=True,
    )


# Under the interpreter every tl operation is one NumPy call per program, so the cost is the number of
# program x operation steps, not elements: tiles of 64 Ki elements pack 4096 rows of 64 into four
# programs. Eight backward programs keep the partial buffer small and still exercise the strided loop.
INTERPRETED = Policy(max_block_n=MAX_BLOCK_N, tile=1 << 16, max_programs=8)


@dataclass(frozen=True)
class Blocks:
    """One launch: a [block_m, block_n] tile per step, ``chunks`` column chunks per row."""

    block_m: int  # rows per tile
    block_n: int  # columns per chunk (a power of two >= the row when chunks == 1)
    chunks: int  # column chunks per row: 1 keeps the row tile in registers
    warps: int  # num_warps (ignored by the interpreter)
    programs: int  # grid size
    max_registers: int | None = None  # NVIDIA: maxnreg, the Policy's register bound
    # Blocks key the launch options (launch.launch_options), on every launch: hashed once.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = (self.block_m, self.block_n, self.chunks, self.warps, self.programs, self.max_registers)
        object.__setattr__(self, "_hash", _stable_hash(*fields))

    def __hash__(self) -> int:
        return self._hash

    @property
    def one_chunk(self) -> bool:
        return self.chunks == 1

    def info(self, prefix: str) -> dict[str, int]:
        out = {
            f"{prefix}_block_m": self.block_m,
            f"{prefix}_block_n": self.block_n,
            f"{prefix}_chunks": self.chunks,
            f"{prefix}_warps": self.warps,
            f"{prefix}_programs": self.programs,
        }
        if self.max_registers is not None:
            out[f"{prefix}_max_registers"] = self.max_registers
        return out


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def warps(elements: int) -> int:
    """256 elements per warp (8 per thread) gives enough independent loads in flight; 8 warps at most,
    so that two programs fit on one multiprocessor and hide each other's reductions."""
    return min(max(elements // 256, 1), 8)


def prev_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _tile(n_rows: int, n_cols: int, policy: Policy, wide: bool) -> tuple[int, int, int]:
    tile, max_block_n = policy.tile, policy.max_block_n
    if wide and policy.halve_wide:
        tile, max_block_n = max(tile // 2, 1), max(max_block_n // 2, 1)
    block_n = min(next_pow2(n_cols), max_block_n)
    # Power-of-two rows per program (tl.arange needs it), no more than the rows there are.
    block_m = min(prev_pow2(tile // block_n), next_pow2(n_rows))
    return block_m, block_n, cdiv(n_cols, block_n)


@functools.lru_cache(maxsize=4096)  # per call of every launch: the same few shapes
def forward(n_rows: int, n_cols: int, policy: Policy, *, wide: bool = False) -> Blocks:
    """Forward: one program per tile of rows. ``wide``: statistics accumulate in float64."""
    block_m, block_n, chunks = _tile(n_rows, n_cols, policy, wide)
    n_warps = warps(block_m * block_n)
    return Blocks(block_m, block_n, chunks, n_warps, cdiv(n_rows, block_m), policy.max_registers)


@functools.lru_cache(maxsize=4096)  # per call of every launch: the same few shapes
def backward(n_rows: int, n_cols: int, policy: Policy, *, wide: bool = False) -> Blocks:
    """Backward: at most ``max_programs`` programs, each striding over tiles and keeping its own
    dweight/dbias partial row, so the second reduction adds them in a fixed order (same bits)."""
    block_m, block_n, chunks = _tile(n_rows, n_cols, policy, wide)
    programs = min(cdiv(n_rows, block_m), policy.max_programs)
    n_warps = warps(block_m * block_n)
    return Blocks(block_m, block_n, chunks, n_warps, programs, policy.max_registers)


@functools.lru_cache(maxsize=4096)  # per call of every launch: the same few shapes
def column_sum(n_parts: int, n_cols: int, policy: Policy) -> Blocks:
    """The second reduction over the partial buffer: 64 partial rows x 128 columns per step, one
    program per 128 columns; it reads programs x n_cols floats, so it is never the bottleneck."""
    block_n = min(next_pow2(n_cols), 128)
    block_m = min(next_pow2(n_parts), 64)
    n_warps = warps(block_m * block_n)
    return Blocks(
        block_m, block_n, cdiv(n_parts, block_m), n_warps, cdiv(n_cols, block_n), policy.max_registers
    )


@functools.lru_cache(maxsize=4096)  # per call of every launch: the same few shapes
def channels(n_channels: int, policy: Policy) -> Blocks:
    """InstanceNorm's running update: one lane per channel, up to 1024 channels per program, each lane
    looping over the samples; it reads N x C statistics once, so one wide tile per program suffices."""
    block_n = min(next_pow2(n_channels), 1024)
    return Blocks(1, block_n, 1, warps(block_n), cdiv(n_channels, block_n), policy.max_registers)
