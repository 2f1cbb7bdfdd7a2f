"""Every kernel launch of this package: ``launch(kernel, programs, *args, **options)`` is
``kernel[(programs,)](*args, **options)`` with two additions. The row kernels' launches go through
``launch_with(kernel, programs, args, options)`` with ``Options`` made once per distinct set of options
and kept, so that no launch builds its options again or hashes them item by item.

Recording: inside ``recording()`` a launch is appended to a list instead of run. The host-overhead
benchmark (backends/triton/kernels/host.py) times the autograd wrappers that way on any machine: what a
call costs on the host besides the launches themselves, and how many launches it makes.

Bound launches (native runs on NVIDIA GPUs): Triton's ``kernel[grid](...)`` (``JITFunction.run``) binds
every argument, computes the specialization key, looks the compiled kernel up and builds launch metadata
on every call. Here the first launch of a key goes through it and keeps the ``CompiledKernel`` it
returns; later launches with the same key call that kernel's launcher (``CompiledKernel.run``) directly,
with the arguments in the kernel's parameter order, as ``JITFunction.run`` itself calls it. The key is
finer than Triton's specialization (each tensor's dtype and 16-byte alignment, every other argument's
exact value, the launch options, the device), so a hit never launches a kernel compiled for
other arguments; a miss is Triton's own path. The launcher's signature ``(gridX, gridY, gridZ, stream,
function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)`` is the same in Triton 3.6 (the
GPU image) and 3.9 (this project's pin). Triton's launch hooks (a profiler such as proton adds them) need
launch metadata: while any is installed, every launch takes Triton's path. So does a kernel whose
compiled object lacks the attributes used here (another Triton), with the reason kept in ``unbound``.
Under the interpreter, for ahead-of-time compilation (meta tensors) and on ROCm (whose launches
specialize on buffer sizes too), every launch takes Triton's path.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

# A bound kernel keeps at most this many keys (shapes of the ci profile stay far below it); past it the
# cache starts afresh rather than grow with every shape a long-lived process sees.
MAX_KEYS = 4096


class Launch(NamedTuple):
    """One launch as recorded: the kernel, the grid size, the arguments and the options (constexprs and
    launch options), as passed. (A named tuple: recording one costs what a launch's own bookkeeping
    would, not more.)"""

    function: Any  # the JITFunction (or the interpreter's)
    programs: int
    args: tuple[Any, ...]
    options: Mapping[str, Any]

    @property
    def kernel(self) -> str:
        return str(getattr(self.function, "__name__", self.function))

    @property
    def tensors(self) -> tuple[str | None, ...]:
        """Each argument's dtype where it is a tensor, else None."""
        return tuple(str(a.dtype) if isinstance(a, torch.Tensor) else None for a in self.args)


class Options(Mapping[str, Any]):
    """Launch options (constexprs, num_warps, maxnreg) made once per distinct set and kept read-only by
    whoever made them (an lru_cache): a launch key holds the object itself, hashed once here. Equal to
    another ``Options`` with the same items in the same order (each launch site names its options in
    one order), never to a plain dict; a kept one is found by identity first."""

    __slots__ = ("_hash", "_items")

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._items = dict(options)
        self._hash = hash(tuple(self._items.items()))

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, Options) and self._hash == other._hash and self._items == other._items

    def __repr__(self) -> str:
        return f"Options({self._items!r})"


_recorded: list[Launch] | None = None


@contextlib.contextmanager
def recording() -> Iterator[list[Launch]]:
    """Within the block, launches are recorded into the list yielded and not run."""
    global _recorded
    outer, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = outer


