"""normconf profile (a run's time per backend and phase) and normconf cache (list, clear)."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.adapter import cache as graph_cache
from conformance.cli import main


def _run(capsys, *args: object) -> tuple[int, str, str]:
    status = main.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def _results(path: Path) -> Path:
    header = {"kind": "header", "schema": 2, "timing": {"wall_s": 4.0, "workers": 2, "write_s": 0.25}}
    phases = {"prepare_s": 0.5, "compile_s": 2.0, "call_s": 0.25, "oracle_s": 0.125, "judge_s": 0.125}
    record = {
        "kind": "result",
        "backend": "torch-compile",
        "case": {"id": "c"},
        "check": "forward",
        "outcome": "passed",
        "duration_s": 3.0,
        "extra": {"phases": phases},
    }
    path.write_text("".join(json.dumps(r) + "\n" for r in (header, record)))
    return path


def test_profile_prints_the_phase_table_and_the_time_outside_records(tmp_path, capsys):
    status, out, _ = _run(capsys, "profile", _results(tmp_path / "results.jsonl"))
    assert status == 0
    head, row = out.splitlines()[:2]
    assert head.split()[:4] == ["backend", "records", "seconds", "share"]
    assert "compile/export" in head
    assert row.split()[:3] == ["torch-compile", "1", "3.0"] and row.split()[5] == "2.0"
    assert "4.0 s wall on 2 workers = 8.0 worker-seconds" in out
    assert "outside the records: 5.0 s (62%)" in out


def test_profile_of_a_missing_file_is_a_usage_error(tmp_path, capsys):
    status, _, err = _run(capsys, "profile", tmp_path / "nope.jsonl")
    assert status == 2 and "nope.jsonl" in err


def test_cache_lists_and_clears_a_graph_cache(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(graph_cache.VARIABLE, str(folder))
    status, out, _ = _run(capsys, "cache")
    assert status == 0 and "empty" in out
    graph_cache.store(graph_cache.folder("onnx-export") / "a.onnx", b"x" * 2048)  # type: ignore[operator]
    status, out, _ = _run(capsys, "cache")
    assert status == 0 and out.splitlines()[1].split()[0] == "onnx-export" and "1 files" in out
    status, out, _ = _run(capsys, "cache", "--clear")
    assert status == 0 and "cleared" in out and not folder.exists()


def test_cache_clear_refuses_a_folder_normconf_did_not_make(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep")
    status, _, err = _run(capsys, "cache", "--graph-cache", tmp_path, "--clear")
    assert status == 2 and "CACHEDIR.TAG" in err and "nothing was deleted" in err
    assert (tmp_path / "precious.txt").exists()
