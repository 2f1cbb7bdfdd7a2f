"""Schema 1 results files (tests/data/results_schema1.jsonl, written by the suite before schema 2) still
load as typed records, render, merge and compare; and the scripts read results through the same reader."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from conformance.cli import main
from conformance.results import records, runs
from conformance.results.diff import diff
from conformance.results.schema import SCHEMA_VERSION
from reports import sections

from support.suite import ROOT, TESTS

SCHEMA_1 = TESTS / "data" / "results_schema1.jsonl"


def test_schema_1_file_is_upgraded_to_typed_records():
    loaded = records.read_results(SCHEMA_1)
    assert loaded.header.schema == 1 and loaded.header.checks[:2] == ("forward", "backward")
    xfailed = [r for r in loaded.results if r.outcome == "xfailed"]
    assert len(xfailed) == 4 and all(r.summary.startswith(("dx: ", "y: ")) for r in xfailed)
    # The entry each output cites, recovered from the reason: dbias passed, so it cites none.
    backward = next(r for r in xfailed if r.check == "backward")
    assert {c.output: c.ledger for c in backward.comparisons} == {"dx": 11, "dweight": 9, "dbias": None}
    assert backward.ledger_entries == (11, 9)
    rule = backward.comparisons[0].tolerance
    assert rule.rule == 10 and dict(rule.keys) == {"output": "dx", "dtype": "float16"}
    assert rule.file == "tolerances.toml" and rule.source.startswith("tolerances.toml rule[10] ")
    passed = next(r for r in loaded.results if r.outcome == "passed")
    assert passed.summary == "" and all(c.ledger is None for c in passed.comparisons)
    assert len(loaded.fingerprints) == 2 and len(loaded.properties) == 2
    assert "not readable here" in loaded.header.ledger_note  # the run's ledger path is not on this machine


def test_schema_1_file_renders_with_the_cited_entries(tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main.main(["report", str(SCHEMA_1), "-o", str(out)]) == 0
    text = out.read_text()
    assert '<section id="matrix">' in text and "torch-eager" in text
    rows = sections.deviations(runs.read_runs([SCHEMA_1])).rows
    assert [(r.index, r.xfailed) for r in rows] == [(9, 2), (11, 2), (13, 2)]
    assert main.main(["report", str(SCHEMA_1), "--format", "md"]) == 0
    assert "## normconf report" in capsys.readouterr().out


def _as_schema_2(tmp_path: Path) -> Path:
    """The same run written as schema 2: what the current writer would have written for it."""
    header, raw = records.read_raw(SCHEMA_1)
    typed = [records.from_dict(r) for r in raw]
    current = {**header, "schema": SCHEMA_VERSION}
    path = tmp_path / "results_schema2.jsonl"
    records.write_atomic(path, [current, *(r.to_dict() for r in typed if r is not None)])
    return path


def test_schema_1_and_2_of_one_run_compare_equal(tmp_path, capsys):
    current = _as_schema_2(tmp_path)
    assert [r.to_dict() for r in records.read_results(current).results] == [
        r.to_dict() for r in records.read_results(SCHEMA_1).results
    ]
    base, new = runs.read_runs([SCHEMA_1, current])
    changes = diff(base.records, new.records)
    assert (changes.new_failures, changes.fixed, changes.growth, changes.regression) == ((), (), (), False)
    assert changes.common == len(base.records)
    assert main.main(["compare", str(SCHEMA_1), str(current)]) == 0
    assert "new failures (0)" in capsys.readouterr().out


def test_scripts_read_results_through_the_typed_reader():
    run = [sys.executable, str(ROOT / "scripts" / "headroom.py"), str(SCHEMA_1)]
    table = subprocess.run(run, capture_output=True, text=True, check=True, timeout=60).stdout
    assert "| torch-nn | y | bfloat16 | 4 |" in table
    run = [sys.executable, str(ROOT / "scripts" / "propose_ledger.py"), str(SCHEMA_1)]
    proposal = subprocess.run(run, capture_output=True, text=True, check=True, timeout=60).stdout
    assert 'backend = "torch-eager"' in proposal and 'output = "dx"' in proposal
    assert json.loads(SCHEMA_1.read_text().splitlines()[0])["schema"] == 1


def _schema_1_file(tmp_path: Path, records_: list[dict], **header: object) -> Path:
    lines = SCHEMA_1.read_text().splitlines()
    path = tmp_path / "old.jsonl"
    first = {**json.loads(lines[0]), **header}
    path.write_text("".join(json.dumps(r) + "\n" for r in [first, *records_]))
    return path


def _first_result() -> dict:
    return next(r for r in map(json.loads, SCHEMA_1.read_text().splitlines()[1:]) if r["kind"] == "result")


def test_schema_1_failed_reason_cites_the_entry_whose_band_was_exceeded(tmp_path):
    record = _first_result()
    outputs = [c["output"] for c in record["comparisons"]]
    reason = "\n\n".join(
        f"torch-eager {record['case']['id']} [backward]\noutput '{name}' out of tolerance\n  figures\n"
        + (f"  ledger deviation[{i}] covers this output up to worst_ratio 2, measured 9\n" if i else "")
        + "  reproduce: pytest x"
        for i, name in enumerate(outputs)
    )
    path = _schema_1_file(tmp_path, [{**record, "outcome": "failed", "reason": reason}])
    (result,) = records.read_results(path).results
    assert {c.output: c.ledger for c in result.comparisons} == {
        name: (i or None) for i, name in enumerate(outputs)
    }
    assert result.summary == f"output '{outputs[0]}' out of tolerance"


def test_schema_1_ledger_is_read_where_the_header_names_it_unchanged(tmp_path):
    file = tmp_path / "ledger.toml"
    file.write_text(
        '[[deviation]]\nbackend = "b"\ncheck = "forward"\noutput = "y"\nband = [1, 2]\n'
        'note = "no model yet"\nreason = "r"\n'
    )
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    header = records.read_results(
        _schema_1_file(tmp_path, [_first_result()], ledger={"path": str(file), "sha256": sha})
    ).header
    assert header.ledger_note == "" and header.ledger_entries
    assert header.ledger_entries[0].index == 0 and header.ledger_entries[0].reason == "r"
    # A different file at that place is not taken for the run's.
    changed = {"path": str(file), "sha256": "0" * 64}
    header = records.read_results(_schema_1_file(tmp_path, [_first_result()], ledger=changed)).header
    assert header.ledger_entries is None and "changed since the run" in header.ledger_note
    # The built-in single file of schema 1 suites is gone: its entries show as the results cite them.
    old_builtin = {"path": "/elsewhere/site-packages/conformance/ledger.toml", "sha256": sha}
    header = records.read_results(_schema_1_file(tmp_path, [_first_result()], ledger=old_builtin)).header
    assert header.ledger_entries is None and "is not readable here" in header.ledger_note


def test_schema_1_reproduce_commands_name_the_plugin_where_it_lives_now(tmp_path):
    record = {**_first_result(), "reproduce": "pytest 'x' --backend torch-eager -p conformance.progress"}
    (result,) = records.read_results(_schema_1_file(tmp_path, [record])).results
    assert result.reproduce == "pytest 'x' --backend torch-eager -p conformance.cli.progress"
