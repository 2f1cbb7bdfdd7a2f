"""Broken host paths of the triton backend that the host census (backends/triton/kernels/host.py) must
catch, each as the function it replaces in backends/triton/kernels/launch.py:

- ``uncached_scalars`` (for ``launch.scalars``): eps and the second scalar made into a device tensor
  on every call, a synchronous host-to-device copy from pageable memory per launch.
- ``zeroed_partial`` (for ``launch.partial``): the dweight/dbias partial buffers zero-filled, one torch
  fill kernel per buffer before the backward.
- ``reduction_per_buffer`` (for ``launch.reduce``): dweight and dbias reduced in a launch each.
- ``rebuilt_options`` (for ``launch.kept``): every launch's options built again on every launch (the
  same values, a new object to hash item by item).
- ``statistics_always`` (for ``launch.layer_norm_forward``): mean and rstd allocated and written on
  every forward, one that no backward will read included, and dropped there.

And a broken timer for ``host.seconds_per_call``:

- ``nested_seconds_per_call``: every call's recording entered at once, so a call records into the
  last call's list, which only that call clears: the first call's launches, and the tensors they
  hold, outlive it through its rounds.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from backends.triton.kernels import blocks, host, launch, launcher


def uncached_scalars(eps: float, second: float, acc: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor([eps, second], dtype=acc, device=device)


def zeroed_partial(
    want: bool, b: blocks.Blocks, n_cols: int, acc: torch.dtype, dummy: torch.Tensor
) -> torch.Tensor:
    return torch.zeros((b.programs, n_cols), dtype=acc, device=dummy.device) if want else dummy


REAL_REDUCE = launch.reduce


def reduction_per_buffer(
    parts: Sequence[tuple[torch.Tensor, torch.Tensor]], pol: blocks.Policy
) -> tuple[torch.Tensor, ...]:
    return tuple(out for part in parts for out in REAL_REDUCE([part], pol))


def rebuilt_options(
    shape: Callable[[blocks.Blocks], Mapping[str, Any]],
    b: blocks.Blocks,
    names: tuple[str, ...],
    *values: Any,
) -> launcher.Options:
    return launcher.Options({**dict(zip(names, values, strict=True)), **shape(b)})


REAL_LAYER_NORM_FORWARD = launch.layer_norm_forward


def statistics_always(*args: Any, save: bool = True, **kwargs: Any) -> tuple[torch.Tensor, ...] | None:
    stats = REAL_LAYER_NORM_FORWARD(*args, **kwargs)  # saved whatever the caller asked
    return stats if save else None


def nested_seconds_per_call(
    *calls: Callable[[], None], budget_s: float = 0.5, rounds: int = 7
) -> tuple[float, ...]:
    """Interleaved rounds with every call's recording entered at once, around all of them."""
    best = [math.inf] * len(calls)
    with contextlib.ExitStack() as stack:
        onces = [stack.enter_context(host.recorded(call)) for call in calls]
        for _, (i, once) in itertools.product(range(rounds), enumerate(onces)):
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < budget_s / rounds:
                once()
                done += 1
            best[i] = min(best[i], (time.perf_counter() - start) / done)
    return tuple(best)
