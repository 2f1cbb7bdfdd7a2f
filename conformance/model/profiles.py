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
ROW_OPS = ("layer_norm", "rms_norm", "add_rms_norm")
HALF = ("float16", "bfloat16")


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
        "BatchNorm training with a fixed momentum and the cumulative average, (N, C, L) layout",
        _bn(dtype=("float32", "bfloat16"), momentum=(0.1, None), shape=((6, 3, 5),), training=(True,)),
        {"eps": 1e-5},
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
)

FULL: tuple[Grid, ...] = (
    *CI,
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