def key(args: tuple[Any, ...], options: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a bound launch is looked up by: per argument, a tensor's dtype and whether its address is
    16-byte aligned (what Triton specializes pointers on: the dtype alone while every pointer is, a
    (dtype, aligned) pair each when one is not), anything else by value (each position of these
    kernels takes one type: an int, or None); then the options (constexprs, num_warps, maxnreg): a kept
    ``Options`` as itself, a plain mapping as its items."""
    tensor = torch.Tensor
    named = options if isinstance(options, Options) else tuple(options.items())
    # Each tensor by its dtype while every pointer is aligned (the common case: one pass, no pair per
    # tensor); otherwise by (dtype, aligned), so that keys differ in which pointers are.
    values, low = [], 0
    for a in args:
        if isinstance(a, tensor):
            values.append(a.dtype)
            low |= a.data_ptr()
        else:
            values.append(a)
    if low & 15:
        return tuple([(a.dtype, not a.data_ptr() & 15) if isinstance(a, tensor) else a for a in args]), named
    return tuple(values), named


class Driver:
    """The calls a bound launch needs from Triton's active driver (a Protocol's worth: tests pass fakes)."""

    def __init__(self, current_device: Callable[[], int], current_stream: Callable[[int], Any]) -> None:
        self.current_device = current_device
        self.current_stream = current_stream


@functools.cache
def _runtime_knobs() -> Any:
    # Imported at the first native launch (this module is imported without Triton for recording), then
    # kept: an import statement per launch is a module lookup on every call.
    from triton import knobs

    return knobs.runtime


def _hooks_installed() -> bool:
    runtime = _runtime_knobs()
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


@dataclass
class Bound:
    """One kernel's compiled launches by key (native runs only)."""

    kernel: Any  # the JITFunction
    driver: Driver
    hooks_installed: Callable[[], bool] = _hooks_installed
    # key -> (launcher, function, packed metadata, the options' values in parameter order)
    compiled: dict[tuple[Any, ...], tuple[Any, Any, Any, tuple[Any, ...]]] = field(default_factory=dict)
    unbound: str | None = None  # why launches always take Triton's path, once known
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = getattr(self.kernel, "arg_names", None)
        if names is None:
            self.unbound = f"{type(self.kernel).__name__} has no arg_names"
        else:
            self.names = tuple(names)

    def launch(self, programs: int, args: tuple[Any, ...], options: Mapping[str, Any]) -> None:
        if self.unbound is not None or self.hooks_installed():
            self.kernel[(programs,)](*args, **options)
            return
        device = self.driver.current_device()
        k = (device, key(args, options))
        hit = self.compiled.get(k)
        if hit is None:
            self._first(k, programs, args, options)
            return
        runner, function, packed, tail = hit
        # The options are part of the key: their values in parameter order were taken at the first launch.
        stream = self.driver.current_stream(device)
        runner(programs, 1, 1, stream, function, packed, None, None, None, *args, *tail)

    def _first(
        self, k: tuple[Any, ...], programs: int, args: tuple[Any, ...], options: Mapping[str, Any]
    ) -> None:
        """Triton's own launch; keeps what a later launch with the same key needs."""
        compiled = self.kernel.run(*args, grid=(programs,), warmup=False, **options)
        missing = [n for n in self.names[len(args) :] if n not in options]
        if missing:
            # A parameter left to its default: JITFunction.run binds it, a bound launch could not.
            self.unbound = f"parameters {missing} were not passed by name"
            return
        tail = tuple(options[n] for n in self.names[len(args) :])
        try:
            entry = (compiled.run, compiled.function, compiled.packed_metadata, tail)
        except AttributeError as exc:
            self.unbound = f"the compiled kernel has no {exc.name}: launches take Triton's path"
            return
        if len(self.compiled) >= MAX_KEYS:
            self.compiled.clear()
        self.compiled[k] = entry


@dataclass
class _Native:
    """Whether launches here are native on NVIDIA (bound), decided at the first launch."""

    decided: bool = False
    bound: bool = False
    driver: Driver | None = None
    kernels: dict[int, Bound] = field(default_factory=dict)

    def decide(self) -> None:
        from backends.triton.kernels import mode

        run = mode.select()
        self.decided = True
        if run.interpreted or run.compile_only:
            return
        from triton.runtime import driver

        if torch.version.hip is not None:
            return
        active = driver.active
        self.driver = Driver(active.get_current_device, active.get_current_stream)
        self.bound = True


_NATIVE = _Native()


def launch(kernel: Any, programs: int, *args: Any, **options: Any) -> None:
    """``kernel[(programs,)](*args, **options)``: recorded inside ``recording()``, a bound launch where
    the module docstring says so. Constexprs and launch options go by name, tensors and runtime scalars
    by position (the bound launch hands them to the compiled kernel in the kernel's parameter order)."""
    launch_with(kernel, programs, args, options)


def launch_with(kernel: Any, programs: int, args: tuple[Any, ...], options: Mapping[str, Any]) -> None:
    """``launch`` with the arguments as a tuple and the options as a mapping (an ``Options`` kept by the
    caller, for the launches made on every call)."""
    if _recorded is not None:
        key(args, options)  # what a bound launch spends on its key, so that the host timing includes it
        _recorded.append(Launch(kernel, programs, args, options))
        return
    if not _NATIVE.decided:
        _NATIVE.decide()
    if not _NATIVE.bound:
        kernel[(programs,)](*args, **options)
        return
    bound = _NATIVE.kernels.get(id(kernel))
    if bound is None:
        assert _NATIVE.driver is not None
        bound = _NATIVE.kernels[id(kernel)] = Bound(kernel, _NATIVE.driver)
    bound.launch(programs, args, options)


def unbound() -> dict[str, str]:
    """Kernels whose launches take Triton's path, with the reason (empty where every launch is bound or
    none is native)."""
    return {str(b.kernel.__name__): b.unbound for b in _NATIVE.kernels.values() if b.unbound is not None}
