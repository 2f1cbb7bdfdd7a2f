"""The ``fingerprint`` record: one backend's answer to one fingerprint question, with its evidence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.results.schema import figure, jsonable, string_field

# The answer of a question whose probe's dtype the backend does not compute in (the fingerprint's gates).
NOT_ASKABLE = "not askable: executes in "


@dataclass(frozen=True)
class FingerprintRecord:
    """One backend's answer to one fingerprint question, with the evidence (error under each hypothesis)."""

    backend: str
    question: str
    outcome: str  # answered | unsupported | skipped | error
    answer: str = ""
    matched: bool = False
    reference: str = ""
    evidence: Mapping[str, float] = field(default_factory=dict)
    metric: str = ""
    noise: float = 0.0
    probe: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    estimate: float | None = None
    duration_s: float = 0.0

    @property
    def differs(self) -> bool:
        """Answered with a matched convention other than normconf's reference semantics."""
        return (
            self.outcome == "answered"
            and self.matched
            and bool(self.reference)
            and self.answer != self.reference
        )

    @property
    def cell(self) -> str:
        """The answer in a table: ``*`` differs from the reference, ``?`` no hypothesis matched, ``-`` not
        asked, ``~e?`` an unmatched default eps with its estimate."""
        if self.outcome != "answered":
            return {"unsupported": "-", "skipped": "-", "error": "error"}.get(self.outcome, self.outcome)
        if self.answer == "unmatched" and self.estimate is not None:
            return f"~{self.estimate:.3g}?"
        if self.answer.startswith(NOT_ASKABLE):
            return "not askable: " + self.answer.removeprefix(NOT_ASKABLE)
        if not self.matched:
            return self.answer.split(":")[0] + "?"
        return f"{self.answer}*" if self.differs else self.answer

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "kind": "fingerprint",
            "backend": self.backend,
            "question": self.question,
            "outcome": self.outcome,
            "answer": self.answer,
            "matched": self.matched,
            "reference": self.reference,
            "evidence": {name: jsonable(error) for name, error in self.evidence.items()},
            "metric": self.metric,
            "noise": self.noise,
            "probe": self.probe.get("id", ""),
            "probe_case": dict(self.probe),
            "reason": self.reason,
            "duration_s": round(self.duration_s, 6),
        }
        if self.estimate is not None:
            record["estimate"] = jsonable(self.estimate)
        return record

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FingerprintRecord:
        evidence = raw.get("evidence") or {}
        probe = raw.get("probe_case") or {}
        estimate = raw.get("estimate")
        return cls(
            string_field(raw, "backend", "?"),
            string_field(raw, "question", "?"),
            string_field(raw, "outcome", "error"),
            string_field(raw, "answer"),
            raw.get("matched") is True,
            string_field(raw, "reference"),
            {str(k): figure(v) for k, v in evidence.items()} if isinstance(evidence, Mapping) else {},
            string_field(raw, "metric"),
            figure(raw.get("noise", 0.0)),
            dict(probe) if isinstance(probe, Mapping) else {},
            string_field(raw, "reason"),
            None if estimate is None else figure(estimate),
            figure(raw.get("duration_s", 0.0)),
        )
