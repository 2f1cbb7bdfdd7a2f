"""Declarative case grids and the profiles built from them: smoke (seconds), ci (minutes), full.

A grid is a base of fixed fields times a product of axes; each grid says in one line why it is
reduced from the full product of every axis.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.model.case import DISTS, Case, CaseError
from conformance.model.dtypes import DTYPES

PROFILES: tuple[str, ...] = ("smoke", "ci", "full")
ROW_OPS = ("layer_norm", "rms_norm", "add_rms_norm", "add_layer_norm")
HALF = ("float16", "bfloat16")
ADD_OPS = ("add_rms_norm", "add_layer_norm")
# The residual stream's conventions: kept in the activation dtype or in float32, the norm reading the
# stored sum or the unrounded one. The validator folds a float32 stream of float32 activations into
# the default, and the de-duplication by id drops it.
RESIDUAL_CONVENTIONS: dict[str, tuple[object, ...]] = {
    "residual_dtype": (None, "float32"),
    "norm_input": ("rounded", "exact"),
}


@dataclass(frozen=True)
class Grid:
    """Cases = base fields x product(axes); ``why`` justifies leaving the rest of the space out."""

    why: str
    axes: Mapping[str, tuple[Any, ...]]
    base: Mapping[str, Any] = field(default_factory=dict)

    def cases(self) -> Iterable[Case]:
        names = list(self.axes)
        for values in itertools.product(*(self.axes[n] for n in names)):
            fields = {**self.base, **dict(zip(names, values, strict=True))}
            try:
                yield Case(**fields)
            except CaseError:
                # A product can pair fields that exclude each other (bias for rms_norm); the Case
                # validator is the single source of which combinations exist.
                continue


def _bn(**axes: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    return {"op": ("batch_norm",), **axes}


def _gn(**axes: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    return {"op": ("group_norm",), **axes}


def _in(**axes: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    return {"op": ("instance_norm",), **axes}


def _channel_groups(
    why: str, axes: Mapping[str, tuple[Any, ...]], base: Mapping[str, Any]
) -> tuple[Grid, ...]:
    """The grid for GroupNorm with ``base``'s num_groups, and for InstanceNorm (one channel per group)."""
    instance = {k: v for k, v in base.items() if k != "num_groups"}
    return (
        Grid(why, {"op": ("group_norm",), **axes}, base),
        Grid(why + " (InstanceNorm)", {"op": ("instance_norm",), **axes}, instance),
    )


# InstanceNorm's four modes: instance statistics (torch's default), eval with running statistics, and
# training steps with a fixed momentum and with the cumulative average (momentum None). The Case
# validator drops the products that do not exist (training without running statistics).
IN_MODES: dict[str, tuple[Any, ...]] = {
    "track_running_stats": (False, True),
    "training": (False, True),
    "momentum": (0.1, None),
}


