"""Benchmark sweeps, timing plans, the roofline arithmetic and the NumPy copy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance.bench import timing
from conformance.model import profiles, sweep


def test_sweep_covers_ops_dtypes_hidden_sizes_and_decode_rows() -> None:
    cases = sweep.cases("sweep")
    rows = [c for c in cases if c.op in sweep.OPS]
    assert {c.op for c in cases} == {*sweep.OPS, "group_norm", "instance_norm"}
    assert {c.dtype for c in cases} == {"float32", "float16", "bfloat16"}
    assert {4096, 8192} <= {c.shape[-1] for c in rows}
    assert min(c.rows for c in rows) == 1
    # Memory-bound shapes: tensors of 64 MiB in float32, beyond any last-level cache here.
    assert max(math.prod(c.shape) * 4 for c in rows) >= 64 << 20
    assert len({c.id for c in cases}) == len(cases)


def test_sweep_has_diffusion_group_norm_and_instance_norm_images_in_every_dtype() -> None:
    cases = sweep.cases("sweep")
    groups = {(c.shape, c.num_groups) for c in cases if c.op == "group_norm"}
    assert {((2, 320, 64, 64), 32), ((1, 512, 32, 32), 32)} <= groups
    images = [c for c in cases if c.op == "instance_norm"]
    assert images and all(len(c.shape) == 4 and not c.track_running_stats for c in images)
    for op in ("group_norm", "instance_norm"):
        chosen = [c for c in cases if c.op == op]
        assert {c.dtype for c in chosen} == set(sweep.DTYPES), op
        # One shape at least beyond a 32 MiB L3 or at 16 MiB: the group ops get a DRAM figure too.
        assert max(math.prod(c.shape) * 4 for c in chosen) >= 16 << 20, op


@pytest.mark.parametrize("profile", ["quick", "tiny"])
def test_short_profiles_keep_group_norm_and_instance_norm(profile: str) -> None:
    ops = {c.op for c in sweep.cases(profile)}
    assert ops == {*sweep.OPS, "group_norm", "instance_norm"}


def test_decode_shapes_join_the_ci_profile_by_case_id() -> None:
    ci = {c.id for c in profiles.cases("ci")}
    joined = [c for c in sweep.cases("sweep") if c.id in ci]
    assert {c.shape for c in joined} == {(4, 4096), (2, 8192)}
    assert {c.dtype for c in joined} == {"float32", "bfloat16"}  # ci runs those shapes in fp32 and bf16


@pytest.mark.parametrize("profile", sweep.BENCH_PROFILES)
def test_every_profile_builds(profile: str) -> None:
    assert sweep.cases(profile)


def test_unknown_profile_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="--bench-profile='huge' is not allowed; allowed: sweep, quick"):
        sweep.cases("huge")


def test_plan_fills_the_budget_and_keeps_the_minimum_rounds() -> None:
    assert timing.plan(0.01, 0.25, 5, flush=False) == timing.Plan(25, 1)
    assert timing.plan(1.0, 0.25, 5, flush=False) == timing.Plan(5, 1)
    fast = timing.plan(1e-6, 0.25, 5, flush=False)
    assert fast.iterations * 1e-6 >= timing.MIN_ROUND_S and fast.rounds <= timing.MAX_ROUNDS


def test_plan_with_a_flush_times_one_call_per_round() -> None:
    assert timing.plan(1e-6, 0.25, 5, flush=True).iterations == 1


def test_roofline_counts_read_and_write() -> None:
    roof = timing.Roofline("cpu", "numpy", nbytes=1_000_000_000, threads=2, median_s=0.2)
    assert roof.gbps == pytest.approx(10.0)
    assert roof.fraction(5.0) == pytest.approx(0.5)
    assert timing.Roofline("cpu", "numpy", 1, 2, None).fraction(5.0) is None


@pytest.mark.parametrize("threads", [1, 3])
def test_numpy_copy_copies_every_chunk(threads: int) -> None:
    copy = timing.NumpyCopy(4000, threads)
    copy.src[:] = np.arange(copy.src.size)
    copy()
    copy.synchronize()
    assert np.array_equal(copy.dst, copy.src)
    assert copy.outputs() == {}
    copy.close()
