"""The terminal summary after a run: the worst failures (where and by how much) and the conventions
that differ from the reference, beside the counts."""

from __future__ import annotations

from conformance.results.records import from_dict
from conformance.running import summary

from support.reports import case, fingerprint, result


def _typed(records):
    return [from_dict(r) for r in records]


def _failures(n: int):
    """n failed forward checks with worst ratios 1.5, 2.5, ... on distinct cases, plus passes."""
    records = [result("good", case(eps=1e-5)), result("good", case(eps=1e-6), check="backward")]
    for i in range(n):
        records.append(result("bad", case(eps=10.0 ** -(i + 1)), "forward", "failed", ratios=(1.5 + i,)))
    return _typed(records)


def test_the_worst_failures_come_first_with_ratio_and_index():
    lines = summary.worst_failures(_failures(7))
    assert lines[0] == "worst failures (5 of 7; every one in the report's #failures)"
    head, *rows = lines[1:]
    assert head.split() == ["backend", "case", "check", "output", "worst_ratio", "index"]
    assert [row.split()[4] for row in rows] == ["7.5", "6.5", "5.5", "4.5", "3.5"]
    assert all(row.split()[0] == "bad" and row.split()[5] == "[0,1]" for row in rows)


def test_a_check_is_listed_once_by_its_worst_output_and_errors_are_counted():
    records = _typed(
        [
            result("bad", case(), "backward", "failed", ratios=(3.0, 9.0, 0.5)),
            result("bad", case(eps=1e-6), "forward", "error", reason="boom"),
        ]
    )
    lines = summary.worst_failures(records)
    (row,) = lines[2:-1]
    assert row.split()[2:5] == ["backward", "dweight", "9"]
    assert lines[-1].startswith("1 failed or errored check(s) without figures")


def test_a_clean_run_shows_no_failure_block():
    assert summary.worst_failures(_typed([result("good", case())])) == []


def test_conventions_that_differ_from_the_reference_are_listed():
    records = _typed(
        [
            fingerprint("a", "layer_norm.eps", "outside-sqrt", "inside-sqrt"),
            fingerprint("b", "layer_norm.eps", "inside-sqrt", "inside-sqrt"),
        ]
    )
    lines = summary.fingerprint_differences(records)
    assert lines[0].startswith("conventions that differ from the reference (1;")
    assert lines[2].split() == ["a", "layer_norm.eps", "outside-sqrt", "inside-sqrt"]
    assert summary.fingerprint_differences(records[1:]) == []