SMOKE: tuple[Grid, ...] = (
    Grid(
        "one small shape per op and dtype: every check runs in seconds",
        {"op": (*ROW_OPS, "batch_norm"), "dtype": DTYPES, "shape": ((6, 40),)},
        {"eps": 1e-5},
    ),
    Grid(
        "the distributions that separate conventions, on one small shape",
        {
            "op": ROW_OPS,
            "dtype": ("float32", *HALF),
            "dist": ("offset", "near_constant", "large", "constant"),
            "shape": ((4, 24),),
        },
        {"eps": 1e-5},
    ),
    Grid(
        "two normalized dims and affine variants, float32 only",
        {"op": ("layer_norm",), "norm_ndim": (2,), "shape": ((3, 4, 10),), "dtype": ("float32",)},
        {"eps": 1e-5},
    ),
    Grid(
        "LayerNorm and its add op without a bias: a class that has none (CohereLayerNorm) runs these",
        {"op": ("layer_norm", "add_layer_norm"), "dtype": ("float32", "bfloat16"), "shape": ((6, 40),)},
        {"eps": 1e-5, "bias": False},
    ),
    Grid(
        "BatchNorm training with a fixed momentum and the cumulative average, (N, C, L) layout",
        _bn(dtype=("float32", "bfloat16"), momentum=(0.1, None), shape=((6, 3, 5),), training=(True,)),
        {"eps": 1e-5},
    ),
    Grid(
        "GroupNorm with one group, groups between, and one channel per group, every dtype",
        _gn(dtype=DTYPES, shape=((2, 6, 5),), num_groups=(1, 2, 6)),
        {"eps": 1e-5},
    ),
    Grid(
        "InstanceNorm's four modes in float32 and bfloat16, and constant instances",
        _in(dtype=("float32", "bfloat16"), shape=((2, 3, 6),), dist=("normal", "constant"), **IN_MODES),
        {"eps": 1e-5},
    ),
    Grid(
        "the add ops' residual conventions on one small bfloat16 shape, where the sum's rounding shows",
        {"op": ADD_OPS, "dtype": ("bfloat16",), **RESIDUAL_CONVENTIONS, "shape": ((6, 40),)},
        {"eps": 1e-5},
    ),
    *_channel_groups(
        "torch's channels-last layout for both ops, float32",
        {"dtype": ("float32",), "shape": ((2, 4, 3, 5),)},
        {"eps": 1e-5, "layout": "channels_last", "num_groups": 2},
    ),
)

