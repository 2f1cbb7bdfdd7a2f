"""From comparisons to a verdict: each output against the oracle, then the ledger of known deviations.

``compare_outputs`` is shared by the checks, the failure shrinker and replay; ``judge`` applies the
ledger: covered failures inside their band are xfailed, a covered output that passes is xpassed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from conformance.judging import messages
from conformance.judging.allowance import factors
from conformance.judging.compare import compare
from conformance.judging.ledger import Ledger
from conformance.judging.tolerances import ToleranceTable
from conformance.model.case import Case
from conformance.model.outputs import output_dtype
from conformance.results.records import ComparisonRecord


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check with its comparisons and, per output, the ledger entry that applied.

    ``warnings``, ``info``, ``bundle`` and ``hung`` are filled in by the running layer (what the adapter
    emitted and reported, where a failure bundle was saved, and what did not finish within the call
    timeout).
    """

    outcome: str
    reason: str = ""
    comparisons: tuple[ComparisonRecord, ...] = ()
    ledger: Mapping[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    info: Mapping[str, object] = field(default_factory=dict)
    bundle: str = ""
    hung: str = ""


def compare_outputs(
    case: Case,
    inputs: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    names: tuple[str, ...],
    tolerances: ToleranceTable,
) -> tuple[ComparisonRecord, ...]:
    """Each named output against the oracle under its tolerance rule."""
    return tuple(
        compare(
            name,
            actual[name],
            expected[name],
            tolerances.lookup(case.op, name, output_dtype(case, name), case.dist),
            output_dtype(case, name),
            factors(case, name, inputs, expected),
        )
        for name in names
    )


def judge(
    backend: str,
    case: Case,
    check: str,
    comparisons: tuple[ComparisonRecord, ...],
    ledger: Ledger,
    reproduce: str,
    info: Mapping[str, object] | None = None,
) -> Verdict:
    """Apply the ledger: covered failures inside their band are xfailed; a covered pass is xpassed.
    ``info`` is what the backend recorded for the case (entries may require it)."""
    entries = {c.output: e for c in comparisons if (e := ledger.find(backend, case, check, c.output, info))}
    stale = [c for c in comparisons if c.passed and c.output in entries]
    if stale:
        # The entry the message names: the first output that passed although an entry expects it to fail.
        first = stale[0]
        text = messages.stale(backend, case, check, first, entries[first.output], reproduce)
        return Verdict("xpassed", text, comparisons, {first.output: entries[first.output].index})
    failing = [c for c in comparisons if not c.passed]
    if not failing:
        return Verdict("passed", "", comparisons)
    cited = {c.output: entries[c.output].index for c in failing if c.output in entries}
    if all(c.output in entries and entries[c.output].covers(c) for c in failing):
        reasons = "; ".join(
            f"{c.output}: {entries[c.output].reason} (ledger deviation[{entries[c.output].index}])"
            for c in failing
        )
        return Verdict("xfailed", reasons, comparisons, cited)
    text = "\n\n".join(
        messages.failure(backend, case, check, c, entries.get(c.output), reproduce) for c in failing
    )
    return Verdict("failed", text, comparisons, cited)
