"""``normconf run`` end to end (pytest in a subprocess with the fake backends), sharding and progress."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cli.launch import Display
from conformance.model import profiles
from conformance.results import runs
from conformance.running import shard

from support.suite import ROOT, TESTS


def normconf(tmp_path, *args, env=None):
    paths = [str(TESTS), os.environ.get("PYTHONPATH", "")]
    full_env = {**os.environ, "CI": "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "conformance.cli.main", *map(str, args)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def test_parse_and_select_are_deterministic_and_cover_everything():
    assert shard.parse(" 2 / 5 ") == shard.Shard(2, 5) and str(shard.Shard(2, 5)) == "2/5"
    for bad in ("0/3", "4/3", "1", "a/b", "1/0"):
        with pytest.raises(shard.ShardError, match="allowed: K/N with 1 <= K <= N"):
            shard.parse(bad)
    items = [(f"case{i % 7}", f"node{i}") for i in range(40)] + [(None, "other-a"), (None, "other-b")]
    parts = [shard.select(items, shard.Shard(k, 3), lambda t: t[0], lambda t: t[1]) for k in (1, 2, 3)]
    flat = [item for part in parts for item in part]
    assert sorted(flat, key=str) == sorted(items, key=str) and all(parts)
    for case_id in {c for c, _ in items if c}:
        homes = {k for k, part in enumerate(parts) if any(c == case_id for c, _ in part)}
        assert len(homes) == 1, f"{case_id} is split over shards {homes}"
    again = [shard.select(items[::-1], shard.Shard(k, 3), lambda t: t[0], lambda t: t[1]) for k in (1, 2, 3)]
    assert [set(p) for p in again] == [set(p) for p in parts]


def test_display_prints_plain_lines_at_each_tenth_in_ci():
    out = io.StringIO()
    display = Display(out, bar=False)
    display.event({"total": 20})
    for i in range(20):
        display.event({"done": f"t{i}", "outcome": "failed" if i == 3 else "passed"})
    display.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "normconf: 20 tests"
    assert len(lines) == 12 and "\r" not in out.getvalue()
    assert lines[-1].startswith("normconf: 20/20 100%  passed 19 failed 1")


def test_display_draws_a_bar_on_a_terminal():
    out = io.StringIO()
    display = Display(out, bar=True)
    display.event({"total": 4})
    for i in range(4):
        display.event({"done": f"t{i}", "outcome": "passed"})
    display.finish()
    assert "\r[" + "#" * 30 + "] 4/4 100%  passed 4" in out.getvalue()


def test_run_with_a_failing_backend_exits_1_and_still_reports(tmp_path):
    status, out, err = normconf(
        tmp_path,
        "run",
        "--backend",
        "fake-bias-ignored",
        "--profile",
        "smoke",
        "--op",
        "layer_norm",
        "--dtype",
        "float32",
        "-n",
        "0",
        "-p",
        "fakes.core",
        "-o",
        tmp_path,
        "--save-failures",
        tmp_path / "bundles",
    )
    assert status == 1, out + err
    text = (tmp_path / "report.html").read_text()
    assert "Failures (0)" not in text and "fake-bias-ignored" in text
    assert "-m pytest --pyargs" in text
    # --save-failures reaches pytest: a replayable bundle per failed comparison, named in the results.
    failed = [r for r in runs.read_runs([tmp_path / "results.jsonl"])[0].records if r.outcome == "failed"]
    named = {Path(r.extra["bundle"]) for r in failed if r.check in ("forward", "backward")}
    assert named and named == {p.parent for p in (tmp_path / "bundles").rglob("bundle.json")}
    # After the counts: the worst failures, where and by how much; summary.md has the same figures.
    assert "worst failures (" in out and "the report's #failures" in out
    assert "worst_ratio" in (tmp_path / "summary.md").read_text().split("### Failures")[1]
    assert " at [" in (tmp_path / "summary.md").read_text()
    # The run said what it would run before it started; a bundle replays through normconf replay.
    assert out.startswith("normconf: profile smoke (") and "; pytest log " in out.splitlines()[0]
    status, out, err = normconf(tmp_path, "replay", sorted(named)[0], "-p", "fakes.core")
    assert status == 1 and "FAIL " in out, out + err


def test_run_where_a_backend_executes_no_check_exits_1_and_says_so(tmp_path):
    status, out, err = normconf(
        tmp_path,
        "run",
        "--backend",
        "fake-rms-norm-only",
        "--profile",
        "smoke",
        "--op",
        "layer_norm",
        "-n",
        "0",
        "-p",
        "fakes.broken",
        "-o",
        tmp_path,
    )
    assert status == 1, out + err
    assert "normconf: FAILED: backend fake-rms-norm-only executed no check" in out
    # The progress lines name the outcome as the table does: unsupported, not skipped.
    progress = [line for line in out.splitlines() if line.startswith("normconf: ") and "%" in line]
    words = progress[-1].split()
    counts = dict(zip(words[3:-1:2], words[4::2], strict=False))
    assert int(counts.get("unsupported", 0)) > 100 and int(counts.get("skipped", 0)) <= 1, progress[-1]


def test_run_with_an_unknown_backend_is_a_usage_error(tmp_path):
    status, _, err = normconf(
        tmp_path, "run", "--backend", "fake-nump", "-n", "0", "-p", "fakes.core", "-o", tmp_path
    )
    assert status == 2
    assert "unknown backend 'fake-nump'" in err and "did you mean 'fake-numpy'?" in err
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.heavy
def test_run_writes_results_report_summary_and_shards_merge(tmp_path):
    common = [
        "--backend",
        "fake-numpy",
        "--profile",
        "smoke",
        "--op",
        "rms_norm,layer_norm",
        "--dtype",
        "float32",
    ]
    common += ["-n", "0", "-p", "fakes.core"]
    outputs = []
    for k in (1, 2):
        status, out, err = normconf(
            tmp_path, "run", *common, "--shard", f"{k}/2", "-o", tmp_path / f"shard{k}"
        )
        assert status == 0, out + err
        outputs.append(out)
    # Progress in CI: plain lines, the total first and the whole count at the end; then the summary table.
    lines = outputs[0].splitlines()
    count = int(
        next(line for line in lines if line.startswith("normconf: ") and line.endswith(" tests")).split()[1]
    )
    assert count > 0 and f"normconf: {count}/{count} 100%  passed " in outputs[0] and "\r" not in outputs[0]
    assert any(line.split()[:3] == ["backend", "op", "passed"] for line in lines)
    shard1 = tmp_path / "shard1"
    assert '<section id="matrix">' in (shard1 / "report.html").read_text()
    assert (shard1 / "summary.md").read_text().startswith("## normconf report")
    assert "passed" in (shard1 / "pytest.log").read_text()
    loaded = [runs.read_runs([tmp_path / f"shard{k}" / "results.jsonl"])[0] for k in (1, 2)]
    assert [r.header.shard for r in loaded] == [(1, 2), (2, 2)]
    assert all(r.outcome == "passed" and r.backend == "fake-numpy" for run in loaded for r in run.records)
    # The two shards split the cases between them: disjoint, and together every case once.
    ids = [{r.case_id for r in run.records} for run in loaded]
    expected = {
        c.id for c in profiles.cases("smoke") if c.dtype == "float32" and c.op in ("rms_norm", "layer_norm")
    }
    assert ids[0] and ids[1] and not ids[0] & ids[1] and ids[0] | ids[1] == expected
    results = [tmp_path / f"shard{k}" / "results.jsonl" for k in (1, 2)]
    status, _, err = normconf(tmp_path, "report", *results, "-o", tmp_path / "merged.html")
    assert status == 0, err
    text = (tmp_path / "merged.html").read_text()
    assert "from 1 run(s)" in text and "(shard 1/2)" in text and "(shard 2/2)" in text
    merged = runs.read_runs(results)
    assert len(merged) == 1 and {r.case_id for r in merged[0].records} == expected


def test_bench_times_the_backends_and_prints_gbps_and_fraction_of_copy(tmp_path):
    # InstanceNorm in float16: in the tiny bench profile, not in the suite's smoke profile.
    status, out, err = normconf(
        tmp_path, "bench", "--backend", "fake-numpy", "-p", "fakes.core", "--bench-profile", "tiny",
        "--op", "instance_norm", "--dtype", "float16", "-o", tmp_path,
    )  # fmt: skip
    assert status == 0, out + err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["backend", "case", "check"])
    assert lines[head].split() == ["backend", "case", "check", "median", "GB/s", "of", "copy"]
    rows = [line.split() for line in lines[head + 1 :] if line.startswith("fake-numpy")]
    assert rows and {r[2] for r in rows} == {"forward", "backward"}
    assert all(r[1].startswith("instance_norm-float16-") and r[-1].endswith("%") for r in rows)
    assert any(line.startswith("copy: ") and "GB/s" in line for line in lines)
    assert (tmp_path / "bench.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "--bench", "--baseline", "nope"), "--baseline='nope' is not allowed; allowed: a backend"),
        (("run", "--baseline", "torch-nn"), "--baseline without --bench is not allowed"),
        (
            ("bench", "--bench-profile", "huge"),
            "--bench-profile='huge' is not allowed; allowed: sweep, quick",
        ),
        (
            ("bench", "--backend", "fake-numpy", "--baseline", "torch-nn"),
            "--baseline='torch-nn' is not allowed",
        ),
        (("bench", "--backend", "fake-nump"), "unknown backend 'fake-nump'"),
        (("bench", "--bench-profile", "tiny", "--dtype", "float64"), "no benchmark case selected"),
    ],
)
def test_bench_options_are_checked_before_anything_runs(tmp_path, args, message):
    status, out, err = normconf(tmp_path, *args, "-p", "fakes.core", "-o", tmp_path)
    assert status == 2 and message in err, out + err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing was written
