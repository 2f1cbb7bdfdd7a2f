"""What the triton backend's calls cost on the host, on any machine: their launches recorded, not run.

A prepared call of the triton backend (``TritonPrepared``: what the conformance suite and the benchmarks
call, forward alone or forward and backward through autograd) runs on meta tensors of a case's shapes,
with a GPU's launch policy, every launch recorded instead of run (``launcher.recording``). Its time is
what a call spends on the host before and between its launches: Python, autograd, torch's dispatcher,
allocations, the launch key of a bound launch. Triton's own launcher (``CompiledKernel.run``: 3-5 µs a
launch on a GPU host, docs/triton.md) comes on top, once per launch counted here.

Timed calls run on CPU tensors (torch's C++ paths, as on a GPU host; glibc's malloc pinned to reuse
large blocks, as the CUDA caching allocator does: conformance/bench/allocator.py). ``census()`` says what
one steady-state call on meta tensors does besides computing: the kernels it launches, the
host-to-device copies, the torch operations that would run a kernel of their own on the device, and the
allocations (outputs; with a backward, the saved statistics and the partial buffers). ``FloorPrepared``
is the same call with the backend's host path taken out (the harness and autograd with the same
tensors allocated, nothing launched): the floor under a call's time on the machine that measures it,
which differs between machines more than the path itself does. ``python -m
backends.triton.kernels.host`` prints all three for the benchmark's cases; backends/triton/bench times
them with pytest-benchmark.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from backends.triton.kernels import blocks, mode

mode.select()

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from backends.triton.backend import TritonPrepared  # noqa: E402
from backends.triton.kernels import launch, launcher  # noqa: E402
from conformance.bench import allocator  # noqa: E402
from conformance.model import inputs  # noqa: E402
from conformance.model.case import ADD_OPS, Case  # noqa: E402
from conformance.model.dtypes import DTYPES  # noqa: E402

# The launch policy of an H100 / H200 (132 multiprocessors): launch counts and grids as on those GPUs.
GPU_POLICY = blocks.native_policy(132, blocks.NVIDIA_MAX_REGISTERS)
META = mode.Mode(False, "meta", "host profile: meta tensors, launches recorded and not run")

# Training shapes and a decode shape, bf16 (the figures of docs/triton.md); eps as models set it.
SHAPES = {"4096x8192": (4096, 8192), "32x4096": (32, 4096)}
OPS = ("layer_norm", "rms_norm", "add_rms_norm", "add_layer_norm")

# Operations that make no device work: views, metadata, and allocations left uninitialized.
_VIEWS = frozenset(
    {
        "view", "_unsafe_view", "reshape", "alias", "detach", "expand", "as_strided", "t", "unsqueeze",
        "squeeze", "select", "slice", "permute", "transpose", "_reshape_alias",
    }
)  # fmt: skip
_ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


def case(op: str, shape: str, dtype: str = "bfloat16") -> Case:
    """One of the host benchmark's cases: weight (and LayerNorm's bias) of the activation dtype."""
    return Case(op=op, shape=SHAPES[shape], dtype=dtype, eps=1e-6)


def prepared(c: Case, *, grad: bool, device: str = "meta", floor: bool = False) -> TritonPrepared:
    """The triton backend's prepared call of ``c`` with the GPU policy, on tensors of ``device``: "meta"
    for the census (a copy from the CPU is visible as one), "cpu" for timing (torch's C++ paths, as on
    a GPU host: some meta kernels are Python, and would be timed instead). ``floor``: the same call with
    nothing between the harness and autograd (``FloorPrepared``), the floor its host time stands on."""
    if device not in ("meta", "cpu"):
        raise ValueError(f"device={device!r} is not allowed; allowed: meta, cpu")
    torch_dtypes = {name: getattr(torch, name) for name in DTYPES}
    tensors = {
        name: torch.zeros(shape, dtype=torch_dtypes[dtype], device=device)
        for name, (shape, dtype) in inputs.specs(c, grad=grad).items()
    }
    return (FloorPrepared if floor else TritonPrepared)(c, tensors, grad, META, GPU_POLICY)


class _Floor(torch.autograd.Function):
    """Every output and gradient allocated, nothing computed or launched: what any
    ``torch.autograd.Function`` with these inputs and outputs costs a call on the host."""

    @staticmethod
    def forward(ctx: Any, outputs: int, *tensors: torch.Tensor | None) -> Any:
        x = tensors[0]
        assert x is not None, "x comes first"
        ctx.save_for_backward(*tensors)
        made = tuple(torch.empty_like(x) for _ in range(outputs))
        return made if outputs > 1 else made[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        needed = ctx.needs_input_grad[1:]
        made = (
            torch.empty_like(t) if need else None for t, need in zip(ctx.saved_tensors, needed, strict=True)
        )
        return (None, *made)


class FloorPrepared(TritonPrepared):
    """The triton backend's prepared call with the fused forward (and backward) replaced by ``_Floor``:
    the same harness (grad mode, ``torch.autograd.grad`` over the same outputs and cotangents, the results
    detached), the same tensors allocated, no kernel. A call of the backend less this one's is what its
    own host path adds: the launches' keys, the launch shapes, the partial buffers, the Python between."""

    def _forward(self) -> dict[str, Any]:
        t = self.t
        names = ("x", "residual", "weight", "bias") if self.case.op in ADD_OPS else ("x", "weight", "bias")
        # launch.apply, as the backend's functions: autograd only where a gradient is needed.
        out = launch.apply(_Floor, len(self._heads), *(t.get(name) for name in names))
        return dict(zip(self._heads, out if isinstance(out, tuple) else (out,), strict=True))