CI: tuple[Grid, ...] = (
    Grid(
        "every op x dtype at two row shapes; eps fixed here, swept below",
        {"op": (*ROW_OPS, "batch_norm"), "dtype": DTYPES, "shape": ((8, 7), (64, 384))},
        {"eps": 1e-5},
    ),
    Grid(
        "eps sweep 1e-12..1e-2 on normal and near-constant rows; one mid-size shape suffices for eps",
        {
            "op": (*ROW_OPS, "batch_norm"),
            "dtype": DTYPES,
            "eps": (1e-12, 1e-6, 1e-2),
            "dist": ("normal", "near_constant"),
            "shape": ((16, 96),),
        },
    ),
    Grid(
        "every distribution for LN/RMS in every dtype at one shape (large rows stay < 300 elements)",
        {"op": ROW_OPS, "dtype": DTYPES, "dist": DISTS, "shape": ((12, 100),)},
        {"eps": 1e-5},
    ),
    Grid(
        "feature sizes 1..8192 incl. non-powers of two; fp32 and bf16 bracket the precision range",
        {
            "op": ROW_OPS,
            "dtype": ("float32", "bfloat16"),
            "shape": ((4, 1), (4, 2), (4, 3), (4, 127), (4, 1000), (4, 4096), (2, 8192)),
        },
        {"eps": 1e-5},
    ),
    Grid(
        "4096 rows so dweight/dbias reduce over many rows; a narrow row keeps it fast",
        {"op": (*ROW_OPS,), "dtype": ("float32", "float16", "bfloat16"), "shape": ((4096, 64),)},
        {"eps": 1e-5},
    ),
    Grid(
        "two normalized trailing dims, every dtype",
        {"op": ROW_OPS, "dtype": DTYPES, "norm_ndim": (2,), "shape": ((4, 6, 33),)},
        {"eps": 1e-5},
    ),
    Grid(
        "affine variants (weight/bias on/off) for the ops that have them, fp32 and bf16",
        {
            "op": (*ROW_OPS, "batch_norm"),
            "dtype": ("float32", "bfloat16"),
            "weight": (True, False),
            "bias": (True, False),
            "shape": ((8, 48),),
        },
        {"eps": 1e-5},
    ),
    Grid(
        "Gemma (1 + w) RMSNorm on normal and offset rows in every dtype",
        {
            "op": ("rms_norm", "add_rms_norm"),
            "dtype": DTYPES,
            "dist": ("normal", "offset"),
            "shape": ((8, 256),),
        },
        {"eps": 1e-6, "weight_offset": 1.0, "bias": False},
    ),
    Grid(
        "half activations with float32 parameters, the common mixed-precision layout",
        {"op": (*ROW_OPS, "batch_norm"), "dtype": HALF, "dist": ("normal", "offset"), "shape": ((16, 200),)},
        {"eps": 1e-5, "param_dtype": "float32"},
    ),
    Grid(
        "BatchNorm eval and training over (N, C), (N, C, L), (N, C, H, W); momentum 0.1, 0.5 and None",
        _bn(
            dtype=DTYPES,
            shape=((32, 16), (8, 4, 50), (4, 3, 6, 7)),
            training=(True,),
            momentum=(0.1, 0.5, None),
        ),
        {"eps": 1e-5},
    ),
    Grid(
        "BatchNorm eval (running statistics) on every layout and the offset distribution",
        _bn(dtype=DTYPES, shape=((32, 16), (8, 4, 50), (4, 3, 6, 7)), dist=("normal", "offset")),
        {"eps": 1e-5},
    ),
    *(
        Grid(
            f"GroupNorm with G = 1, G between and G = C (C={shape[1]}), every dtype, 3-d and 4-d inputs",
            _gn(dtype=DTYPES, shape=(shape,), num_groups=(1, 4, shape[1])),
            {"eps": 1e-5},
        )
        for shape in ((2, 8, 5, 5), (3, 32, 7))
    ),
    Grid(
        "GroupNorm odd and large spatial sizes (groups of 17*19*3 and 64*64*2 values), fp32 and bf16",
        _gn(dtype=("float32", "bfloat16"), shape=((2, 6, 17, 19), (1, 4, 64, 64)), num_groups=(2,)),
        {"eps": 1e-5},
    ),
    *_channel_groups(
        "every distribution for GN/IN in every dtype: constant and offset groups, float16 squares that "
        "overflow (groups of 20 values stay far from float32's limit)",
        {"dtype": DTYPES, "dist": DISTS, "shape": ((2, 6, 10),)},
        {"eps": 1e-5, "num_groups": 3},
    ),
    *_channel_groups(
        "eps sweep 1e-12..1e-2 for GN/IN on normal and near-constant groups",
        {
            "dtype": DTYPES,
            "eps": (1e-12, 1e-6, 1e-2),
            "dist": ("normal", "near_constant"),
            "shape": ((2, 4, 24),),
        },
        {"num_groups": 2},
    ),
    *_channel_groups(
        "affine variants (InstanceNorm's default has none) and half activations with float32 parameters",
        {
            "dtype": ("float32", "bfloat16"),
            "weight": (True, False),
            "bias": (True, False),
            "shape": ((2, 6, 9),),
        },
        {"eps": 1e-5, "num_groups": 3},
    ),
    *_channel_groups(
        "half activations with float32 parameters for GN/IN",
        {"dtype": HALF, "dist": ("normal", "offset"), "shape": ((2, 8, 25),)},
        {"eps": 1e-5, "param_dtype": "float32", "num_groups": 4},
    ),
    Grid(
        "InstanceNorm's four modes on 1-d, 2-d and 3-d inputs in every dtype",
        _in(dtype=DTYPES, shape=((4, 3, 10), (2, 4, 6, 7), (2, 2, 3, 4, 5)), **IN_MODES),
        {"eps": 1e-5},
    ),
    Grid(
        "InstanceNorm training with momentum 0.5 and eval with running statistics on offset data",
        _in(
            dtype=("float32", "bfloat16"),
            shape=((4, 3, 10),),
            training=(True,),
            momentum=(0.5,),
            dist=("offset",),
        ),
        {"eps": 1e-5, "track_running_stats": True},
    ),
    *_channel_groups(
        "torch's channels-last layout (4-d and 5-d) for GN/IN in every dtype",
        {"dtype": DTYPES, "shape": ((2, 8, 5, 6), (2, 4, 3, 4, 5))},
        {"eps": 1e-5, "layout": "channels_last", "num_groups": 2},
    ),
    Grid(
        "the add ops' residual conventions in the half dtypes (and float32's exact sum) on rows that "
        "cancel (offset, near-constant) and plain ones; mixed float32 parameters once",
        {
            "op": ADD_OPS,
            "dtype": ("float32", *HALF),
            **RESIDUAL_CONVENTIONS,
            "dist": ("normal", "offset", "near_constant"),
            "shape": ((16, 200),),
        },
        {"eps": 1e-5},
    ),
    Grid(
        "the add ops' float32 stream with float32 parameters and half activations, backward over 4096 rows",
        {"op": ADD_OPS, "dtype": HALF, "residual_dtype": ("float32",), "shape": ((4096, 64),)},
        {"eps": 1e-5, "param_dtype": "float32"},
    ),
)

