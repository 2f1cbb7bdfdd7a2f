"""The HTML and Markdown renderers on fixture results: sections, escaping, self-containment, size."""

from __future__ import annotations

import json
import re
import time

import pytest

from conformance.results import benchjson, render, runs
from reports import html, markdown

from support.reports import BENCH_SMALL, EVIL, ci_sized_records, standard_records, write


@pytest.fixture
def data(tmp_path):
    return render.ReportInput(tuple(runs.read_runs([write(tmp_path / "run.jsonl", standard_records())])))


def test_renderers_are_found_through_entry_points():
    assert {"html", "md"} <= set(render.formats())
    assert render.find_renderer("html") is html.render and render.find_renderer("md") is markdown.render
    with pytest.raises(render.RendererError, match="--format='pdf' is not allowed; allowed: html, md"):
        render.find_renderer("pdf")


def test_html_has_every_section_and_is_self_contained(data):
    text = html.render(data)
    for section in ("environment", "matrix", "failures", "deviations", "tolerances", "coverage", "cases"):
        assert f'<section id="{section}">' in text
    assert "benchmarks" not in re.findall(r'<section id="(\w+)"', text)
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    # No resource is loaded from anywhere: no src attributes, no stylesheet links, no url() in CSS.
    assert not re.search(r"\ssrc=|<link\s|url\(|@import", text)
    assert "prefers-color-scheme: dark" in text and 'name="viewport"' in text


def test_everything_from_the_results_is_escaped(data):
    text = html.render(data)
    assert "<script>window.__pwned" not in text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in text
    assert "<b>bold</b>" not in text and "&lt;b&gt;bold&lt;/b&gt;" in text
    assert text.count("<script>") == 1  # the report's own filter script only


def test_benchmarks_and_comparison_sections_appear_when_given(tmp_path):
    records = standard_records()
    base = write(tmp_path / "base.jsonl", records)
    changed = [dict(r) for r in records]
    changed[0] = {**changed[0], "outcome": "failed", "reason": "x [forward]\nnow broken"}
    new = write(tmp_path / "new.jsonl", changed)
    data = render.ReportInput(
        tuple(runs.read_runs([base, new])), (benchjson.read(BENCH_SMALL),), baseline="torch-eager"
    )
    text = html.render(data)
    assert '<section id="benchmarks">' in text and '<section id="comparison">' in text
    assert "<svg viewBox=" in text and "layer_norm forward: GB/s" in text
    assert "base → new" in text and "regression" in text and "now broken" in text


def test_markdown_summary_escapes_and_lists_failures(data):
    text = markdown.render(data)
    assert text.startswith("## normconf report\n")
    assert "| alpha | 2 | 0 | 0 | 1 | 0 | 0 | 0 |" in text
    assert "### Failures (2)" in text
    # Outside code fences (which show text verbatim) nothing from the results is left unescaped.
    prose = re.sub(r"(?ms)^ *```text\n.*?^ *```$", "", text)
    assert "<script>" not in prose and "&lt;script&gt;" in prose
    assert "  ```text\n  pytest 'conformance/suite/test_backward.py::test_backward[beta:" in text


def test_markdown_fence_outgrows_backticks_in_the_text():
    assert markdown.fence("a ``` b") == ["````text", "a ``` b", "````"]
    assert markdown.escape("a|b <i>*x*</i>\nc") == "a\\|b &lt;i&gt;\\*x\\*&lt;/i&gt; c"


def test_ci_sized_report_stays_small_and_fast_to_build(tmp_path):
    path = write(tmp_path / "ci.jsonl", ci_sized_records(), profile="ci")
    start = time.perf_counter()
    text = html.render(render.ReportInput(tuple(runs.read_runs([path]))))
    elapsed = time.perf_counter() - start
    assert len(text.encode()) < 5_000_000, len(text.encode())
    assert elapsed < 20, elapsed
    assert EVIL not in text


def test_rounding_section_shows_bias_per_backend_and_dtype(tmp_path):
    from conformance.judging.compare import compare
    from conformance.judging.tolerances import Tolerance

    from support.reports import case, result

    rng = __import__("numpy").random.default_rng(0)
    exact = rng.standard_normal(2000)
    tol = Tolerance(0.01, 0.01, 0.0, "t", "w")
    from fakes.core import directed

    truncated = compare("y", directed(exact, "bfloat16", "zero"), exact, tol, "bfloat16").to_dict()
    records = []
    for backend, comparison, outcome in (("fake-trunc", truncated, "failed"),):
        record = result(
            backend, case(dtype="bfloat16"), outcome=outcome, reason="output 'y' rounds with a bias"
        )
        record["comparisons"] = [comparison]
        records.append(record)
    data = render.ReportInput(tuple(runs.read_runs([write(tmp_path / "run.jsonl", records)])))
    text = html.render(data)
    assert '<section id="rounding">' in text
    row = re.search(r"<td>fake-trunc</td><td>bfloat16</td>(.*?)</tr>", text).group(1)
    assert ">1</td>" in row  # judged and failing
    bias = re.search(r"<td class=\"num\">([-+0-9.]+) / ([-+0-9.]+)</td>", row)
    assert bias and -0.55 < float(bias.group(1)) < -0.45  # median / worst: truncation's -1/2
    assert "FAILS" in text  # the failure's figure row: bias / drift with the limit
    md = markdown.render(data)
    assert "### Rounding" in md and "| fake-trunc | bfloat16 | 1 of 1 | 1 |" in md


def test_rounding_section_says_when_nothing_was_judged(tmp_path):
    """Outputs under 256 elements are recorded, not judged: the section says so instead of a table
    of empty figures."""
    from conformance.judging.compare import compare
    from conformance.judging.tolerances import Tolerance

    from support.reports import case, result

    exact = __import__("numpy").random.default_rng(0).standard_normal(40)
    small = compare("y", exact.astype("float16"), exact, Tolerance(0.01, 0.01, 0.0, "t", "w"), "float16")
    assert small.rounding is not None and not small.rounding.judged
    record = result("fake-half", case(dtype="float16"))
    record["comparisons"] = [small.to_dict()]
    text = html.render(render.ReportInput(tuple(runs.read_runs([write(tmp_path / "run.jsonl", [record])]))))
    section = text[text.index('<section id="rounding">') :].split("</section>")[0]
    assert "1 half-precision comparison(s) recorded, none judged" in section and "<table" not in section


def test_a_gpu_benchmark_shows_its_device_and_host_time(tmp_path):
    data = json.loads(BENCH_SMALL.read_text())
    data["benchmarks"][1]["extra_info"].update(device_ms=0.005, launches=3, h2d_copies=1)
    path = tmp_path / "device.json"
    path.write_text(json.dumps(data))
    base = write(tmp_path / "base.jsonl", standard_records())
    given = render.ReportInput(tuple(runs.read_runs([base])), (benchjson.read(path),), baseline="torch-eager")
    text = html.render(given)
    assert "device 5 · host 15 µs · 3 launches · 1 h2d</small>" in text
    assert text.count('<small class="device"') == 1  # the CPU records have no device line
    assert "; device 5 us + host 15 us, 3 launches, 1 h2d copies" in markdown.render(given)
