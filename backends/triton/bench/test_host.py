"""Host time per call of the triton backend, launches recorded instead of run: any machine, no GPU.

``pytest backends/triton/bench --benchmark-only`` (``make bench-host``). Each benchmark times one prepared
call (forward, or forward and backward through autograd) of a bf16 case on CPU tensors with an H100's
launch policy; its ``extra_info`` holds what the call does besides computing, from one call on meta
tensors (backends/triton/kernels/host.py): the kernels it launches, host-to-device copies, torch
operations that would launch device work, and allocations. ``test_host_floor`` times the same call with
the backend's host path taken out (the harness and autograd, the same tensors allocated, no launch): the
floor its time stands on, on the machine that ran it. Targets and figures: docs/triton.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from backends.triton.kernels import host
from conformance.bench import allocator


@pytest.fixture(scope="module", autouse=True)
def _pinned_malloc() -> None:
    allocator.configure("pinned")


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("op", host.OPS)
@pytest.mark.parametrize("shape", list(host.SHAPES))
def test_host_time(benchmark: Any, shape: str, op: str, grad: bool) -> None:
    case = host.case(op, shape)
    seen = host.census(host.prepared(case, grad=grad))
    benchmark.extra_info.update(
        case=case.id,
        grad=grad,
        launches=len(seen.launches),
        kernels=list(seen.launches),
        h2d_copies=len(seen.h2d_copies),
        torch_kernels=list(seen.torch_kernels),
        allocations=list(seen.allocations),
        meaning="host time of one call, launches recorded and not run (Triton's launcher not included)",
    )
    with host.recorded(host.prepared(case, grad=grad, device="cpu")) as once:
        benchmark(once)


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("op", host.OPS)
@pytest.mark.parametrize("shape", list(host.SHAPES))
def test_host_floor(benchmark: Any, shape: str, op: str, grad: bool) -> None:
    """The floor under ``test_host_time`` of the same case, on the same machine: the harness and autograd
    with the same tensors allocated and nothing launched (``host.FloorPrepared``). test_host_time less
    this is what the backend's own host path costs a call."""
    case = host.case(op, shape)
    benchmark.extra_info.update(
        case=case.id,
        grad=grad,
        launches=0,
        meaning="floor: the same call through the harness and autograd with outputs allocated, no kernel",
    )
    with host.recorded(host.prepared(case, grad=grad, device="cpu", floor=True)) as once:
        benchmark(once)
