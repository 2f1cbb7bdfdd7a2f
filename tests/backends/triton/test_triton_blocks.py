"""Launch-shape selection for the Triton kernels (pure Python: runs without Triton installed)."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import pytest

from backends.triton.kernels import blocks

from support.suite import ROOT

NATIVE = blocks.native_policy(132)


@pytest.mark.parametrize(
    ("n_cols", "block_n", "chunks"),
    [
        (1, 1, 1),
        (3, 4, 1),
        (127, 128, 1),
        (1000, 1024, 1),
        (4096, 4096, 1),
        (4097, 4096, 2),
        (12288, 4096, 3),
    ],
)
def test_chunk_is_the_next_power_of_two_up_to_the_cap(n_cols, block_n, chunks):
    b = blocks.forward(16, n_cols, NATIVE)
    assert (b.block_n, b.chunks, b.one_chunk) == (block_n, chunks, chunks == 1)
    assert b.block_n * b.chunks >= n_cols


def test_narrow_rows_are_packed_into_one_tile_per_program():
    b = blocks.forward(4096, 64, NATIVE)
    assert b.block_m * b.block_n == NATIVE.tile
    assert b.programs == 4096 // b.block_m
    interpreted = blocks.forward(4096, 64, blocks.INTERPRETED)
    assert interpreted.programs == 4  # 64 Ki-element tiles: the interpreter pays per program step


def test_rows_per_program_never_exceed_the_rows_there_are():
    b = blocks.forward(3, 7, blocks.INTERPRETED)
    assert b.block_m == 4 and b.programs == 1


@pytest.mark.parametrize(("elements", "warps"), [(1, 1), (256, 1), (512, 2), (2048, 8), (1 << 16, 8)])
def test_warps_grow_with_the_tile_and_stop_at_eight(elements, warps):
    assert blocks.warps(elements) == warps


def test_backward_grid_is_capped_so_the_partial_buffer_stays_small():
    b = blocks.backward(4096, 4096, NATIVE)
    assert b.programs == 2 * 132
    assert blocks.backward(3, 4096, NATIVE).programs == 3


def test_column_sum_covers_every_partial_row_and_column():
    b = blocks.column_sum(264, 1000, NATIVE)
    assert b.block_m * b.chunks >= 264 and b.block_n * b.programs >= 1000


def test_info_names_every_choice():
    assert blocks.forward(8, 7, NATIVE).info("forward") == {
        "forward_block_m": 8,
        "forward_block_n": 8,
        "forward_chunks": 1,
        "forward_warps": 1,
        "forward_programs": 1,
    }


def test_nvidia_launches_state_the_register_bound():
    nvidia = blocks.native_policy(132, blocks.NVIDIA_MAX_REGISTERS)
    for b in (
        blocks.forward(16, 4096, nvidia),
        blocks.backward(4096, 1024, nvidia),
        blocks.forward(1, 64, nvidia),
    ):
        assert b.max_registers == 255
    assert blocks.forward(16, 4096, nvidia).info("forward")["forward_max_registers"] == 255
    # No bound where none is given: AMD, the interpreter; and then none recorded.
    assert blocks.forward(16, 4096, NATIVE).max_registers is None
    assert "forward_max_registers" not in blocks.forward(16, 4096, NATIVE).info("forward")


def test_float64_launches_take_half_the_tile_natively():
    narrow, wide = blocks.forward(4096, 64, NATIVE), blocks.forward(4096, 64, NATIVE, wide=True)
    assert wide.block_m * wide.block_n == narrow.block_m * narrow.block_n // 2
    long = blocks.backward(8, 4096, NATIVE, wide=True)
    assert (long.block_n, long.chunks, long.one_chunk) == (2048, 2, False)
    # The interpreter keeps its tiles: only its number of steps costs.
    assert blocks.forward(4096, 64, blocks.INTERPRETED, wide=True) == blocks.forward(
        4096, 64, blocks.INTERPRETED
    )


@pytest.mark.parametrize(
    "kwargs", [{"max_block_n": 48}, {"max_block_n": 0}, {"tile": 0}, {"max_programs": 0}]
)
def test_policy_rejects_impossible_values(kwargs):
    values = {"max_block_n": 64, "tile": 256, "max_programs": 2, **kwargs}
    with pytest.raises(ValueError, match="="):
        blocks.Policy(**values)


@pytest.mark.parametrize(
    ("channels", "block_n", "programs"), [(1, 1, 1), (3, 4, 1), (1024, 1024, 1), (1500, 1024, 2)]
)
def test_running_update_gives_every_channel_one_lane(channels, block_n, programs):
    b = blocks.channels(channels, NATIVE)
    assert (b.block_m, b.block_n, b.chunks, b.programs) == (1, block_n, 1, programs)
    assert b.block_n * b.programs >= channels and b.warps == blocks.warps(block_n)


def test_policies_and_blocks_key_the_launch_caches_by_value():
    # Both hash once (at construction): equal values must still hash equal (or a memoized launch shape
    # is computed again for every equal policy); replace() builds anew, and the caches still tell
    # policies apart by value.
    same = blocks.native_policy(132)
    assert same == NATIVE and hash(same) == hash(NATIVE)
    assert blocks.forward(4096, 8192, same) is blocks.forward(4096, 8192, NATIVE)
    fewer = dataclasses.replace(NATIVE, max_programs=8)
    assert fewer != NATIVE
    assert blocks.backward(4096, 8192, fewer).programs == 8
    assert blocks.backward(4096, 8192, NATIVE).programs == 264
    b = blocks.forward(32, 4096, NATIVE)
    copy = blocks.Blocks(b.block_m, b.block_n, b.chunks, b.warps, b.programs, b.max_registers)
    assert copy == b and hash(copy) == hash(b)
    assert dataclasses.replace(b, warps=b.warps // 2) != b


def test_the_kept_hash_is_the_same_in_another_process():
    # A pickled policy keeps its hash: it must be the one another process computes (no None in it:
    # before Python 3.12 None's hash is its address, which differs between processes).
    code = (
        "from backends.triton.kernels import blocks\n"
        "print(hash(blocks.INTERPRETED), hash(blocks.native_policy(132)))"
    )
    there = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert there.stdout.split() == [str(hash(blocks.INTERPRETED)), str(hash(NATIVE))]
    copy = pickle.loads(pickle.dumps(blocks.INTERPRETED))
    assert copy == blocks.INTERPRETED and hash(copy) == hash(blocks.INTERPRETED)
