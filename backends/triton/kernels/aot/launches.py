"""The kernel launches the ``triton`` and ``triton-inplace`` backends make for a case on a GPU,
recorded rather than run.

The backends' own prepared cases run, forward and (where the suite asks for it) backward through
autograd, on meta tensors of the case's input shapes and dtypes, with the GPU launch policy of a target
(``blocks.native_policy``); each ``kernel[grid](...)`` call is captured with its arguments instead of
launching. What Triton specializes a compiled kernel on (argument types, constexprs, integer arguments
divisible by 16, pointers aligned to 16 bytes) is then derived from those arguments by Triton's own
binder, in build.py. The process must have chosen ``mode.compile_only()`` before any kernel module
was imported, so that the kernels are decorated for a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from backends.triton.kernels import blocks, mode

if not mode.select().compile_only:
    raise mode.ModeUnavailable(
        "backends.triton.kernels.aot needs backends.triton.kernels.mode.compile_only() first"
    )

import torch
from triton.runtime.jit import JITFunction

from backends.triton import backend as triton_backend
from conformance.adapter.backend import Capabilities
from conformance.model import inputs
from conformance.model.case import Case
from conformance.model.dtypes import DTYPES

# Which backend runs which cases, with or without the backward: the capabilities they declare.
BACKENDS = {
    "triton": Capabilities(triton_backend.OPS, triton_backend.DTYPES, triton_backend.FEATURES),
    "triton-inplace": Capabilities(
        frozenset(triton_backend.IN_PLACE_OPS), triton_backend.DTYPES, triton_backend.IN_PLACE_FEATURES
    ),
}


class Arg:
    """A tensor argument as Triton's specialization sees it: its dtype, a data pointer and its extent.

    The pointer is 0, aligned: every tensor the launches receive is a fresh allocation of the CUDA
    caching allocator (512-byte aligned) or a view of one at offset 0 (``launch.rows`` reshapes
    contiguous tensors). ``ptr_range`` is the storage's extent in bytes (AMD buffer instructions need it
    under 2 GiB)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.dtype = tensor.dtype
        self.nbytes = tensor.untyped_storage().nbytes()

    @staticmethod
    def data_ptr() -> int:
        return 0

    def ptr_range(self) -> int:
        return self.nbytes


@dataclass(frozen=True)
class Launch:
    """One recorded ``kernel[grid](*args, **kwargs)``: tensors replaced by Args."""

    kernel: Any  # the JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    programs: int  # the grid size (one-dimensional in every launch of these kernels)
    case: str  # id of the case that made it
    backward: bool  # made while running the backward

    @property
    def name(self) -> str:
        return str(self.kernel.__name__)

    @property
    def warps(self) -> int:
        return int(self.kwargs.get("num_warps", 4))


# kernel, arguments, keyword arguments, grid size
_Call = tuple[Any, tuple[Any, ...], dict[str, Any], int]


@contextlib.contextmanager
def _recording(into: list[_Call]) -> Iterator[None]:
    """Replace JITFunction.run (what ``kernel[grid](...)`` calls) by a recorder, for the block only."""
    original = JITFunction.run

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        programs = grid[0] if isinstance(grid, tuple) else grid
        wrapped = tuple(Arg(a) if isinstance(a, torch.Tensor) else a for a in args)
        into.append((self, wrapped, dict(kwargs), int(programs)))

    JITFunction.run = record
    try:
        yield
    finally:
        JITFunction.run = original


def _tensors(case: Case, grad: bool) -> dict[str, torch.Tensor]:
    torch_dtypes = {name: getattr(torch, name) for name in DTYPES}
    made = {}
    for name, (shape, dtype) in inputs.specs(case, grad=grad).items():
        made[name] = torch.empty(shape, dtype=torch_dtypes[dtype], device="meta")
    return made


def launches(case: Case, backend: str, policy: blocks.Policy) -> list[Launch]:
    """Every launch ``backend`` makes for ``case``: the forward alone, then forward and backward where
    it declares the backward (only the launches after the forward's are marked backward); none where
    it cannot run the case. The forward under autograd launches the forward's kernels again; where it
    gives them other constexprs (SAVE_STATS: it keeps what the backward reads) they are recorded
    again, as forward launches."""
    caps = BACKENDS[backend]
    recorded: list[Launch] = []
    forward: list[tuple[str, dict[str, Any]]] = []  # (kernel, options) of the forward's launches
    for grad in (False, True):
        if caps.why_not(case, grad=grad) is not None:
            continue
        calls = _record(case, backend, policy, grad)
        again = [(c[0].__name__, c[2]) for c in calls[: len(forward)]] if grad else []
        if [name for name, _ in again] != [name for name, _ in forward]:
            raise RuntimeError(
                f"{backend} on {case.id}: the forward under autograd launches {again}, not the "
                f"forward's own kernels {forward}; the backward's launches cannot be told apart"
            )
        for i, (kernel, args, kwargs, programs) in enumerate(calls):
            if i < len(again) and again[i] == forward[i]:
                continue  # the forward's launch again, as autograd runs it
            recorded.append(Launch(kernel, args, kwargs, programs, case.id, grad and i >= len(forward)))
        if not grad:
            forward = [(c[0].__name__, c[2]) for c in calls]
    return recorded


def _record(case: Case, backend: str, policy: blocks.Policy, grad: bool) -> list[_Call]:
    run = mode.select()
    tensors = _tensors(case, grad)
    prepared: Any
    if backend == "triton":
        prepared = triton_backend.TritonPrepared(case, tensors, grad, run, policy)
    else:
        prepared = triton_backend.InPlacePrepared(case, tensors, run, policy)
    calls: list[_Call] = []
    with _recording(calls):
        prepared()
    return calls
