"""The benchmarks' malloc policy: validated, applied on glibc, and it removes the per-call page faults
of large temporaries (a fresh process per policy, since mallopt cannot be undone)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy only exists on glibc")

# Allocate, touch and free a 64 MiB block repeatedly (a per-call temporary of a large case); prints
# the policy and the minor page faults of the loop after a first warm-up round. Page faults, not
# times: the count does not depend on what else the machine is doing.
PROBE = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from conformance.bench import allocator
    print(allocator.configure(sys.argv[1]))
    block = np.empty(64 << 20, np.uint8); block.fill(1); del block
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        block = np.empty(64 << 20, np.uint8); block.fill(1); del block
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _probe(choice: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", PROBE, choice], capture_output=True, text=True, check=True)
    policy, faults = done.stdout.strip().splitlines()
    return policy, int(faults)


@glibc
def test_pinned_policy_reuses_large_blocks_instead_of_faulting_them_in_on_every_call() -> None:
    default, default_faults = _probe("default")
    pinned, pinned_faults = _probe("pinned")
    assert default == "default" and pinned.startswith("pinned (glibc mallopt")
    # Above glibc's largest adaptive threshold (32 MiB) every default allocation is a fresh mmap whose
    # pages fault in on first touch (16k per round, or 32 where transparent huge pages back it);
    # pinned, the freed block is reused and touching it again faults nothing in.
    assert default_faults >= 10 * 32, default_faults
    assert pinned_faults < default_faults / 10, (default_faults, pinned_faults)