@contextlib.contextmanager
def recorded(call: Callable[[], None]) -> Iterator[Callable[[], None]]:
    """``call`` with its launches recorded (each call's record dropped after it): what a benchmark times."""
    with launcher.recording() as launches:

        def once() -> None:
            call()
            launches.clear()

        yield once


@dataclass(frozen=True)
class Census:
    """What one call does on the host besides computing."""

    launches: tuple[str, ...]  # the Triton kernels launched, in order
    h2d_copies: tuple[str, ...]  # operations that copy host memory to the device (_to_copy, tensor, ...)
    torch_kernels: tuple[str, ...]  # torch operations that would launch device work of their own
    # Uninitialized allocations (outputs, statistics, partial buffers): "empty_like [32, 4096] bfloat16".
    allocations: tuple[str, ...]


class _Watch(TorchDispatchMode):  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    """Sorts every aten operation of a call: a copy from the CPU, a view, an allocation, or device work."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.h2d: list[str] = []
        self.kernels: list[str] = []
        self.allocations: list[str] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        sources = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        targets = out if isinstance(out, tuple | list) else (out,)
        to_device = any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in targets)
        if to_device and any(s.device.type == "cpu" for s in sources):
            self.h2d.append(name)
        elif name == "lift_fresh" or name in _VIEWS:
            pass  # a CPU tensor made from Python data (counted where it moves), or a view
        elif name in _ALLOCATIONS:
            self.allocations.append(f"{name} {list(out.shape)} {str(out.dtype).removeprefix('torch.')}")
        else:
            self.kernels.append(name)
        return out


# Tensors made from Python data: with a device, a host-to-device copy that torch makes below the
# dispatcher (a dispatch mode never sees it), so they are watched as the functions they are.
_FROM_HOST_DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray})


class _Factories(TorchFunctionMode):
    """Counts tensors made from Python data directly on a device."""

    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _FROM_HOST_DATA and isinstance(out, torch.Tensor) and out.device.type != "cpu":
            self.into.append(func.__name__)
        return out


def census(call: Callable[[], None]) -> Census:
    """One steady-state call of ``call`` (after one call that fills whatever it caches) watched."""
    with launcher.recording():
        call()
    with launcher.recording() as launches, _Watch() as watch, _Factories(watch.h2d):
        call()
    return Census(
        tuple(launch.kernel for launch in launches),
        tuple(watch.h2d),
        tuple(watch.kernels),
        tuple(watch.allocations),
    )


def seconds_per_call(*calls: Callable[[], None], budget_s: float = 0.5, rounds: int = 7) -> tuple[float, ...]:
    """Per call of each of ``calls`` (launches recorded), the fastest of ``rounds`` rounds of ~budget_s /
    rounds each: the calls' rounds interleaved, so that a slower minute of a shared machine slows each
    alike, and the fastest round, since noise only ever adds time. For the table of ``main``.

    Each round of a call runs inside a recording of its own, cleared after every call. (Recordings
    nest, and a call records into the innermost one: with every call's recording entered at once, the
    first call's launches went into the last call's list, which only that call cleared, so they and
    the tensors they hold piled up through the first call's round, whose every allocation then took
    fresh memory: 16-38 µs more per forward and backward on a 2-core VM, charged to whichever call
    came first, the backend's own beside its floor.)"""
    for call in calls:
        with recorded(call) as once:
            for _ in range(20):
                once()  # warm: caches filled, allocator settled
    best = [math.inf] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            with recorded(call) as once:
                n, start = 0, time.perf_counter()
                while (elapsed := time.perf_counter() - start) < budget_s / rounds:
                    once()
                    n += 1
            best[i] = min(best[i], elapsed / n)
    return tuple(best)


def main() -> None:
    print(f"malloc: {allocator.configure('pinned')}")
    columns = ("host µs/call", "floor µs/call", "above the floor", "launches", "h2d copies", "torch kernels")
    print(" | ".join(("case", "pass", *columns, "allocations")))
    for shape in SHAPES:
        for op in OPS:
            for grad in (False, True):
                c = case(op, shape)
                seen = census(prepared(c, grad=grad))
                ours, floor = seconds_per_call(
                    prepared(c, grad=grad, device="cpu"), prepared(c, grad=grad, device="cpu", floor=True)
                )
                times = (f"{ours * 1e6:.1f}", f"{floor * 1e6:.1f}", f"{(ours - floor) * 1e6:.1f}")
                counts = (seen.launches, seen.h2d_copies, seen.torch_kernels, seen.allocations)
                row = (
                    f"{op} {shape} bf16",
                    "fwd+bwd" if grad else "fwd",
                    *times,
                    *(str(len(c)) for c in counts),
                )
                print(" | ".join(row))


if __name__ == "__main__":
    main()