FULL: tuple[Grid, ...] = (
    *CI,
    Grid(
        "the add ops' residual conventions on every distribution and every half dtype",
        {"op": ADD_OPS, "dtype": HALF, **RESIDUAL_CONVENTIONS, "dist": DISTS, "shape": ((32, 200),)},
        {"eps": 1e-6},
    ),
    Grid(
        # Not `large`: 4096 squares near 2.5e35 sum past float32's range, which no implementation with
        # the float32 statistics the reference semantics ask for can represent (inputs.LARGE_SCALE).
        "the add ops' residual conventions on LLM-sized rows, every half dtype",
        {
            "op": ADD_OPS,
            "dtype": HALF,
            **RESIDUAL_CONVENTIONS,
            "dist": tuple(d for d in DISTS if d != "large"),
            "shape": ((256, 4096),),
        },
        {"eps": 1e-6},
    ),
    Grid(
        "every op x dtype x distribution x eps on a mid shape (large dist rows stay < 300 elements)",
        {
            "op": (*ROW_OPS, "batch_norm"),
            "dtype": DTYPES,
            "dist": DISTS,
            "eps": (1e-12, 1e-6, 1e-5, 1e-2),
            "shape": ((32, 200),),
        },
    ),
    Grid(
        "LLM-sized rows in every dtype, including mixed parameters",
        {
            "op": ROW_OPS,
            "dtype": DTYPES,
            "shape": ((4096, 1024), (512, 4096), (256, 8192), (64, 5120), (16, 12288)),
        },
        {"eps": 1e-6},
    ),
    Grid(
        "BatchNorm image layouts with many channels, train and eval",
        _bn(dtype=DTYPES, shape=((16, 64, 14, 14), (64, 256)), training=(False, True)),
        {"eps": 1e-5},
    ),
    *_channel_groups(
        "GN/IN every distribution x eps on a mid shape (groups of 200 values)",
        {"dtype": DTYPES, "dist": DISTS, "eps": (1e-12, 1e-6, 1e-5, 1e-2), "shape": ((4, 8, 200),)},
        {"num_groups": 8},
    ),
    *_channel_groups(
        "diffusion U-Net GroupNorm shapes (32 groups) and style-transfer InstanceNorm images",
        {"dtype": DTYPES, "shape": ((2, 320, 32, 32), (1, 512, 16, 16), (4, 64, 64, 64))},
        {"eps": 1e-5, "num_groups": 32},
    ),
)

_GRIDS: dict[str, tuple[Grid, ...]] = {"smoke": SMOKE, "ci": CI, "full": FULL}


def cases(profile: str) -> list[Case]:
    """The profile's cases, de-duplicated by id, in a stable order."""
    if profile not in _GRIDS:
        raise ValueError(f"--profile={profile!r} is not allowed; allowed: {', '.join(PROFILES)}")
    unique: dict[str, Case] = {}
    for grid in _GRIDS[profile]:
        for case in grid.cases():
            unique.setdefault(case.id, case)
    return list(unique.values())
