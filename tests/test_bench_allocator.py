"""The benchmarks' malloc policy: validated, applied on glibc, and it removes the per-call page faults
of large temporaries (a fresh process per policy, since mallopt cannot be undone)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from conformance.bench import allocator

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy only exists on glibc")

# Allocate, touch and free a 64 MiB block repeatedly (a per-call temporary of a large case); prints
# the policy and the median time in ms.
PROBE = textwrap.dedent(
    """
    import statistics, sys, time
    import numpy as np
    from conformance.bench import allocator
    print(allocator.configure(sys.argv[1]))
    times = []
    for _ in range(30):
        start = time.perf_counter()
        block = np.empty(64 << 20, np.uint8); block.fill(1); del block
        times.append(time.perf_counter() - start)
    print(1e3 * statistics.median(times))
    """
)


def _probe(choice: str) -> tuple[str, float]:
    done = subprocess.run([sys.executable, "-c", PROBE, choice], capture_output=True, text=True, check=True)
    policy, median_ms = done.stdout.strip().splitlines()
    return policy, float(median_ms)


def test_unknown_choice_names_the_option_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"--bench-malloc='arena' is not allowed; allowed: pinned, default"):
        allocator.configure("arena")


@glibc
def test_pinned_policy_reuses_large_blocks_instead_of_faulting_them_in_on_every_call() -> None:
    default, default_ms = _probe("default")
    pinned, pinned_ms = _probe("pinned")
    assert default == "default" and pinned.startswith("pinned (glibc mallopt")
    # Above glibc's largest adaptive threshold (32 MiB) every default allocation is a fresh mmap whose
    # 16k pages fault in on first touch; pinned, the freed block is reused.
    assert pinned_ms < default_ms / 2, (default_ms, pinned_ms)
