"""Pure table building of the report on small fixture results: matrix, cases, failures, sections."""

from __future__ import annotations

import hashlib
import math

import pytest

from conformance.results import runs
from reports import sections, tables

from support.reports import EVIL, case, property_record, result, standard_records, write


@pytest.fixture
def one_run(tmp_path):
    return runs.read_runs([write(tmp_path / "run.jsonl", standard_records())])


def test_columns_are_backends_and_get_the_run_label_only_when_names_repeat(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    a = write(tmp_path / "a" / "results.jsonl", standard_records())
    b = write(tmp_path / "b" / "results.jsonl", standard_records())
    assert [c.key for c in tables.columns(runs.read_runs([a]))] == ["alpha", "beta"]
    two = runs.read_runs([a, b])
    assert [r.label for r in two] == ["a/results", "b/results"]
    assert [c.key for c in tables.columns(two)] == [
        "alpha · a/results",
        "beta · a/results",
        "alpha · b/results",
        "beta · b/results",
    ]


def test_matrix_cells_take_the_worst_outcome_and_largest_worst_ratio(one_run):
    m = tables.matrix(one_run)
    assert [(r.op, r.dtype, r.eps) for r in m.rows] == [
        ("layer_norm", "float32", "1e-05"),
        ("rms_norm", "float32", "1e-05"),
    ]
    ln = m.rows[0]
    alpha, beta = (ln.cells[c.id] for c in m.columns)
    assert alpha.outcome == "passed" and alpha.worst_ratio == 0.5 and alpha.ratio_text == "0.5"
    # beta's layer_norm row holds a failure with ratio 3.5 and the evil case with an infinite ratio.
    assert beta.outcome == "failed" and math.isinf(beta.worst_ratio) and beta.problems == 2
    assert beta.counts == {"passed": 1, "failed": 2}
    assert set(ln.bo.split()) == {"c1/passed", "c2/passed", "c2/failed"}
    rms = m.rows[1]
    assert rms.cells["c1"].outcome == "unsupported" and rms.cells["c1"].worst_ratio is None
    assert rms.cells["c2"].outcome == "xfailed"


def test_case_rows_hold_each_check(one_run):
    rows = tables.case_rows(one_run)
    by = {(r.column.key, r.case_id): r for r in rows}
    row = by[("beta", "layer_norm-float32-4x8-eps1e-05-normal")]
    assert row.checks["forward"].outcome == "passed" and row.checks["backward"].outcome == "failed"
    assert row.outcome == "failed" and set(row.bo.split()) == {"c2/passed", "c2/failed"}
    assert tables.check_names(one_run, rows) == ["forward", "backward"]


def test_failures_keep_full_message_reproduce_and_figures(one_run):
    found = tables.failures(one_run)
    assert sorted((f.column.key, f.check) for f in found) == [("beta", "backward"), ("beta", "forward")]
    first = next(f for f in found if f.check == "backward")
    assert first.headline == "output 'dx' out of tolerance"
    assert "<b>bold</b>" in first.reason and first.reproduce.startswith("pytest ")
    assert [(g.output, g.worst_ratio) for g in first.figures] == [("dx", "3.5"), ("dweight", "0.2")]
    evil = next(f for f in found if f.check == "forward")
    assert evil.case_id == EVIL and evil.figures[0].worst_ratio == "inf"


def test_failures_come_worst_first_with_the_index_of_the_worst_element(tmp_path):
    records = standard_records()[:1] + [
        result("gamma", case(eps=10.0**-k), "forward", "failed", ratios=(ratio,))
        for k, ratio in ((5, 1.5), (6, 40.0), (7, 3.0))
    ]
    found = tables.failures(runs.read_runs([write(tmp_path / "run.jsonl", records)]))
    assert [f.figures[0].worst_ratio for f in found] == ["40", "3", "1.5"]
    assert found[0].figures[0].index == "[0, 1]" and found[0].figures[0].failing


def test_totals_count_outcomes_per_column(one_run):
    totals = dict((c.key, counts) for c, counts in tables.totals(one_run))
    assert totals["alpha"] == {"passed": 2, "unsupported": 1}
    assert totals["beta"] == {"passed": 1, "failed": 2, "xfailed": 1}


def test_tolerance_table_groups_rules_with_headroom(one_run):
    y, dx, dweight = sections.tolerances(one_run)
    assert y.source == "tolerances.toml rule[0] output=y dtype=float32"
    assert y.keys == {"output": "y", "dtype": "float32"}
    assert y.why.startswith("float32 statistics")
    assert (y.comparisons, y.failing, y.median_ratio, y.max_ratio) == (4, 2, "1.1", "inf")
    assert (dx.source, dx.comparisons, dx.failing, dx.max_ratio) == (
        "tolerances.toml rule[2] output=dx dtype=float32",
        2,
        1,
        "3.5",
    )
    assert (dweight.comparisons, dweight.failing) == (2, 0)


def test_deviations_come_from_the_ledger_entries_the_run_recorded(tmp_path):
    entry = {
        "index": 0,
        "match": {"backend": ["beta"], "check": ["forward"], "output": ["y"], "op": ["rms_norm"]},
        "band": [1.0, 4.0],
        "reason": "beta rounds twice",
        "link": "javascript:alert(1)",
        "note": "the order of its sums is unknown",
    }
    ledger = {"path": "/nowhere/ledger.toml", "sha256": "1" * 64, "entries": [entry]}
    d = sections.deviations(runs.read_runs([write(tmp_path / "r.jsonl", standard_records(), ledger=ledger)]))
    assert not d.notes  # the file is not needed: the run recorded its entries
    (row,) = d.rows
    assert row.reason == "beta rounds twice" and row.band == "1 .. 4" and row.op == "rms_norm"
    assert ("backend", "beta") in row.match and row.xfailed == 1 and row.measured == "2 .. 2"
    assert row.explains == "band 4 (no model yet)" and row.explains_note == "the order of its sums is unknown"
    assert row.link == ""  # only http(s) links are made clickable


def test_entries_cited_by_a_failure_or_a_property_are_listed_not_counted_as_others(tmp_path):
    """An entry that applied to a failed result (but did not explain it) or that a property's
    examples met is part of this run: it gets its row (the failure card links to it)."""
    entries = [
        {"index": i, "match": {"backend": ["beta"]}, "band": [1.0, 4.0], "reason": f"entry {i}", "link": ""}
        for i in range(4)
    ]
    ledger = {"path": "/nowhere/ledger.toml", "sha256": "1" * 64, "entries": entries}
    cited = result("beta", case(eps=1e-6), "forward", "failed", ratios=(9.0,), ledger=1)
    prop = {**property_record("beta", "scale_invariance", "xfailed"), "extra": {"ledger": [2]}}
    records = [*standard_records(), cited, prop]
    d = sections.deviations(runs.read_runs([write(tmp_path / "r.jsonl", records, ledger=ledger)]))
    assert [row.index for row in d.rows] == [0, 1, 2] and d.others == 1
    assert dict((row.index, row.bo) for row in d.rows)[1] == "c2/failed"


def test_a_cell_whose_every_check_is_a_known_deviation_does_not_read_as_conforming(tmp_path):
    known = [result("beta", case(), check, "xfailed", (2.0,), ledger=0) for check in ("forward", "backward")]
    (row,) = tables.matrix(runs.read_runs([write(tmp_path / "r.jsonl", known)])).rows
    (cell,) = row.cells.values()
    assert cell.outcome == "xfailed" and cell.conforming_ratio is None and cell.conforming_text == "2 known"


def test_a_deviation_shows_the_info_its_entry_requires(tmp_path):
    entry = {
        "index": 0,
        "match": {"backend": ["beta"], "check": ["forward"], "output": ["y"]},
        "band": [1.0, 4.0],
        "reason": "beta lowers to bf16 where the CPU has it",
        "link": "",
        "info": {"inference_precision_hint": ["bf16"]},
    }
    ledger = {"path": "/nowhere/ledger.toml", "sha256": "1" * 64, "entries": [entry]}
    d = sections.deviations(runs.read_runs([write(tmp_path / "r.jsonl", standard_records(), ledger=ledger)]))
    (row,) = d.rows
    assert ("info.inference_precision_hint", "bf16") in row.match


def test_deviations_without_recorded_entries_come_from_the_results(one_run):
    d = sections.deviations(one_run)
    assert [(r.index, r.xfailed, r.measured, r.reason) for r in d.rows] == [
        (0, 1, "2 .. 2", "(entry not available)")
    ]


def test_schema_1_deviations_without_the_ledger_file_come_from_the_results(tmp_path):
    d = sections.deviations(runs.read_runs([write(tmp_path / "r.jsonl", standard_records(1), schema=1)]))
    assert [(r.index, r.xfailed, r.measured) for r in d.rows] == [(0, 1, "2 .. 2")]
    assert "not readable here" in d.notes[0]


def test_schema_1_deviations_with_the_run_ledger_show_its_entries(tmp_path):
    ledger = tmp_path / "ledger.toml"
    ledger.write_text(
        '[[deviation]]\nbackend = "beta"\ncheck = "forward"\noutput = "y"\nop = "rms_norm"\n'
        'band = [1.0, 4.0]\nnote = "the order of its sums is unknown"\n'
        'reason = "beta rounds twice"\nlink = "javascript:alert(1)"\n'
    )
    sha = hashlib.sha256(ledger.read_bytes()).hexdigest()
    path = write(
        tmp_path / "r.jsonl", standard_records(1), schema=1, ledger={"path": str(ledger), "sha256": sha}
    )
    d = sections.deviations(runs.read_runs([path]))
    assert not d.notes
    (row,) = d.rows
    assert row.reason == "beta rounds twice" and row.band == "1 .. 4" and row.op == "rms_norm"
    assert ("backend", "beta") in row.match and row.xfailed == 1
    assert row.link == ""  # only http(s) links are made clickable
    ledger.write_text(ledger.read_text() + "# edited\n")
    assert "changed since the run" in sections.deviations(runs.read_runs([path])).notes[0]


def test_schema_1_tolerance_rules_keep_their_keys(tmp_path):
    y, dx, _ = sections.tolerances(
        runs.read_runs([write(tmp_path / "r.jsonl", standard_records(1), schema=1)])
    )
    assert y.keys == {"output": "y", "dtype": "float32"} and y.rule == 0
    assert dx.source == "tolerances.toml rule[2] output=dx dtype=float32" and dx.rule == 2


def test_coverage_counts_checks_and_features_and_unsupported(tmp_path):
    records = [
        *standard_records(),
        result(
            "alpha", case(weight=False, id="ln-now"), outcome="unsupported", reason="feature(s) ['no_weight']"
        ),
        result("alpha", case(norm_ndim=2, shape=[2, 2, 8], id="ln-nd2")),
    ]
    cov = sections.coverage(runs.read_runs([write(tmp_path / "r.jsonl", records)]))
    assert cov.items[:2] == ("forward", "backward")
    assert "no_weight" in cov.items and "multi_axis" in cov.items
    assert len(cov.items) == len(set(cov.items))  # the backward/training checks are not repeated as features
    alpha_ln = next(r for r in cov.rows if r.column.key == "alpha" and r.op == "layer_norm")
    assert alpha_ln.cells["no_weight"].state == "unsupported"
    assert alpha_ln.cells["multi_axis"].state == "ran"
    assert (
        alpha_ln.cells["forward"].state == "partial" and alpha_ln.cells["forward"].text == "2 + 1 unsupported"
    )
    declared = dict((c.key, text) for c, text in cov.declared)
    assert declared["alpha"].startswith("ops: layer_norm; dtypes: float32; features: backward")


def test_environment_lists_facts_packages_and_backends(one_run):
    env = sections.environment(one_run[0])
    facts = dict(env.facts)
    assert facts["profile"] == "smoke" and facts["git commit"] == "abc123" and facts["results"] == "7"
    assert env.packages == (("numpy", "2.0"),)
    assert ("alpha", "cpu (unnamed)") in env.backends


def test_environment_tells_broken_from_unavailable_backends(tmp_path):
    backends = {
        "gone": {"unavailable": "backend gone unavailable: needs torch"},
        "bad": {"unavailable": "backend bad is broken: capabilities() raised TypeError: x", "broken": True},
    }
    env = sections.environment(runs.read_runs([write(tmp_path / "r.jsonl", [], backends=backends)])[0])
    assert ("gone", "unavailable: backend gone unavailable: needs torch") in env.backends
    assert ("bad", "broken: backend bad is broken: capabilities() raised TypeError: x") in env.backends


def test_shards_of_one_run_merge_and_other_files_stay_runs(tmp_path):
    records = standard_records()
    one = write(tmp_path / "s1.jsonl", records[:3], shard={"index": 1, "count": 2})
    two = write(tmp_path / "s2.jsonl", records[3:], shard={"index": 2, "count": 2})
    other = write(tmp_path / "other.jsonl", records)
    loaded = runs.read_runs([two, one, other])
    assert [r.label for r in loaded] == ["s2", "other"]
    assert [f.path.name for f in loaded[0].files] == ["s1.jsonl", "s2.jsonl"]
    assert len(loaded[0].records) == len(records)
    again = write(tmp_path / "s1b.jsonl", records[:3], shard={"index": 1, "count": 2})
    assert len(runs.read_runs([one, again])) == 2  # the same shard twice is two runs, not a merge
