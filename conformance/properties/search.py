"""Run a metamorphic property against one backend under Hypothesis, reproducibly and within a budget.

Examples are drawn with a fixed seed per property (its name's CRC-32, not Hypothesis's derandomized
seed, which hashes the search function's source: an edit to it would change every draw), no example
database and no deadline, so two runs and two versions of normconf draw the same examples; a failure
is shrunk by Hypothesis and reported with the smallest example found within the shrinking budget.
Hypothesis is imported when a property runs, never when conformance is imported.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.adapter.backend import Backend, Capabilities, Unsupported
from conformance.adapter.execute import AdapterError
from conformance.judging import platform
from conformance.judging.ledger import Deviation, Ledger
from conformance.properties.catalog import EPSILONS, Example, Property, PropertyContext, Violation
from conformance.results.properties import PropertyRecord

# Examples per property and backend in each profile (times the property's weight): a few seconds
# per backend in `ci` for the torch adapters on a CPU.
BUDGET: dict[str, int] = {"smoke": 4, "ci": 25, "full": 100}
# Seconds one property may spend on one backend before it stops drawing new examples (a backend that
# compiles every new shape would otherwise take minutes); a failure found is always shrunk.
SECONDS: dict[str, float] = {"smoke": 2.0, "ci": 3.0, "full": 120.0}
# Seconds shrinking a failure may take once it is found. Past them, candidates not yet seen failing
# are not run (the shrinker then stops at the smallest failing example it has), while an example
# seen failing still runs, so Hypothesis's final replay of the reported example runs the backend.
# Without it Hypothesis shrinks for up to five minutes per failure.
SHRINK_SECONDS: dict[str, float] = {"smoke": 10.0, "ci": 20.0, "full": 60.0}


@dataclass
class _Tally:
    examples: int = 0
    worst: float = 0.0
    bitwise: bool = True
    rejected: list[str] = field(default_factory=list)
    known: list[tuple[Deviation, float]] = field(default_factory=list)
    differing: Mapping[str, Any] | None = None  # the first passing example whose bits differed
    failing: bool = False
    out_of_time: int = 0  # examples drawn after the time budget ran out, not run
    shrink_seconds: float = math.inf  # how long shrinking runs new candidates after the first failure
    shrink_stop: float = math.inf  # when it stops (set by the first failure)
    seen_failing: set[Example] = field(default_factory=set)
    shrink_out_of_time: int = 0  # shrink candidates not run, the shrinking budget spent


def strategy(prop: Property, caps: Capabilities) -> Any:
    """Examples for ``prop`` within what the backend declares (its ops and dtypes)."""
    from hypothesis import strategies as st

    # Only GN/IN properties draw group shapes, so the other properties draw the examples they always did.
    shape = {"groups": st.integers(*prop.groups), "width": st.integers(*prop.width)} if prop.grouped else {}
    return st.builds(
        Example,
        op=st.sampled_from([op for op in prop.ops if op in caps.ops]),
        dtype=st.sampled_from(sorted(caps.dtypes)),
        rows=st.integers(*prop.rows),
        features=st.integers(*prop.features),
        seed=st.integers(0, 2**16),
        eps=st.sampled_from(EPSILONS),
        knob=st.integers(*prop.knob),
        flag=st.booleans(),
        **shape,
    )


def check(
    backend: Backend,
    caps: Capabilities,
    prop: Property,
    ctx: PropertyContext,
    max_examples: int,
    ledger: Ledger | None = None,
    seconds: float | None = None,
    shrink_seconds: float | None = None,
) -> PropertyRecord:
    """Run ``prop`` on ``backend`` for up to ``max_examples`` examples; never raises for the adapter.

    A failing example that a ledger entry for this backend and property covers (within its band)
    is a known deviation: the search goes on, and the result is xfailed if nothing else fails.
    After ``seconds`` no new example runs (at least one does; the count run is recorded) unless a
    failure is being shrunk; shrinking stops running new candidates after ``shrink_seconds``.
    """
    start = time.perf_counter()
    base = {"backend": backend.name, "property": prop.name}
    if not any(op in caps.ops for op in prop.ops) or not caps.dtypes:
        reason = (
            f"none of the ops {list(prop.ops)} declared" if caps.dtypes else "no dtype declared or selected"
        )
        return PropertyRecord(backend.name, prop.name, "unsupported", reason)
    tally = _Tally(shrink_seconds=math.inf if shrink_seconds is None else shrink_seconds)
    try:
        stop = start + (math.inf if seconds is None else seconds)
        _search(backend, caps, prop, ctx, max_examples, tally, ledger, stop)
    except Violation as found:
        # The record's worst ratio is its counterexample's (the shrunk example the cell shows), not
        # the largest among the examples that passed.
        tally.worst = found.outcome.worst_ratio
        return _result(base, tally, start, prop, "failed", str(found), found.example.to_dict())
    except AdapterError as exc:
        return _result(base, tally, start, prop, "error", f"{backend.name} {prop.name}: {exc}")
    except Exception as exc:
        outcome, reason, example = _hypothesis_outcome(exc, tally)
        return _result(base, tally, start, prop, outcome, reason, example)
    if tally.known:
        tally.worst = max(tally.worst, *(ratio for _, ratio in tally.known))
        return _result(base, tally, start, prop, "xfailed", _known_reason(tally))
    return _result(base, tally, start, prop, "passed")


def _known_reason(tally: _Tally) -> str:
    entries = {id(entry): entry for entry, _ in tally.known}
    worst = max(ratio for _, ratio in tally.known)
    named = "; ".join(f"{e.reason} (ledger deviation[{e.index}])" for e in entries.values())
    return f"{len(tally.known)} of {tally.examples} examples deviate (worst_ratio {worst:.4g}): {named}"


def _result(
    base: Mapping[str, str],
    tally: _Tally,
    start: float,
    prop: Property,
    outcome: str,
    reason: str = "",
    example: Mapping[str, Any] | None = None,
) -> PropertyRecord:
    return PropertyRecord(
        base["backend"],
        base["property"],
        outcome,
        reason,
        tally.examples,
        tally.worst,
        tally.bitwise if prop.relation and tally.examples else None,
        example,
        time.perf_counter() - start,
        {
            **({"first_non_bitwise": tally.differing} if prop.relation and tally.differing else {}),
            **({"examples_not_run_out_of_time": tally.out_of_time} if tally.out_of_time else {}),
            **({"shrink_candidates_not_run": tally.shrink_out_of_time} if tally.shrink_out_of_time else {}),
            **({"ledger": sorted({entry.index for entry, _ in tally.known})} if tally.known else {}),
        },
    )


def _search(
    backend: Backend,
    caps: Capabilities,
    prop: Property,
    ctx: PropertyContext,
    max_examples: int,
    tally: _Tally,
    ledger: Ledger | None,
    stop: float,
) -> None:
    from hypothesis import HealthCheck, Phase, given, reject, seed, settings

    @seed(zlib.crc32(prop.name.encode()))
    @settings(
        max_examples=max_examples * prop.weight,
        derandomize=True,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(strategy(prop, caps))
    def holds(example: Example) -> None:
        if tally.examples and not tally.failing and time.perf_counter() > stop:
            tally.out_of_time += 1
            return
        if tally.failing and example not in tally.seen_failing and time.perf_counter() > tally.shrink_stop:
            tally.shrink_out_of_time += 1
            return
        why = caps.why_not(example.case(), grad=ctx.grad)
        if why is not None:
            tally.rejected.append(why)
            reject()
        try:
            outcome = prop.check(backend, example, ctx)
        except Unsupported as exc:
            tally.rejected.append(str(exc))
            reject()
        tally.examples += 1
        if not outcome.passed:
            tally.bitwise = False
            case, output = example.case(), outcome.output
            where = platform.here(caps.device)
            entry = (
                ledger.find(backend.name, case, prop.name, output, outcome.info, where) if ledger else None
            )
            if entry is None or outcome.worst_ratio > entry.band[1]:
                if not tally.failing:  # shrinking must replay examples whatever the search's clock says
                    tally.failing = True
                    tally.shrink_stop = time.perf_counter() + tally.shrink_seconds
                tally.seen_failing.add(example)
                raise Violation(example, outcome)
            tally.known.append((entry, outcome.worst_ratio))
            return
        tally.worst = max(tally.worst, outcome.worst_ratio)
        tally.bitwise = tally.bitwise and outcome.bitwise
        if not outcome.bitwise and tally.differing is None:
            tally.differing = example.to_dict()

    holds()


def _hypothesis_outcome(exc: Exception, tally: _Tally) -> tuple[str, str, Mapping[str, Any] | None]:
    """Map Hypothesis's own exceptions (nothing runnable, a flaky failure) to outcomes; re-raise others."""
    from hypothesis.errors import Flaky, Unsatisfiable

    if isinstance(exc, Unsatisfiable):
        why = tally.rejected[0] if tally.rejected else "no example could run"
        return "unsupported", f"no example runs on this backend: {why}", None
    if isinstance(exc, Flaky):
        inner = [e for e in getattr(exc, "exceptions", ()) if isinstance(e, Violation)]
        example = inner[0].example.to_dict() if inner else None
        return (
            "failed",
            f"the property failed, then passed on the same example (nondeterministic?): {exc}",
            example,
        )
    raise exc
