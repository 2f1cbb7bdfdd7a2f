"""``normconf run`` end to end (pytest in a subprocess with the fake backends), sharding and progress."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, TESTS

from conformance import profiles, runs, shard
from conformance.runner import Display


def normconf(tmp_path, *args, env=None):
    paths = [str(TESTS), os.environ.get("PYTHONPATH", "")]
    full_env = {**os.environ, "CI": "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "conformance.cli", *map(str, args)],
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


def test_run_writes_results_report_and_summary(tmp_path):
    status, out, err = normconf(
        tmp_path,
        "run",
        "--backend",
        "fake-numpy",
        "--profile",
        "smoke",
        "--op",
        "rms_norm",
        "--dtype",
        "float32",
        "-n",
        "0",
        "-p",
        "normconf_fakes",
        "-o",
        tmp_path,
    )
    assert status == 0, out + err
    lines = out.splitlines()
    total = next(line for line in lines if line.startswith("normconf: ") and line.endswith(" tests"))
    count = int(total.split()[1])
    assert count > 0 and f"normconf: {count}/{count} 100%  passed " in out
    assert any(line.split()[:3] == ["backend", "op", "passed"] for line in lines)
    (run,) = runs.load([tmp_path / "results.jsonl"])
    assert run.header["profile"] == "smoke" and 0 < len(run.records) <= count
    assert {(r["backend"], r["case"]["op"], r["outcome"]) for r in run.records} == {
        ("fake-numpy", "rms_norm", "passed")
    }
    assert '<section id="matrix">' in (tmp_path / "report.html").read_text()
    assert (tmp_path / "summary.md").read_text().startswith("## normconf report")
    assert "passed" in (tmp_path / "pytest.log").read_text()


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
        "normconf_fakes",
        "-o",
        tmp_path,
    )
    assert status == 1, out + err
    text = (tmp_path / "report.html").read_text()
    assert "Failures (0)" not in text and "fake-bias-ignored" in text and "reproduce: <code>pytest" in text


def test_run_with_an_unknown_backend_is_a_usage_error(tmp_path):
    status, _, err = normconf(
        tmp_path, "run", "--backend", "fake-nump", "-n", "0", "-p", "normconf_fakes", "-o", tmp_path
    )
    assert status == 2
    assert "unknown backend 'fake-nump'" in err and "did you mean 'fake-numpy'?" in err
    assert not (tmp_path / "results.jsonl").exists()


def test_shards_split_the_cases_and_merge_into_one_report(tmp_path):
    common = [
        "--backend",
        "fake-numpy",
        "--profile",
        "smoke",
        "--dtype",
        "float32",
        "-n",
        "0",
        "-p",
        "normconf_fakes",
    ]
    for k in (1, 2):
        status, out, err = normconf(
            tmp_path, "run", *common, "--shard", f"{k}/2", "-o", tmp_path / f"shard{k}"
        )
        assert status == 0, out + err
    loaded = [runs.load([tmp_path / f"shard{k}" / "results.jsonl"])[0] for k in (1, 2)]
    assert [r.header["shard"] for r in loaded] == [{"index": 1, "count": 2}, {"index": 2, "count": 2}]
    ids = [{r["case"]["id"] for r in run.records} for run in loaded]
    expected = {c.id for c in profiles.cases("smoke") if c.dtype == "float32"}
    assert ids[0] and ids[1] and not ids[0] & ids[1] and ids[0] | ids[1] == expected
    status, _, err = normconf(
        tmp_path,
        "report",
        tmp_path / "shard1" / "results.jsonl",
        tmp_path / "shard2" / "results.jsonl",
        "-o",
        tmp_path / "merged.html",
    )
    assert status == 0, err
    text = (tmp_path / "merged.html").read_text()
    assert "from 1 run(s)" in text and "(shard 1/2)" in text and "(shard 2/2)" in text
    merged = runs.load([tmp_path / "shard1" / "results.jsonl", tmp_path / "shard2" / "results.jsonl"])
    assert len(merged) == 1 and {r["case"]["id"] for r in merged[0].records} == expected
    assert json.loads((tmp_path / "shard1" / "results.jsonl").read_text().splitlines()[0])["exitstatus"] == 0
