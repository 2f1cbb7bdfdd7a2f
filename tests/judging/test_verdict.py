"""conformance.judging.verdict.judge: how the ledger turns comparisons into passed/failed/xfailed/xpassed."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judging import tolerances
from conformance.judging.compare import compare
from conformance.judging.verdict import judge
from conformance.model.case import Case
from conformance.running.checks import CheckContext
from conformance.running.settings import load_ledger

CASE = Case("layer_norm", (4, 8), "float32", 1e-5)
EXPECTED = np.array([1.0, -2.0, 0.5, 4.0])


@pytest.fixture(scope="module")
def table():
    return tolerances.read_tolerances()


def ratio_of(table, output: str, ratio: float):
    """A comparison of ``output`` whose worst element sits at ``ratio`` times its allowance."""
    tol = table.lookup(CASE.op, output, CASE.dtype, CASE.dist)
    actual = EXPECTED.copy()
    actual[3] += ratio * (tol.atol + tol.rtol * abs(EXPECTED[3]))
    return compare(output, actual, EXPECTED, tol, CASE.dtype)


def _judge(backend, case, check, comparisons, ctx: CheckContext):
    return judge(backend, case, check, comparisons, ctx.ledger, ctx.reproduce)


def context(tmp_path, table, body: str = "", strict: bool = False) -> CheckContext:
    path = tmp_path / "ledger.toml"
    path.write_text(body)
    ledger = load_ledger(path, builtin=False, strict=strict)
    return CheckContext(table, ledger, timeout=10, reproduce="pytest x")


def entry(output: str = "y", band: str = "[1, 2]", reason: str = "accumulates in float16") -> str:
    return (
        f'[[deviation]]\nbackend = "fake-a"\ncheck = "forward"\noutput = "{output}"\n'
        f'band = {band}\nnote = "no model yet"\nreason = "{reason}"\nlink = "https://example.invalid/7"\n'
    )


def test_comparison_builder_hits_the_requested_ratio(table):
    c = ratio_of(table, "y", 1.5)
    assert c.worst_ratio == pytest.approx(1.5)
    assert c.worst_index == (3,)
    assert not c.passed
    assert ratio_of(table, "y", 0.5).passed


def test_all_passing_without_ledger_is_passed(tmp_path, table):
    comparisons = (ratio_of(table, "y", 0.5), ratio_of(table, "dx", 0.9))
    verdict = _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table))
    assert verdict.outcome == "passed"
    assert verdict.reason == ""
    assert verdict.comparisons == comparisons


def test_covered_failure_within_band_is_xfailed(tmp_path, table):
    comparisons = (ratio_of(table, "y", 1.5),)
    verdict = _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table, entry()))
    assert verdict.outcome == "xfailed"
    assert verdict.reason == "y: accumulates in float16 (within band 2, no model yet; ledger deviation[0])"
    assert verdict.comparisons == comparisons


def test_covered_failure_below_band_low_is_still_xfailed(tmp_path, table):
    # Only the top of the band guards against regressions; doing better than measured is not a failure.
    verdict = _judge(
        "fake-a",
        CASE,
        "forward",
        (ratio_of(table, "y", 1.2),),
        context(tmp_path, table, entry(band="[1.5, 2]")),
    )
    assert verdict.outcome == "xfailed"


def test_covered_failure_beyond_band_is_failed_and_names_the_band(tmp_path, table):
    comparisons = (ratio_of(table, "y", 3.0),)
    verdict = _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table, entry()))
    assert verdict.outcome == "failed"
    assert "ledger deviation[0] covers this output up to worst_ratio 2" in verdict.reason
    assert "measured 3" in verdict.reason
    assert "beyond its recorded band" in verdict.reason
    assert "reproduce: pytest x" in verdict.reason
    assert f"fake-a {CASE.id} [forward]" in verdict.reason


def test_covered_output_that_passes_is_passed_and_xpassed_only_where_strict_and_listed(tmp_path, table):
    comparisons = (ratio_of(table, "y", 0.5),)
    listed = entry() + f'case = "{CASE.id}"\n'
    assert (
        _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table, listed)).outcome == "passed"
    )
    predicate = context(tmp_path, table, entry(), strict=True)
    assert _judge("fake-a", CASE, "forward", comparisons, predicate).outcome == "passed"
    verdict = _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table, listed, strict=True))
    assert verdict.outcome == "xpassed"
    assert "ledger deviation[0] expects output 'y' to fail (accumulates in float16)" in verdict.reason
    assert "remove or narrow the entry (strict xfail)" in verdict.reason
    assert "reproduce: pytest x" in verdict.reason


def test_stale_entry_wins_over_other_failures_in_strict_mode(tmp_path, table):
    comparisons = (ratio_of(table, "y", 0.5), ratio_of(table, "dx", 5.0))
    ctx = context(tmp_path, table, entry() + f'case = "{CASE.id}"\n', strict=True)
    verdict = _judge("fake-a", CASE, "forward", comparisons, ctx)
    assert verdict.outcome == "xpassed"


def test_uncovered_failure_is_failed_with_a_full_message(tmp_path, table):
    comparisons = (ratio_of(table, "y", 0.5), ratio_of(table, "dx", 4.0))
    verdict = _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table))
    assert verdict.outcome == "failed"
    text = verdict.reason
    assert f"fake-a {CASE.id} [forward]" in text
    assert "output 'dx' out of tolerance" in text
    assert "worst at index (3,)" in text
    assert "worst_ratio 4" in text
    assert "mismatched 1 of 4" in text
    assert table.lookup(CASE.op, "dx", CASE.dtype, CASE.dist).source in text
    assert "why: " in text
    assert "reproduce: pytest x" in text
    assert "output 'y'" not in text  # only failing outputs are reported


def test_entry_for_another_backend_or_check_does_not_cover(tmp_path, table):
    comparisons = (ratio_of(table, "y", 1.5),)
    ctx = context(tmp_path, table, entry())
    assert _judge("fake-b", CASE, "forward", comparisons, ctx).outcome == "failed"
    assert _judge("fake-a", CASE, "backward", comparisons, ctx).outcome == "failed"


def test_one_uncovered_failure_fails_the_whole_check(tmp_path, table):
    comparisons = (ratio_of(table, "y", 1.5), ratio_of(table, "dx", 1.5))
    verdict = _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table, entry("y")))
    assert verdict.outcome == "failed"
    assert "output 'dx' out of tolerance" in verdict.reason


def test_every_failure_covered_within_its_band_is_xfailed(tmp_path, table):
    comparisons = (ratio_of(table, "y", 1.5), ratio_of(table, "dx", 2.5))
    body = entry("y") + entry("dx", band="[2, 3]", reason="dx reason")
    verdict = _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table, body))
    assert verdict.outcome == "xfailed"
    assert (
        verdict.reason == "y: accumulates in float16 (within band 2, no model yet; ledger deviation[0]); "
        "dx: dx reason (within band 3, no model yet; ledger deviation[1])"
    )


def test_shape_problem_is_reported_as_such(tmp_path, table):
    tol = table.lookup(CASE.op, "y", CASE.dtype, CASE.dist)
    comparisons = (compare("y", np.zeros(3), EXPECTED, tol, CASE.dtype),)
    verdict = _judge("fake-a", CASE, "forward", comparisons, context(tmp_path, table))
    assert verdict.outcome == "failed"
    assert "output 'y': shape (3,) returned, (4,) expected" in verdict.reason


def test_an_info_conditioned_entry_judges_only_results_that_recorded_that_choice(tmp_path, table):
    listed = f'info = {{ precision = ["bf16"] }}\ncase = "{CASE.id}"\n'
    ctx = context(tmp_path, table, entry() + listed, strict=True)
    failing, passing = (ratio_of(table, "y", 1.5),), (ratio_of(table, "y", 0.5),)
    lowered, kept = {"precision": "bf16"}, {"precision": "f32"}
    assert judge("fake-a", CASE, "forward", failing, ctx.ledger, "", lowered).outcome == "xfailed"
    # The same deviation where the backend recorded another choice is an ordinary failure...
    assert judge("fake-a", CASE, "forward", failing, ctx.ledger, "", kept).outcome == "failed"
    assert judge("fake-a", CASE, "forward", failing, ctx.ledger, "").outcome == "failed"
    # ...and strict mode holds where the entry applies: a pass is xpassed there, passed elsewhere.
    assert judge("fake-a", CASE, "forward", passing, ctx.ledger, "", lowered).outcome == "xpassed"
    assert judge("fake-a", CASE, "forward", passing, ctx.ledger, "", kept).outcome == "passed"
