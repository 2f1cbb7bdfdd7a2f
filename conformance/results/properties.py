"""The ``property`` record: one backend's outcome for one metamorphic property."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.results.schema import count_field, figure, jsonable, string_field


@dataclass(frozen=True)
class PropertyRecord:
    """One property on one backend: outcome, examples run, worst ratio, whether related outputs were
    identical bit for bit in every example (None when the property compares with closed forms)."""

    backend: str
    property: str
    outcome: str  # passed | failed | xfailed | unsupported | skipped | error
    reason: str = ""
    examples: int = 0
    worst_ratio: float = 0.0
    bitwise: bool | None = None
    counterexample: Mapping[str, Any] | None = None
    duration_s: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @builtins.property  # the field ``property`` shadows the builtin in this class body
    def cell(self) -> str:
        """The outcome in a table (``-`` not run)."""
        return {"unsupported": "-", "skipped": "-"}.get(self.outcome, self.outcome)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "property",
            "backend": self.backend,
            "property": self.property,
            "outcome": self.outcome,
            "reason": self.reason,
            "examples": self.examples,
            "worst_ratio": jsonable(self.worst_ratio),
            "bitwise": self.bitwise,
            "counterexample": dict(self.counterexample) if self.counterexample is not None else None,
            "duration_s": round(self.duration_s, 6),
            **({"extra": dict(self.extra)} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PropertyRecord:
        counterexample = raw.get("counterexample")
        bitwise = raw.get("bitwise")
        extra = raw.get("extra") or {}
        return cls(
            string_field(raw, "backend", "?"),
            string_field(raw, "property", "?"),
            string_field(raw, "outcome", "error"),
            string_field(raw, "reason"),
            count_field(raw, "examples"),
            figure(raw.get("worst_ratio", 0.0)),
            bitwise if isinstance(bitwise, bool) else None,
            dict(counterexample) if isinstance(counterexample, Mapping) else None,
            figure(raw.get("duration_s", 0.0)),
            dict(extra) if isinstance(extra, Mapping) else {},
        )
