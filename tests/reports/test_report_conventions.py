"""The report's Conventions and Properties sections on fixture results (HTML and Markdown)."""

from __future__ import annotations

from conformance.results import render, runs
from reports import conventions, html, markdown

from support.reports import convention_records, standard_records, write


def _runs(tmp_path, *variants: str):
    paths = []
    for i, eps in enumerate(variants):
        (tmp_path / f"r{i}").mkdir()
        paths.append(
            write(tmp_path / f"r{i}" / "results.jsonl", [*standard_records(), *convention_records(eps)])
        )
    return runs.read_runs(paths)


def test_conventions_mark_answers_that_differ_from_the_reference(tmp_path):
    found = conventions.conventions(_runs(tmp_path, "added-to-std"))
    assert found is not None and [c.key for c in found.columns] == ["alpha", "beta"]
    eps = next(r for r in found.rows if r.question == "rms_norm.eps")
    alpha, beta = (eps.cells[c.id] for c in found.columns)
    assert (alpha.text, alpha.state) == ("inside-sqrt", "reference")
    assert (beta.text, beta.state) == ("added-to-std*", "differs")
    assert beta.evidence == (("added-to-std", "0"), ("inside-sqrt", "0.3"))
    variance = next(r for r in found.rows if r.question == "layer_norm.variance")
    assert list(variance.cells) == [found.columns[0].id] and variance.op == "layer_norm"
    assert found.changed == ()


def test_conventions_that_changed_between_runs_are_listed(tmp_path):
    found = conventions.conventions(_runs(tmp_path, "inside-sqrt", "added-to-std"))
    assert found is not None
    assert found.changed == ("beta rms_norm.eps: inside-sqrt (r0/results) → added-to-std (r1/results)",)


def test_properties_show_the_counterexample_of_a_failure(tmp_path):
    found = conventions.properties(_runs(tmp_path, "inside-sqrt"))
    assert found is not None
    (row,) = found.rows
    alpha, beta = (row.cells[c.id] for c in found.columns)
    assert (alpha.outcome, alpha.bitwise, alpha.counterexample) == ("passed", "yes", ())
    assert beta.outcome == "failed" and ("rows", "2") in beta.counterexample and beta.worst_ratio == "3.5"


def test_no_sections_without_fingerprints_or_properties(tmp_path):
    loaded = runs.read_runs([write(tmp_path / "r.jsonl", standard_records())])
    assert conventions.conventions(loaded) is None and conventions.properties(loaded) is None
    text = html.render(render.ReportInput(tuple(loaded)))
    assert 'id="conventions"' not in text and 'id="properties"' not in text


def test_html_and_markdown_carry_both_sections(tmp_path):
    data = render.ReportInput(tuple(_runs(tmp_path, "inside-sqrt", "added-to-std")))
    text = html.render(data)
    assert '<section id="conventions">' in text and '<section id="properties">' in text
    assert "added-to-std*" in text and "inside-sqrt: 0.3" in text
    assert "counterexample: op=rms_norm, rows=2, features=8" in text
    md = markdown.render(data)
    assert "### Conventions" in md and "### Properties" in md
    # Columns: alpha and beta of the first run, then of the second.
    assert "| rms\\_norm.eps | inside-sqrt | inside-sqrt | inside-sqrt | added-to-std\\* |" in md
    assert "counterexample op=rms\\_norm, rows=2, features=8" in md
    assert "Changed between runs:" in md


def test_conventions_command_renders_the_table_alone(tmp_path, capsys):
    from conformance.cli import main

    (path,) = [write(tmp_path / "results.jsonl", [*standard_records(), *convention_records("added-to-std")])]
    assert main.main(["conventions", str(path)]) == 0
    md = capsys.readouterr().out
    assert md.startswith("## normconf conventions") and "### Conventions" in md
    assert "| rms\\_norm.eps | inside-sqrt | added-to-std\\* |" in md
    assert "### Failures" not in md and "### Properties" not in md  # the table alone
    out = tmp_path / "conventions.html"
    assert main.main(["conventions", str(path), "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    assert '<section id="conventions">' in page and "added-to-std*" in page
    assert '<section id="matrix">' not in page and "default-src 'none'" in page
    bare = write(tmp_path / "plain.jsonl", standard_records())
    assert main.main(["conventions", str(bare)]) == 0
    assert "hold no fingerprint record" in capsys.readouterr().out
    assert main.main(["conventions", str(path), "--format", "pdf"]) == 2
    assert "--format='pdf' is not allowed; allowed: html, md" in capsys.readouterr().err


def test_unmatched_answers_are_counted_and_show_the_nearest_hypothesis(tmp_path):
    from support.reports import fingerprint

    record = fingerprint(
        "beta", "rms_norm.eps_precision", "unmatched", "as-given", {"as-given": 2e-5, "float32": 3e-5}
    )
    record["matched"] = False
    loaded = runs.read_runs([write(tmp_path / "r.jsonl", [*standard_records(), record])])
    found = conventions.conventions(loaded)
    assert found is not None
    ((question, column, answer),) = found.unmatched()
    assert (question, column, answer.text) == ("rms_norm.eps_precision", "beta", "unmatched?")
    assert answer.nearest == "nearest as-given at 2e-05 (a match needs at most 1e-06)"
    md = markdown.render(render.ReportInput(tuple(loaded)))
    assert "Unmatched answers (1): the nearest hypothesis and its error" in md
    assert "- rms\\_norm.eps\\_precision, beta: nearest as-given at 2e-05 (a match needs at most 1e-06)" in md
    text = html.render(render.ReportInput(tuple(loaded)))
    assert "1 answer unmatched (no hypothesis within the noise" in text
    assert "<b>nearest as-given at 2e-05 (a match needs at most 1e-06)</b>" in text
