"""Where an adapter's inputs and outputs live during a call: the evidence of the aliasing check.

An adapter reports its buffers through the optional ``Prepared.buffers()``: a mapping from input and
output names (``x``, ``residual``, ``dy``, ``y``, ``residual_out``, ``dx``, ...) to the objects the
backend computes with: torch tensors, NumPy or CuPy arrays, anything with ``__array_interface__``,
``__cuda_array_interface__`` or ``data_ptr()``, or a plain ``(address, nbytes)`` pair. Without it the
check sees what crosses the contract: the NumPy inputs handed to ``prepare()`` and the arrays
``outputs()`` returns (which, on the CPU, are often the backend's own memory).

Contents are read only from host memory the object itself vouches for (a NumPy array, a CPU tensor):
an address alone is never dereferenced. Device buffers are judged by their address ranges.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np


class UnlocatableBuffer(TypeError):
    """An entry of ``buffers()`` is not something whose memory can be located."""


@dataclass(frozen=True)
class Span:
    """A byte range [low, high) in one address space (``device``: "cpu", "cuda:0", ...)."""

    low: int
    high: int
    device: str = "cpu"

    def overlaps(self, other: Span) -> bool:
        if self.device != other.device or self.high <= self.low or other.high <= other.low:
            return False
        return self.low < other.high and other.low < self.high


def _extent(address: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """[low, high) of a strided array in bytes (strides in bytes; an empty array spans nothing)."""
    if any(d == 0 for d in shape):
        return address, address
    low = address + sum(min(0, (d - 1) * s) for d, s in zip(shape, strides, strict=True))
    high = address + sum(max(0, (d - 1) * s) for d, s in zip(shape, strides, strict=True)) + itemsize
    return low, high


def _interface(info: Mapping[str, object], device: str) -> Span:
    address = int(info["data"][0])  # type: ignore[index]
    shape = tuple(int(d) for d in info["shape"])  # type: ignore[attr-defined]
    itemsize = np.dtype(str(info["typestr"])).itemsize
    strides = info.get("strides")
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) * itemsize for i in range(len(shape)))
    low, high = _extent(address, shape, tuple(int(s) for s in strides), itemsize)  # type: ignore[attr-defined]
    return Span(low, high, device)


def _tensor_device(obj: object) -> str:
    device = getattr(obj, "device", "cpu")
    return str(device)


def span(name: str, obj: object) -> Span:
    """The memory ``obj`` occupies; UnlocatableBuffer naming ``name`` when it cannot be located."""
    if isinstance(obj, np.ndarray):
        return _interface(obj.__array_interface__, "cpu")
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(v, int) for v in obj):
        return Span(obj[0], obj[0] + obj[1])
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride") and hasattr(obj, "element_size"):
        # A torch tensor: strides in elements.
        size = int(obj.element_size())
        shape = tuple(int(d) for d in obj.shape)  # type: ignore[attr-defined]
        strides = tuple(int(s) * size for s in obj.stride())
        low, high = _extent(int(obj.data_ptr()), shape, strides, size)
        return Span(low, high, _tensor_device(obj))
    for attribute, device in (("__cuda_array_interface__", "cuda"), ("__array_interface__", "cpu")):
        info = getattr(obj, attribute, None)
        if isinstance(info, Mapping):
            return _interface(info, device)
    raise UnlocatableBuffer(
        f"buffers()[{name!r}] is {type(obj).__name__}; expected an array or tensor (__array_interface__, "
        "__cuda_array_interface__ or data_ptr()) or an (address, nbytes) pair"
    )


def contents(obj: object, where: Span) -> bytes | None:
    """The bytes of host memory ``obj`` owns, or None where they cannot be read safely (a device
    buffer, a bare address)."""
    if where.device != "cpu" or isinstance(obj, tuple):
        return None
    if isinstance(obj, np.ndarray) or hasattr(obj, "data_ptr"):
        return ctypes.string_at(where.low, where.high - where.low) if where.high > where.low else b""
    return None


@dataclass
class Watch:
    """Spans of the inputs and outputs of one call, and the inputs' bytes before and after it."""

    inputs: dict[str, Span] = field(default_factory=dict)
    outputs: dict[str, Span] = field(default_factory=dict)
    before: dict[str, bytes | None] = field(default_factory=dict)
    after: dict[str, bytes | None] = field(default_factory=dict)
    reported: bool = False  # whether the adapter's buffers() gave them
    _objects: dict[str, object] = field(default_factory=dict)

    @classmethod
    def start(cls, prepared: object, given: Mapping[str, np.ndarray], outputs: tuple[str, ...]) -> Watch:
        """Read the inputs' places and bytes after prepare(), before the call."""
        reported = getattr(prepared, "buffers", None)
        watch = cls(reported=reported is not None)
        objects: Mapping[str, object] = given if reported is None else _mapping(reported())
        for name, obj in objects.items():
            if name in outputs and name not in given:
                continue  # an output reported now is placed after the call
            watch._objects[name] = obj
            watch.inputs[name] = span(name, obj)
            watch.before[name] = contents(obj, watch.inputs[name])
        return watch

    def finish(self, prepared: object, returned: Mapping[str, object], outputs: tuple[str, ...]) -> None:
        """After the call: the outputs' places (reported, or the returned arrays) and the inputs' bytes."""
        objects: Mapping[str, object] = returned
        if self.reported:
            objects = {**returned, **_mapping(prepared.buffers())}  # type: ignore[attr-defined]
        for name in outputs:
            if name in objects:
                self.outputs[name] = span(name, objects[name])
        for name, obj in self._objects.items():
            self.after[name] = contents(obj, self.inputs[name])


