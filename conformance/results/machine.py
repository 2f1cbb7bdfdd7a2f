"""What a results header records of the machine that a ledger entry may be conditioned on: the CPU's
vector features (the ones runtimes and torch's CPU kernels dispatch on) read from /proc/cpuinfo."""

from __future__ import annotations

import functools
from pathlib import Path

# The features that change which kernel a library picks, hence how it rounds: x86 (Linux flag names)
# and aarch64 (the Features line). Others in /proc/cpuinfo are left out of results.
CPU_FEATURES: tuple[str, ...] = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimdhp",
    "fphp",
    "bf16",
    "i8mm",
    "sve",
    "sve2",
)


def parse_cpu_features(cpuinfo: str) -> tuple[str, ...]:
    """The known features named on the first ``flags`` (x86) or ``Features`` (aarch64) line."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return tuple(f for f in CPU_FEATURES if f in present)
    return ()


@functools.cache
def cpu_features() -> tuple[str, ...]:
    """This machine's known CPU features; () where /proc/cpuinfo cannot be read (not Linux)."""
    try:
        return parse_cpu_features(Path("/proc/cpuinfo").read_text())
    except OSError:
        return ()
