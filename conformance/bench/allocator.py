"""Pin glibc malloc's reuse of large blocks for the CPU benchmarks.

glibc serves a block above its mmap threshold with a fresh mmap and unmaps it on free, and it
raises that threshold each time such a block is freed (up to 32 MiB). A benchmark that allocates a
temporary of a few MiB per call (a composed RMSNorm's float32 copy of x, an output tensor) is thus
timed either with first-touch page faults on every call or with none, depending on what earlier
benchmarks freed: the same case measured 0.43 ms or 3.3 ms on this project's CI machine, by history
alone. Setting the mmap and trim thresholds explicitly turns the adaptation off and keeps freed
blocks for reuse, as torch's CUDA caching allocator does on a GPU, so a figure is the kernel's and
not the allocator's history. Only applies where the C library is glibc; elsewhere the session
records that it ran with the default policy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# <malloc.h>: mallopt parameters.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
CHOICES = ("pinned", "default")
# Above every per-call temporary of the sweep (64 MiB tensors) and the roofline copy's buffers.
PINNED_BYTES = 1 << 30


def configure(choice: str) -> str:
    """Apply ``choice`` ("pinned" or "default"); returns what the session ran with, for its records."""
    if choice not in CHOICES:
        raise ValueError(f"--bench-malloc={choice!r} is not allowed; allowed: {', '.join(CHOICES)}")
    if choice == "default":
        return "default"
    if platform.libc_ver()[0] != "glibc":
        return "default (not glibc: nothing to pin)"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    applied = libc.mallopt(M_MMAP_THRESHOLD, PINNED_BYTES) == 1
    applied = libc.mallopt(M_TRIM_THRESHOLD, 2 * PINNED_BYTES) == 1 and applied
    if not applied:
        return "default (glibc refused mallopt)"
    mib = PINNED_BYTES >> 20
    return f"pinned (glibc mallopt: mmap threshold {mib} MiB, trim threshold {2 * mib} MiB)"
