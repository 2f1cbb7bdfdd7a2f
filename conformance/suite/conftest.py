"""Parametrization and fixtures of the per-backend suite files: fingerprint questions and properties.

The per-case checks are parametrized by the plugin (backend x case); these two are backend x question
and backend x property. Their records join the results file as ``kind: "fingerprint"`` and
``kind: "property"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from conformance import fingerprint
from conformance.adapter.opening import Absent
from conformance.properties import catalog, search
from conformance.results.fingerprints import FingerprintRecord
from conformance.results.properties import PropertyRecord
from conformance.running import outcomes, plugin


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    settings = metafunc.config.stash[plugin.SETTINGS]
    ops = {case.op for case in settings.cases}
    if "normconf_question" in metafunc.fixturenames:
        questions = [q for q in fingerprint.QUESTIONS.values() if q.op in ops]
        targets = [(b, q) for q in questions for b in settings.backends]
        metafunc.parametrize("normconf_question", targets, ids=[f"{b}:{q.name}" for b, q in targets])
    if "normconf_property" in metafunc.fixturenames:
        props = [p for p in catalog.PROPERTIES.values() if ops & set(p.ops)]
        pairs = [(b, p) for p in props for b in settings.backends]
        metafunc.parametrize("normconf_property", pairs, ids=[f"{b}:{p.name}" for b, p in pairs])


def _record(request: pytest.FixtureRequest, record: dict[str, Any]) -> None:
    plugin.attach(request.node, record)
    outcomes.enforce(record["outcome"], record["reason"])


# Seconds of fingerprint probes one backend may take in one process (None: no limit). A backend that
# compiles or exports every probe (seconds each) answers the first questions, and the rest say so.
FINGERPRINT_SECONDS: dict[str, float | None] = {"smoke": 10.0, "ci": 10.0, "full": None}
_SPENT = pytest.StashKey[dict[str, float]]()


@pytest.fixture
def normconf_fingerprint(request: pytest.FixtureRequest) -> Callable[[], None]:
    """Ask this test's backend this test's question; record the answer and its evidence."""
    state: plugin.RunState = request.config.stash[plugin.STATE]
    backend_name, question = request.node.callspec.params["normconf_question"]
    spent = request.config.stash.setdefault(_SPENT, {})
    budget = FINGERPRINT_SECONDS.get(state.settings.profile, FINGERPRINT_SECONDS["ci"])

    def run() -> None:
        loaded = state.backend(backend_name)
        if isinstance(loaded, Absent):
            answer = FingerprintRecord(backend_name, question.name, loaded.outcome, reason=loaded.reason)
        elif (hung := state.not_run(backend_name, None)) is not None:
            answer = FingerprintRecord(backend_name, question.name, "error", reason=hung)
        elif budget is not None and spent.get(backend_name, 0.0) >= budget:
            reason = f"fingerprint time budget spent ({budget:g} s for {backend_name} in this process)"
            answer = FingerprintRecord(backend_name, question.name, "skipped", reason=reason)
        else:
            answer = fingerprint.ask(loaded[0], loaded[1], question, state.settings.timeout)
            spent[backend_name] = spent.get(backend_name, 0.0) + answer.duration_s
        _record(request, answer.to_dict())

    return run


@pytest.fixture
def normconf_check_property(request: pytest.FixtureRequest) -> Callable[[], None]:
    """Check this test's property on this test's backend within the profile's example budget."""
    state: plugin.RunState = request.config.stash[plugin.STATE]
    backend_name, prop = request.node.callspec.params["normconf_property"]
    settings = state.settings

    def run() -> None:
        loaded = state.backend(backend_name)
        if isinstance(loaded, Absent):
            result = PropertyRecord(backend_name, prop.name, loaded.outcome, loaded.reason)
        elif (hung := state.not_run(backend_name, None)) is not None:
            result = PropertyRecord(backend_name, prop.name, "error", hung)
        else:
            backend, declared = loaded
            # Examples stay within the dtypes the run selected (--dtype), as the checks do.
            caps = dataclasses.replace(declared, dtypes=declared.dtypes & {c.dtype for c in settings.cases})
            ctx = catalog.PropertyContext(settings.tolerances, settings.timeout, "backward" in caps.features)
            profile = settings.profile if settings.profile in search.BUDGET else "ci"
            budget, seconds = search.BUDGET[profile], search.SECONDS[profile]
            shrink = search.SHRINK_SECONDS[profile]
            result = search.check(backend, caps, prop, ctx, budget, settings.ledger, seconds, shrink)
        _record(request, result.to_dict())

    return run
