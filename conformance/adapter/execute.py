"""Run a backend's prepare/call/outputs under a deadline and validate what comes back.

A hung adapter must cost one case, not the run: the work runs in a daemon thread that is
abandoned on timeout (a daemon thread never blocks interpreter exit).
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from conformance.adapter import memory
from conformance.adapter.backend import Backend, Unsupported
from conformance.model.case import Case

T = TypeVar("T")


class AdapterError(RuntimeError):
    """The adapter raised, hung or returned something outside the contract."""


class CallTimeout(AdapterError):
    """The adapter did not finish within the configured timeout."""


@dataclass(frozen=True)
class Execution:
    """Outputs of each call (host copies, taken right after each call), the inputs as left, and
    the warnings the adapter emitted (recorded, never raised: they are the adapter's business)."""

    outputs: tuple[dict[str, np.ndarray], ...]
    inputs: dict[str, np.ndarray]
    warnings: tuple[str, ...] = ()
    info: Mapping[str, object] = field(default_factory=dict)
    watch: memory.Watch | None = None  # where the first call's inputs and outputs lived (``watch=True``)
    # Seconds in prepare() and in the calls (call, synchronize, outputs and their host copies): the
    # profile's figures (normconf profile). A timed-out run has none.
    prepare_s: float = 0.0
    call_s: float = 0.0


def with_deadline(work: Callable[[], T], timeout: float, what: str) -> T:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"normconf:{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CallTimeout(f"{what} did not finish within {timeout:g} s (--call-timeout)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def run_backend(
    backend: Backend,
    case: Case,
    inputs: Mapping[str, np.ndarray],
    *,
    grad: bool,
    calls: int,
    expected_shapes: Mapping[str, tuple[int, ...]],
    timeout: float,
    watch: bool = False,
) -> Execution:
    """prepare once, then ``calls`` x (call, synchronize, outputs); Unsupported passes through.

    ``watch``: also record where the first call's inputs and outputs live (conformance.adapter.memory).
    """
    given = {k: np.array(v, copy=True) for k, v in inputs.items()}
    names = tuple(expected_shapes)
    watched: list[memory.Watch] = []

    seconds = {"prepare": 0.0, "call": 0.0}

    def work() -> tuple[tuple[dict[str, np.ndarray], ...], dict[str, object]]:
        start = time.perf_counter()
        prepared = _stage("prepare", lambda: backend.prepare(case, given, grad=grad), passthrough=True)
        seconds["prepare"] = time.perf_counter() - start
        if watch:
            watched.append(_stage("buffers", lambda: memory.Watch.start(prepared, given, names)))
        results: list[dict[str, np.ndarray]] = []
        for _ in range(calls):
            start = time.perf_counter()
            _stage("__call__", prepared)
            _stage("synchronize", prepared.synchronize)
            outputs = _stage("outputs", prepared.outputs)
            checked = _validated(outputs, expected_shapes)
            seconds["call"] += time.perf_counter() - start
            if watched and not results:
                _stage("buffers", functools.partial(watched[0].finish, prepared, outputs, names))
            results.append(checked)
        return tuple(results), _info(prepared)

    # The catcher lives in this thread, so a timed-out worker cannot leave the filters changed.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs, info = with_deadline(work, timeout, f"{backend.name} {case.id}")
    seen = dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught)
    found = watched[0] if watched else None
    return Execution(outputs, given, tuple(seen), info, found, seconds["prepare"], seconds["call"])


def _info(prepared: object) -> dict[str, object]:
    """The optional ``Prepared.info()``: what the adapter chose for this case (opset, provider, mode)."""
    info = getattr(prepared, "info", None)
    if info is None:
        return {}
    value = _stage("info", info)
    if not isinstance(value, Mapping):
        raise AdapterError(f"info() returned {type(value).__name__}, expected a mapping")
    # Exact types only: a str or float subclass (torch's TorchVersion) would not cross xdist's wire.
    plain = (str, int, float, bool, type(None))
    return {str(k): v if type(v) in plain else str(v) for k, v in value.items()}


def _stage(stage: str, fn: Callable[[], T], *, passthrough: bool = False) -> T:
    try:
        return fn()
    except Unsupported:
        if passthrough:
            raise
        raise AdapterError(f"Unsupported raised from {stage}(); it is honoured only from prepare()") from None
    except Exception as exc:
        raise AdapterError(f"{stage}() raised {type(exc).__name__}: {exc}") from exc


def _validated(outputs: object, expected: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    if not isinstance(outputs, Mapping):
        raise AdapterError(f"outputs() returned {type(outputs).__name__}, expected a mapping of NumPy arrays")
    missing = sorted(set(expected) - set(outputs))
    if missing:
        raise AdapterError(f"outputs() is missing {missing}; returned keys {sorted(outputs)}")
    checked = {}
    for name, shape in expected.items():
        value = outputs[name]
        if not isinstance(value, np.ndarray):
            raise AdapterError(f"output {name!r} is {type(value).__name__}, expected a NumPy array")
        if not _is_float(value):
            raise AdapterError(f"output {name!r} has dtype {value.dtype}, expected a floating dtype")
        if value.shape != tuple(shape):
            raise AdapterError(f"output {name!r} has shape {value.shape}, expected {tuple(shape)}")
        # Copy now: a later call may reuse the buffer behind the returned array.
        checked[name] = np.array(value, copy=True)
    return checked


def _is_float(value: np.ndarray) -> bool:
    return np.issubdtype(value.dtype, np.floating) or value.dtype.name == "bfloat16"
