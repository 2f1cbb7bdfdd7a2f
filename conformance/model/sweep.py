"""The benchmark case sweeps: LLM hidden sizes from decode-like to memory-bound row counts, and the
GroupNorm / InstanceNorm activations of image models.

Case ids are built exactly as the conformance suite's, so a benchmark joins the conformance results
of the same case; the decode shapes (4, 4096) and (2, 8192) are also in the ``ci`` profile. The op
varies fastest, so LayerNorm, RMSNorm and the fused add ops of one shape and dtype run back to back and
their ratios are not at the mercy of the machine's drift over the minutes of a sweep.
"""

from __future__ import annotations

from conformance.model import profiles
from conformance.model.case import Case
from conformance.model.profiles import Grid

BENCH_PROFILES: tuple[str, ...] = ("sweep", "quick", "tiny", *profiles.PROFILES)
# The benchmarks' own default (pytest conformance/bench); normconf bench defaults to "quick".
DEFAULT_PROFILE = "sweep"
OPS = ("layer_norm", "rms_norm", "add_rms_norm", "add_layer_norm")
DTYPES = ("float32", "float16", "bfloat16")
# Diffusion U-Nets and their VAEs normalize with 32 groups (Stable Diffusion, diffusers' default).
UNET_GROUPS = 32

SWEEP: tuple[Grid, ...] = (
    Grid(
        "decode-like: 1 to 4 rows at hidden sizes 4096 and 8192, where per-call overhead dominates",
        {"shape": ((1, 4096), (4, 4096), (2, 8192)), "dtype": DTYPES, "op": OPS},
        {"eps": 1e-5},
    ),
    Grid(
        "prefill / training rows: a cache-resident 256 x 4096, then tensors of 16 to 64 MiB in float32"
        " (beyond a 32 MiB L3), so the large ones measure memory, not cache",
        {"shape": ((256, 4096), (4096, 1024), (2048, 4096), (2048, 8192)), "dtype": DTYPES, "op": OPS},
        {"eps": 1e-5},
    ),
    Grid(
        "the fused add ops with the residual stream kept in float32 (bfloat16 activations): the memory-bound"
        " shapes, where the wider stream's bytes show",
        {"shape": ((2048, 4096),), "op": ("add_rms_norm", "add_layer_norm")},
        {"eps": 1e-5, "dtype": "bfloat16", "residual_dtype": "float32"},
    ),
    Grid(
        "diffusion GroupNorm, 32 groups: the Stable Diffusion 1.x U-Net's first blocks (320 channels at"
        " 64 x 64, batch 2 for classifier-free guidance: 10 MiB in float32), and its VAE decoding a"
        " 256 x 256 image: the mid block (512 channels at 32 x 32) and the last up block (128 channels"
        " at 256 x 256: 32 MiB, memory rather than cache)",
        {"shape": ((2, 320, 64, 64), (1, 512, 32, 32), (1, 128, 256, 256)), "dtype": DTYPES},
        {"eps": 1e-5, "op": "group_norm", "num_groups": UNET_GROUPS},
    ),
    Grid(
        "InstanceNorm on style-transfer images (torch's default: instance statistics, no running ones):"
        " 64 channels at 128 x 128 in batches of 1 and 4 (4 and 16 MiB in float32)",
        {"shape": ((1, 64, 128, 128), (4, 64, 128, 128)), "dtype": DTYPES},
        {"eps": 1e-5, "op": "instance_norm"},
    ),
)

QUICK: tuple[Grid, ...] = (
    Grid(
        "one decode and one memory-bound shape per op and dtype: a minute-scale look at the sweep",
        {"shape": ((4, 4096), (2048, 4096)), "dtype": DTYPES, "op": OPS},
        {"eps": 1e-5},
    ),
    Grid(
        "the Stable Diffusion latent GroupNorm per dtype",
        {"dtype": DTYPES},
        {"eps": 1e-5, "op": "group_norm", "shape": (2, 320, 64, 64), "num_groups": UNET_GROUPS},
    ),
    Grid(
        "one style-transfer InstanceNorm batch per dtype",
        {"dtype": DTYPES},
        {"eps": 1e-5, "op": "instance_norm", "shape": (4, 64, 128, 128)},
    ),
)

TINY: tuple[Grid, ...] = (
    Grid(
        "tiny shapes that run every benchmark path in seconds (the suite's own tests)",
        {"op": OPS, "dtype": DTYPES, "shape": ((4, 64),)},
        {"eps": 1e-5},
    ),
    Grid(
        "a tiny GroupNorm (2 groups) image per dtype",
        {"dtype": DTYPES},
        {"eps": 1e-5, "op": "group_norm", "shape": (2, 8, 4, 4), "num_groups": 2},
    ),
    Grid(
        "a tiny InstanceNorm image per dtype",
        {"dtype": DTYPES},
        {"eps": 1e-5, "op": "instance_norm", "shape": (2, 8, 4, 4)},
    ),
)

_GRIDS: dict[str, tuple[Grid, ...]] = {"sweep": SWEEP, "quick": QUICK, "tiny": TINY}


def cases(profile: str) -> list[Case]:
    """The bench profile's cases; the suite's ``smoke``/``ci``/``full`` profiles are accepted by name too."""
    if profile not in BENCH_PROFILES:
        raise ValueError(f"--bench-profile={profile!r} is not allowed; allowed: {', '.join(BENCH_PROFILES)}")
    if profile in _GRIDS:
        unique: dict[str, Case] = {}
        for grid in _GRIDS[profile]:
            for case in grid.cases():
                unique.setdefault(case.id, case)
        return list(unique.values())
    return profiles.cases(profile)
