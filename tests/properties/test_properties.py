"""Metamorphic properties: they hold for the oracle and the correct NumPy fake, and each one catches
the broken fake written to violate it, reporting the minimal example Hypothesis shrank it to."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conformance
from conformance.judging import ledger, tolerances
from conformance.properties.catalog import PROPERTIES, Evaluation, Example, Outcome, PropertyContext, relate
from conformance.properties.search import BUDGET, check
from conformance.running.settings import load_ledger
from conformance.running.summary import batch_invariant

from fakes.core import NumpyFake
from fakes.group import GroupFake
from fakes.property import BREAKS, OracleBackend

TABLE = tolerances.read_tolerances()
CTX = PropertyContext(TABLE, timeout=30, grad=True)
# Enough examples that every broken fake is found; the correct backends must survive the same draw.
EXAMPLES = 20


def _backend(name):
    return conformance.adapter.registry.entries()[name].load()


CORRECT = [OracleBackend(), NumpyFake(), GroupFake()]


def _declared(backend, prop):
    return bool(set(prop.ops) & backend.capabilities().ops)


@pytest.mark.parametrize(
    ("backend", "name"),
    [(b, name) for b in CORRECT for name, prop in sorted(PROPERTIES.items()) if _declared(b, prop)],
    ids=lambda value: value if isinstance(value, str) else value.name,
)
def test_property_holds_for_correct_backends(backend, name):
    result = check(backend, backend.capabilities(), PROPERTIES[name], CTX, EXAMPLES)
    assert result.outcome == "passed", result.reason
    assert result.examples >= EXAMPLES // 2
    assert 0 <= result.worst_ratio <= 1


@pytest.mark.parametrize("fake", sorted(BREAKS))
def test_each_property_catches_its_broken_fake_with_a_minimal_example(fake):
    prop = PROPERTIES[BREAKS[fake]]
    backend = _backend(fake)
    result = check(backend, backend.capabilities(), prop, CTX, EXAMPLES)
    assert result.outcome == "failed", result
    assert "worst_ratio" in result.reason
    example = Example(**result.counterexample)
    # Hypothesis shrinks towards the smallest example that still fails.
    assert example.rows <= 3 and example.features <= 8, example
    again = prop.check(backend, example, CTX)
    assert not again.passed
    # The record's worst ratio is the counterexample's, as the reason states it.
    assert result.worst_ratio == again.worst_ratio > 1 and f"{again.worst_ratio:.4g}" in result.reason


@pytest.mark.parametrize(
    ("fake", "broken"),
    [("fake-spreads-nan", "nonfinite_containment"), ("fake-gn-variance-floor", "group_scale_invariance")],
)
def test_only_the_broken_property_fails_for_a_position_independent_fake(fake, broken):
    """A fake that only mishandles NaN (or tiny variances) passes every other property of its ops:
    properties test one thing each."""
    backend = _backend(fake)
    outcomes = {
        name: check(backend, backend.capabilities(), prop, CTX, 8).outcome
        for name, prop in PROPERTIES.items()
        if _declared(backend, prop)
    }
    assert {n for n, o in outcomes.items() if o != "passed"} == {broken}


def test_batch_invariance_is_recorded_bitwise():
    fake = NumpyFake()
    result = check(fake, fake.capabilities(), PROPERTIES["row_independence"], CTX, 8)
    assert result.bitwise is True
    leaky = _backend("fake-batch-statistics")
    failed = check(leaky, leaky.capabilities(), PROPERTIES["row_independence"], CTX, 8)
    records = [result, failed]
    assert batch_invariant(records) == ["fake-numpy"]


def test_a_ledger_entry_turns_known_property_failures_into_xfailed(tmp_path):
    path = tmp_path / "ledger.toml"
    path.write_text(
        '[[deviation]]\nbackend = "fake-variance-about-zero"\ncheck = "shift_invariance"\noutput = "y"\n'
        'op = "layer_norm"\nband = [1.0, inf]\nnote = "no model yet"\nreason = "variance about zero"\n'
    )
    known = load_ledger(path, builtin=False)
    backend = _backend("fake-variance-about-zero")
    result = check(backend, backend.capabilities(), PROPERTIES["shift_invariance"], CTX, 8, known)
    assert result.outcome == "xfailed"
    assert "ledger deviation[0]" in result.reason and "variance about zero" in result.reason


class _Recorded:
    """A backend whose prepared calls also report ``info`` (as a runtime records the precision it chose)."""

    def __init__(self, backend, info):
        self.backend, self.name, self.recorded = backend, backend.name, info

    def capabilities(self):
        return self.backend.capabilities()

    def prepare(self, case, inputs, *, grad):
        prepared, recorded = self.backend.prepare(case, inputs, grad=grad), self.recorded

        class WithInfo:
            def __call__(self):
                return prepared()

            def synchronize(self):
                prepared.synchronize()

            def outputs(self):
                return prepared.outputs()

            def info(self):
                return dict(recorded)

        return WithInfo()


def test_an_info_conditioned_entry_covers_only_examples_that_recorded_that_choice(tmp_path):
    path = tmp_path / "ledger.toml"
    path.write_text(
        '[[deviation]]\nbackend = "fake-variance-about-zero"\ncheck = "shift_invariance"\noutput = "y"\n'
        'band = [1.0, inf]\nnote = "no model yet"\nreason = "lowered"\ninfo = { precision = ["bf16"] }\n'
    )
    known = load_ledger(path, builtin=False)
    base = _backend("fake-variance-about-zero")
    prop = PROPERTIES["shift_invariance"]
    lowered = _Recorded(base, {"precision": "bf16"})
    assert check(lowered, base.capabilities(), prop, CTX, 8, known).outcome == "xfailed"
    kept = _Recorded(base, {"precision": "f32"})
    assert check(kept, base.capabilities(), prop, CTX, 8, known).outcome == "failed"
    assert check(base, base.capabilities(), prop, CTX, 8, known).outcome == "failed"


def test_an_unknown_property_name_in_the_ledger_is_an_error(tmp_path):
    path = tmp_path / "ledger.toml"
    path.write_text(
        '[[deviation]]\nbackend = "x"\ncheck = "shift_invariant"\noutput = "y"\nband = [1, 2]\n'
        'note = "no model yet"\nreason = "r"\n'
    )
    with pytest.raises(ledger.LedgerError, match="shift_invariant"):
        load_ledger(path, builtin=False)


def test_budgets_are_fixed_per_profile():
    assert BUDGET["smoke"] < BUDGET["ci"] < BUDGET["full"]


def test_a_backend_without_the_ops_is_unsupported():
    class NoRows(NumpyFake):
        def capabilities(self):
            caps = super().capabilities()
            return type(caps)(frozenset({"batch_norm"}), caps.dtypes, caps.features)

    backend = NoRows()
    result = check(backend, backend.capabilities(), PROPERTIES["shift_invariance"], CTX, 4)
    assert result.outcome == "unsupported"


def _run(values, allowance):
    values = np.asarray(values, dtype=np.float64)
    return Evaluation(
        None, {"y": values}, {"y": np.zeros_like(values)}, {"y": np.full_like(values, allowance)}
    )


@settings(max_examples=50, derandomize=True, deadline=None, database=None)
@given(
    st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=8),
    st.floats(1e-6, 1.0),
    st.floats(0.0, 4.0),
)
def test_relate_passes_exactly_within_the_sum_of_allowances(values, allowance, factor):
    first = _run(values, allowance)
    moved = _run(np.asarray(values) + factor * allowance, allowance)
    outcome: Outcome = relate("y", moved, first)
    assert outcome.passed == (factor <= 2.0 * (1 + 1e-9)) or abs(factor - 2.0) < 1e-6
    assert outcome.bitwise == bool(np.all(moved.actual["y"] == first.actual["y"]))


def test_relate_treats_nan_against_nan_as_equal_and_nan_against_a_number_as_failure():
    nan = float("nan")
    assert relate("y", _run([nan, 1.0], 0.1), _run([nan, 1.0], 0.1)).passed
    assert not relate("y", _run([nan, 1.0], 0.1), _run([0.0, 1.0], 0.1)).passed


def test_a_slow_backend_stops_drawing_examples_when_its_time_is_up():
    class Slow(NumpyFake):
        def compute(self, case, inputs, grad):
            time.sleep(0.05)
            return super().compute(case, inputs, grad)

    backend = Slow()
    result = check(backend, backend.capabilities(), PROPERTIES["row_permutation"], CTX, 40, seconds=0.3)
    assert result.outcome == "passed"
    assert 1 <= result.examples < 40
    assert result.extra["examples_not_run_out_of_time"] == 40 - result.examples


def test_a_failure_is_shrunk_even_after_the_time_is_up():
    backend = _backend("fake-spreads-nan")
    result = check(backend, backend.capabilities(), PROPERTIES["nonfinite_containment"], CTX, 20, seconds=0.0)
    assert result.outcome == "failed" and result.counterexample["rows"] == 2


def test_examples_stay_within_the_declared_dtypes():
    fake = NumpyFake()
    only_bf16 = dataclasses.replace(fake.capabilities(), dtypes=frozenset({"bfloat16"}))
    seen = []

    class Recording(NumpyFake):
        def prepare(self, case, inputs, *, grad):
            seen.append(case.dtype)
            return super().prepare(case, inputs, grad=grad)

    assert check(Recording(), only_bf16, PROPERTIES["shift_invariance"], CTX, 6).outcome == "passed"
    assert set(seen) == {"bfloat16"}
    none = dataclasses.replace(only_bf16, dtypes=frozenset())
    assert check(fake, none, PROPERTIES["shift_invariance"], CTX, 6).outcome == "unsupported"


def test_shrinking_stops_running_new_candidates_when_its_budget_is_spent():
    prop = PROPERTIES[BREAKS["fake-variance-floor"]]
    backend = _backend("fake-variance-floor")
    full = check(backend, backend.capabilities(), prop, CTX, 20)
    cut = check(backend, backend.capabilities(), prop, CTX, 20, shrink_seconds=0.0)
    # Without a budget every candidate runs; with none left, only examples already seen failing run,
    # so the example reported is one the backend failed, larger than the fully shrunk one.
    assert "shrink_candidates_not_run" not in full.extra
    assert cut.outcome == "failed" and cut.extra["shrink_candidates_not_run"] > 0
    assert cut.examples < full.examples
    example = Example(**cut.counterexample)
    assert not prop.check(backend, example, CTX).passed
    assert (example.rows, example.features) > (full.counterexample["rows"], full.counterexample["features"])


def test_examples_are_drawn_from_the_propertys_own_seed_not_the_search_code():
    import zlib

    from hypothesis import HealthCheck, Phase, seed
    from hypothesis import settings as hsettings

    from conformance.properties.search import strategy

    prop = PROPERTIES["row_permutation"]
    drawn = []

    class Recording(NumpyFake):
        def prepare(self, case, inputs, *, grad):
            drawn.append((case.op, case.dtype, case.shape, case.eps))
            return super().prepare(case, inputs, grad=grad)

    backend = Recording()
    caps = backend.capabilities()
    assert check(backend, caps, prop, CTX, 5).outcome == "passed"
    # A function of other source with the same seed, settings and strategy draws the same examples.
    expected = []

    @seed(zlib.crc32(prop.name.encode()))
    @hsettings(
        max_examples=5 * prop.weight,
        derandomize=True,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy(prop, caps))
    def other(example):
        case = example.case()
        expected.append((case.op, case.dtype, case.shape, case.eps))

    other()
    # (The property runs each example twice: the rows as given and permuted.)
    assert len(expected) > 1 and list(dict.fromkeys(drawn)) == list(dict.fromkeys(expected))
