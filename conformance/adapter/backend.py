"""The adapter contract: Backend and Prepared protocols, Capabilities, and the two exceptions.

Adapters subclass nothing; they satisfy these Protocols structurally.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from conformance.model.case import BATCH_NORM, FEATURES, GROUP_OPS, Case

Inputs = Mapping[str, np.ndarray]
Outputs = Mapping[str, np.ndarray]
__all__ = [
    "FEATURES",
    "Backend",
    "BackendUnavailable",
    "Capabilities",
    "Inputs",
    "Outputs",
    "Prepared",
    "Unsupported",
]


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine (missing library, no device); carries the reason."""


class Unsupported(RuntimeError):
    """Raised by ``prepare()`` for a case the backend cannot express; never a pass."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend declares it can run; skips come from here, not from test code."""

    ops: frozenset[str]
    dtypes: frozenset[str]
    features: frozenset[str] = frozenset()
    device: str = "cpu"
    device_name: str = ""
    limits: Mapping[str, int] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    # Output -> the input (written in place) or output it may share memory with by design; any other
    # sharing fails the aliasing check (conformance.adapter.memory).
    aliases: Mapping[str, str] = field(default_factory=dict)

    def why_not(self, case: Case, *, grad: bool = False) -> str | None:
        """The reason this backend cannot run ``case`` (with gradients if ``grad``), or None."""
        if case.op not in self.ops:
            return f"op={case.op} not in declared ops {sorted(self.ops)}"
        for name in (case.dtype, case.weight_dtype):
            if name not in self.dtypes:
                return f"dtype={name} not in declared dtypes {sorted(self.dtypes)}"
        needed = set(case.features) | ({"backward"} if grad else set())
        missing = sorted(needed - self.features)
        if missing:
            return f"feature(s) {missing} not declared"
        row = {BATCH_NORM: case.shape[1]}.get(case.op, case.shape[-1])
        if case.op in GROUP_OPS:
            row = math.prod(case.shape[1:]) // case.groups  # the values one group normalizes
        limit = self.limits.get("max_row")
        if limit is not None and row > limit:
            return f"row length {row} exceeds declared limit max_row={limit}"
        return None

    def to_dict(self) -> dict[str, object]:
        return {
            "ops": sorted(self.ops),
            "dtypes": sorted(self.dtypes),
            "features": sorted(self.features),
            "device": self.device,
            "device_name": self.device_name,
            "limits": dict(self.limits),
            "notes": dict(self.notes),
            "aliases": dict(self.aliases),
        }


@runtime_checkable
class Prepared(Protocol):
    """A case made ready to run: inputs on the device, modules built, nothing timed yet."""

    def __call__(self) -> None: ...

    def synchronize(self) -> None: ...

    def outputs(self) -> Outputs: ...


@runtime_checkable
class Backend(Protocol):
    """A normalization implementation under test."""

    name: str

    def capabilities(self) -> Capabilities: ...

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared: ...