def _mapping(value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise UnlocatableBuffer(
            f"buffers() returned {type(value).__name__}, expected a mapping of names to buffers"
        )
    return value


def _declared(aliases: Mapping[str, str], a: str, b: str) -> bool:
    return aliases.get(a) == b or aliases.get(b) == a


def problems(
    watch: Watch,
    aliases: Mapping[str, str],
    given: Mapping[str, np.ndarray],
    returned: Mapping[str, np.ndarray],
) -> list[str]:
    """Undeclared sharing, undeclared writes, and declared in-place inputs that do not hold their output.

    ``aliases`` is ``Capabilities.aliases`` (output -> the input or output it may share memory with);
    ``given`` the inputs as handed to prepare(); ``returned`` host copies of the outputs.
    """
    found = []
    for out, place in watch.outputs.items():
        for name, other in watch.inputs.items():
            if place.overlaps(other) and aliases.get(out) != name:
                found.append(
                    f"output {out!r} shares memory with input {name!r}; an in-place write must be declared "
                    f"(Capabilities.aliases={{{out!r}: {name!r}}})"
                )
    names = sorted(watch.outputs)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if watch.outputs[first].overlaps(watch.outputs[second]) and not _declared(aliases, first, second):
                found.append(
                    f"outputs {first!r} and {second!r} share memory: writing one changes the other "
                    f"(declare Capabilities.aliases={{{second!r}: {first!r}}} if that is by design)"
                )
    targets = {target: out for out, target in aliases.items() if target in watch.inputs}
    for name in watch.inputs:
        before, after = watch.before.get(name), watch.after.get(name)
        if before is None or after is None or before == after:
            continue
        if name not in targets:
            found.append(f"input {name!r} was written by the call, and no output declares it as its buffer")
            continue
        found += _holds(name, targets[name], after, given, returned)
    return found


def _holds(
    name: str, out: str, after: bytes, given: Mapping[str, np.ndarray], returned: Mapping[str, np.ndarray]
) -> list[str]:
    """A declared in-place input must hold, bit for bit, the value returned as its output."""
    if name not in given or out not in returned:
        return []
    dtype, shape = given[name].dtype, given[name].shape
    if len(after) != given[name].nbytes:
        return []  # a strided buffer: its bytes are not one dense array to compare
    now = np.frombuffer(after, dtype=dtype).reshape(shape)
    value = np.asarray(returned[out]).astype(dtype)
    if now.shape == value.shape and np.array_equal(now.view(np.uint8), value.view(np.uint8)):
        return []
    return [f"input {name!r} is declared as {out!r}'s buffer but does not hold the {out!r} returned"]
