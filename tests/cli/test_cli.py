"""The normconf command line in-process: report, compare, backends, cases; usage errors exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.adapter import registry
from conformance.cli import commands, launch, main, options
from conformance.model import profiles, sweep
from conformance.results.schema import SCHEMA_VERSION
from conformance.running import flags
from conformance.running.settings import selection_line

from support.reports import BENCH_SMALL, EVIL, case, result, standard_records, write
from support.suite import ROOT, TESTS


def normconf(*args, capsys):
    status = main.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def test_help_lists_commands_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as info:
        main.main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    for command in ("run", "report", "compare", "backends", "cases"):
        assert command in out
    assert "2  usage error" in out


@pytest.mark.parametrize("command", ["run", "report", "compare", "backends", "cases", "bench", "replay"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main.main([command, "--help"])
    assert info.value.code == 0 and "exit status:" in capsys.readouterr().out


def test_bench_help_lists_the_bench_profiles_and_the_default(capsys):
    with pytest.raises(SystemExit):
        main.main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"bench profiles: {', '.join(sweep.BENCH_PROFILES)} (default quick)" in out


def test_report_writes_html_and_markdown(tmp_path, capsys):
    results = write(tmp_path / "r.jsonl", standard_records())
    status, _, err = normconf("report", results, "-o", tmp_path / "out" / "report.html", capsys=capsys)
    assert status == 0 and "report: " in err
    text = (tmp_path / "out" / "report.html").read_text()
    assert "&lt;script&gt;window.__pwned" in text and EVIL not in text
    status, out, _ = normconf("report", results, "--format", "md", capsys=capsys)
    assert status == 0 and out.startswith("## normconf report")


def test_report_merges_shards_and_takes_benchmarks(tmp_path, capsys):
    records = standard_records()
    one = write(tmp_path / "s1.jsonl", records[:3], shard={"index": 1, "count": 2})
    two = write(tmp_path / "s2.jsonl", records[3:], shard={"index": 2, "count": 2})
    target = tmp_path / "report.html"
    status, _, _ = normconf(
        "report", one, two, "--bench", BENCH_SMALL, "--baseline", "torch-nn", "-o", target, capsys=capsys
    )
    text = target.read_text()
    assert status == 0 and "from 1 run(s)" in text and "(shard 2/2)" in text
    assert '<section id="benchmarks">' in text and "torch-nn (baseline)" in text


def _bad_files(tmp_path):
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"kind": "header", "schema": 1}\n{not json\n')
    other = write(tmp_path / "v9.jsonl", standard_records(), schema=SCHEMA_VERSION + 8)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"results": []}))
    records = standard_records()
    write(tmp_path / "odd.jsonl", [records[0], {**records[1], "outcome": "meh"}])
    write(tmp_path / "nocase.jsonl", [{k: v for k, v in records[0].items() if k != "case"}])
    return corrupt, other, bench


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("report", "{tmp}/missing.jsonl"), "missing.jsonl: cannot read results"),
        (("report", "{tmp}/corrupt.jsonl"), "corrupt.jsonl: corrupt results line"),
        (("report", "{tmp}/v9.jsonl"), "v9.jsonl: schema=10 is not allowed; allowed: 1, 2"),
        (("report", "{tmp}/odd.jsonl"), "odd.jsonl: line 3: outcome='meh' is not allowed; allowed: passed"),
        (("report", "{tmp}/nocase.jsonl"), "nocase.jsonl: line 2: case=None is not allowed"),
        (("report", "{tmp}/ok.jsonl", "--format", "pdf"), "--format='pdf' is not allowed; allowed: html, md"),
        (
            ("report", "{tmp}/ok.jsonl", "--bench", "{tmp}/bench.json"),
            "bench.json: not pytest-benchmark JSON",
        ),
        (
            ("report", "{tmp}/ok.jsonl", "--bench", BENCH_SMALL, "--baseline", "nope"),
            "--baseline='nope' is not allowed",
        ),
        (("report", "{tmp}/ok.jsonl", "--baseline", "alpha"), "(no --bench files given)"),
        (("compare", "{tmp}/ok.jsonl", "{tmp}/v9.jsonl"), "schema=10 is not allowed"),
        (("compare", "{tmp}/ok.jsonl", "{tmp}/ok.jsonl", "--growth", "0.5"), "--growth=0.5"),
        (("cases", "--profile", "huge"), "--profile='huge' is not allowed; allowed: smoke, ci, full"),
        (("cases", "--op", "spectral_norm"), "--op='spectral_norm' is not allowed"),
        (("cases", "--shard", "3/2"), "--shard='3/2' is not allowed; allowed: K/N with 1 <= K <= N"),
        (("cases", "--cases", "{tmp}/missing.toml"), "missing.toml"),
        (("run", "--profile", "huge"), "--profile='huge' is not allowed"),
        (("run", "--shard", "0/4"), "--shard='0/4' is not allowed"),
        (("run", "--max-timeouts", "0"), "--max-timeouts=0 is not allowed; allowed: a whole number >= 1"),
        (("run", "-n", "many"), "-n='many' is not allowed"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(tmp_path, capsys, args, message):
    _bad_files(tmp_path)
    write(tmp_path / "ok.jsonl", standard_records())
    status, _, err = normconf(*(str(a).format(tmp=tmp_path) for a in args), capsys=capsys)
    assert status == 2, err
    # As for argparse's own errors: the command's usage first, then what was wrong.
    usage, error = err.split("\n", 1)[0], err.splitlines()[-1]
    assert usage.startswith(f"usage: normconf {args[0]} ") and error.startswith(
        f"normconf {args[0]}: error: "
    )
    assert message in err


def test_bench_flag_without_benchmarks_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launch, "BENCH", tmp_path / "no-bench")
    status, _, err = normconf("run", "--bench", "-o", tmp_path, capsys=capsys)
    assert status == 2 and "--bench: no benchmarks in this installation" in err
    assert not (tmp_path / "results.jsonl").exists()


def test_argparse_errors_also_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main.main(["compare", "only-one.jsonl"])
    assert info.value.code == 2 and "the following arguments are required: NEW" in capsys.readouterr().err


def _pair(tmp_path):
    base = standard_records()
    new = [dict(r) for r in base]
    # alpha forward: passed -> failed (new failure); beta backward: failed -> passed (fixed);
    # alpha backward: worst_ratio 0.5 -> 0.9 (1.8x, under the 2x default); beta forward y 0.25 -> 0.75 (3x).
    new[0] = result("alpha", case(), "forward", "failed", ratios=(1.5,), reason="alpha x [forward]\ny is off")
    new[1] = result("alpha", case(), "backward", ratios=(0.9, 0.1))
    new[3] = result("beta", case(), "forward", ratios=(0.75,))
    new[4] = result("beta", case(), "backward", ratios=(0.5, 0.2))
    return write(tmp_path / "base.jsonl", base), write(tmp_path / "new.jsonl", new)


def test_compare_prints_new_failures_fixed_and_growth_and_exits_1(tmp_path, capsys):
    base, new = _pair(tmp_path)
    status, out, _ = normconf("compare", base, new, capsys=capsys)
    assert status == 1
    ln = "layer_norm-float32-4x8-eps1e-05-normal"
    assert f"new failures (1):\n  alpha {ln} [forward] passed -> failed: y is off" in out
    assert "fixed (1):\n  beta layer_norm-float32-4x8-eps1e-05-normal [backward] failed -> passed" in out
    assert "beta layer_norm-float32-4x8-eps1e-05-normal [forward] y: worst_ratio 0.25 -> 0.75 (3x)" in out
    assert "[backward] dx: worst_ratio 0.5 -> 0.9" not in out
    assert out.rstrip().endswith("verdict: REGRESSION (1 new failures, 2 error growths, 0 slower)")


def test_compare_of_a_run_with_itself_is_clean(tmp_path, capsys):
    base, _ = _pair(tmp_path)
    status, out, _ = normconf("compare", base, base, capsys=capsys)
    assert status == 0 and "verdict: no regression" in out and "2 still failing" in out


def test_compare_growth_threshold_is_configurable(tmp_path, capsys):
    base, new = _pair(tmp_path)
    _, out, _ = normconf("compare", base, new, "--growth", "1.5", capsys=capsys)
    assert "[backward] dx: worst_ratio 0.5 -> 0.9 (1.8x)" in out


def test_compare_with_benchmarks_reports_speed_beyond_noise(tmp_path, capsys):
    base, _ = _pair(tmp_path)
    data = json.loads(BENCH_SMALL.read_text())
    data["benchmarks"][1]["stats"]["median"] *= 1.5  # torch-nn layer_norm forward: 50% slower
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(data))
    status, out, _ = normconf("compare", base, base, "--bench", BENCH_SMALL, slow, capsys=capsys)
    assert status == 1
    assert "slower beyond the noise (>= 5% or the runs' IQR) (1):" in out
    assert "torch-nn layer_norm-float32-64x384-eps1e-05-normal [forward]: median 20 us -> 30 us (+50%" in out


def test_compare_without_common_results_is_a_usage_error(tmp_path, capsys):
    base = write(tmp_path / "a.jsonl", standard_records()[:2])
    other = write(tmp_path / "b.jsonl", standard_records()[3:])
    status, _, err = normconf("compare", base, other, capsys=capsys)
    assert status == 2 and "share no backend x case x check" in err


def test_cases_lists_ids_and_shards_split_them(capsys):
    status, out, err = normconf("cases", "--profile", "smoke", "--op", "rms_norm", capsys=capsys)
    ids = out.split()
    assert status == 0 and ids and all(i.startswith("rms_norm-") for i in ids)
    assert err.strip() == f"{len(ids)} cases (--profile smoke)"
    parts = [
        normconf("cases", "--op", "rms_norm", "--shard", f"{k}/3", capsys=capsys)[1].split()
        for k in (1, 2, 3)
    ]
    assert sorted(i for part in parts for i in part) == sorted(ids) and all(parts)
    status, out, _ = normconf("cases", "--op", "rms_norm", "--json", capsys=capsys)
    assert [c["id"] for c in json.loads(out)] == ids


def test_backends_lists_registered_backends(capsys, monkeypatch):
    from fakes.core import NumpyFake

    # One light backend instead of every installed one (loading torch, triton and onnx takes seconds).
    entry = registry.Entry("fake-numpy", "register() in fakes.core.NumpyFake", NumpyFake)
    monkeypatch.setattr(registry, "entries", lambda: {"fake-numpy": entry})
    status, out, _ = normconf("backends", "-v", capsys=capsys)
    assert status == 0 and "fake-numpy\n  origin: register() in fakes.core.NumpyFake" in out
    assert "available: yes, device cpu" in out
    status, out, _ = normconf("backends", capsys=capsys)
    head, line = out.splitlines()
    assert head.split() == ["backend", "status", "supports", "origin"]
    assert line.split() == [
        "fake-numpy",
        "available",
        "7",
        "ops,",
        "4",
        "dtypes",
        "register()",
        "in",
        "fakes.core.NumpyFake",
    ]
    status, out, _ = normconf("backends", "--json", capsys=capsys)
    (listed,) = json.loads(out)
    assert listed["name"] == "fake-numpy" and listed["status"] == "available" and len(listed["ops"]) == 7


def test_one_default_profile_for_run_cases_and_pytest():
    parser = main.build_parser()
    assert parser.parse_args(["run"]).profile == parser.parse_args(["cases"]).profile == flags.PROFILE.default
    assert flags.PROFILE.default == "smoke"


def test_every_run_says_its_profile_and_case_count_first():
    chosen = options.selection(main.build_parser().parse_args(["run"]))
    count = len(profiles.cases("smoke"))
    assert selection_line(chosen, "all") == (
        f"normconf: profile smoke ({count} cases; --profile ci or full for more), backends all"
    )
    full = options.selection(main.build_parser().parse_args(["run", "--profile", "full", "--op", "rms_norm"]))
    assert selection_line(full, "torch-nn").startswith("normconf: profile full (") and "for more" not in (
        selection_line(full, "torch-nn")
    )


def _normconf_subprocess(*args: str, **kwargs):
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # OpenVINO sends no usage event under CI=true
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "conformance.cli.main", *args], env=env, cwd=ROOT, **kwargs)


def test_backends_lists_one_line_per_backend_quietly_and_takes_plugins():
    done = _normconf_subprocess("backends", "-p", "fakes.core", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # Nothing on stderr: no warning of a library's (OpenVINO's usage telemetry forking after JAX started).
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    names = [line.split()[0] for line in lines[1:]]
    assert "fake-numpy" in names and "torch-eager" in names and len(names) == len(set(names))
    assert len(lines) == len(names) + 1


def test_cases_into_a_closed_pipe_ends_quietly():
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    command = [sys.executable, "-m", "conformance.cli.main", "cases", "--profile", "full"]
    with subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # as `| head -1` does once it has its line
        err = proc.stderr.read().decode()
        status = proc.wait(timeout=120)
    assert first.strip() and status == main.BROKEN_PIPE and "Traceback" not in err, err


def test_conformance_never_imports_reports_or_jinja():
    code = (
        "import sys, conformance.cli.main, conformance.results.render, conformance.results.runs;"
        "import conformance.results.diff;"
        "conformance.cli.main.build_parser();"
        "banned = ('reports', 'jinja2', 'backends', 'torch');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in banned))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_run_forwards_the_timeout_options_to_pytest():
    args = main.build_parser().parse_args(["run", "--call-timeout", "7", "--max-timeouts", "5"])
    forwarded = commands._pytest_args(args, Path("results.jsonl"))
    assert forwarded[forwarded.index("--call-timeout") + 1] == "7.0"
    assert forwarded[forwarded.index("--max-timeouts") + 1] == "5"


def test_run_forwards_every_ledger_option_to_pytest():
    argv = ["run", "--ledger", "a.toml", "--ledger", "b.toml", "--no-builtin-ledger", "--strict-ledger"]
    forwarded = commands._pytest_args(main.build_parser().parse_args(argv), Path("results.jsonl"))
    assert [forwarded[i + 1] for i, arg in enumerate(forwarded) if arg == "--ledger"] == ["a.toml", "b.toml"]
    assert "--no-builtin-ledger" in forwarded and "--strict-ledger" in forwarded
    plain = commands._pytest_args(main.build_parser().parse_args(["run"]), Path("results.jsonl"))
    assert not {"--ledger", "--no-builtin-ledger", "--strict-ledger"} & set(plain)
