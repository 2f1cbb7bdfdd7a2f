"""The pytest plugin end to end: options, results file, xdist, listing, ledger outcomes, usage errors."""

from __future__ import annotations

import json
import re

import pytest

from conformance.model import profiles
from conformance.results.records import line, read_raw
from conformance.results.schema import SCHEMA_VERSION
from conformance.running import outcomes, plugin


def read(path):
    """(header, result records) as the JSON the file holds."""
    header, records = read_raw(path)
    return header, [r for r in records if r["kind"] == "result"]


def test_results_file_has_header_and_one_record_per_backend_case_check(suite):
    run = suite("--backend", "fake-numpy", "--profile", "smoke")
    assert run.returncode == 0, run.output[-2000:]
    header, records = read(run.results)
    assert header["schema"] == SCHEMA_VERSION
    env = header["environment"]
    assert env["packages"]["numpy"] and env["python"] and "git_commit" in env
    assert len(header["tolerances"]["sha256"]) == 64
    assert header["backends"]["fake-numpy"]["device"] == "cpu"
    cases = profiles.cases("smoke")
    training = sum(c.training for c in cases)
    assert len(records) == 5 * len(cases) + training
    first = records[0]
    assert set(first) >= {
        "backend",
        "case",
        "check",
        "outcome",
        "reason",
        "summary",
        "comparisons",
        "duration_s",
        "reproduce",
    }
    assert first["case"]["id"] and "shape" in first["case"]
    forward = next(r for r in records if r["check"] == "forward")
    figures = forward["comparisons"][0]
    assert set(figures) >= {
        "output",
        "numel",
        "mismatched",
        "max_abs",
        "max_rel",
        "max_ulp",
        "worst_ratio",
        "worst_index",
        "tolerance",
    }
    assert figures["tolerance"]["source"].startswith("tolerances.toml rule[") and figures["tolerance"]["why"]
    # Everything a reader needs is a field of its own, never only text.
    rule = figures["tolerance"]["rule"]
    assert isinstance(rule, int) and figures["tolerance"]["source"].startswith(
        f"tolerances.toml rule[{rule}]"
    )
    assert figures["tolerance"]["keys"].get("output") == "y" and figures["ledger"] is None
    assert header["checks"] == [
        "forward",
        "backward",
        "training",
        "inputs_unchanged",
        "aliasing",
        "determinism",
    ]
    assert {e["index"] for e in header["ledger"]["entries"]} >= {0}
    assert "normconf" in run.output and "results:" in run.output


@pytest.mark.heavy
def test_xdist_run_writes_one_file_with_the_same_records(suite, tmp_path):
    serial = suite("--backend", "fake-numpy", "--profile", "smoke")
    parallel = suite(
        "--backend", "fake-numpy", "--profile", "smoke", "-n", "2", "--results", str(tmp_path / "p.jsonl")
    )
    assert parallel.returncode == 0
    key = lambda r: (r["backend"], r["case"]["id"], r["check"], r["outcome"])  # noqa: E731
    _, par = read(tmp_path / "p.jsonl")
    assert sorted(map(key, serial.records)) == sorted(map(key, par))
    assert not list(tmp_path.glob(".*.tmp"))


def test_op_and_dtype_select_cases(suite):
    run = suite(
        "--backend", "fake-numpy", "--profile", "smoke", "--op", "rms_norm", "--dtype", "bfloat16,float16"
    )
    assert run.returncode == 0
    assert {(r["case"]["op"], r["case"]["dtype"]) for r in run.records} == {
        ("rms_norm", "bfloat16"),
        ("rms_norm", "float16"),
    }


def test_cases_file_runs_exactly_those_cases(suite, tmp_path):
    cases = tmp_path / "mine.toml"
    cases.write_text(
        '[[case]]\nop = "rms_norm"\nshape = [3, 4096]\ndtype = "bfloat16"\neps = 1e-6\n'
        "weight_offset = 1.0\n\n"
        '[[case]]\nop = "layer_norm"\nshape = [2, 5, 7]\ndtype = "float32"\neps = 1e-5\nnorm_ndim = 2\n'
    )
    run = suite("--backend", "fake-numpy", "--cases", str(cases))
    assert run.returncode == 0, run.output[-2000:]
    assert {r["case"]["id"] for r in run.records} == {
        "rms_norm-bfloat16-3x4096-eps1e-06-normal-off1.0",
        "layer_norm-float32-2x5x7-eps1e-05-normal-nd2",
    }
    assert "--cases" in run.records[0]["reproduce"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--backend", "fake-nump"), "unknown backend 'fake-nump'; known: "),
        (("--backend", "fake-nump"), "did you mean 'fake-numpy'?"),
        (("--profile", "huge"), "--profile='huge' is not allowed; allowed: smoke, ci, full"),
        (("--op", "spectral_norm"), "--op='spectral_norm' is not allowed; allowed: comma list of layer_norm"),
        (("--dtype", "float8"), "--dtype='float8' is not allowed"),
        (("--call-timeout", "0"), "--call-timeout=0.0 is not allowed; allowed: seconds > 0"),
        (
            ("--backend", "fake-unavailable"),
            "--backend fake-unavailable: needs a device this machine does not have",
        ),
    ],
)
def test_bad_options_stop_the_run_at_start(suite, args, message):
    run = suite(*args)
    assert run.returncode == 4, run.output[-2000:]
    assert message in run.output
    assert not run.results.exists()


def test_malformed_cases_file_names_file_and_entry(suite, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            [
                {"op": "layer_norm", "shape": [4, 8], "dtype": "float32", "eps": 1e-5},
                {"op": "layer_norm", "shape": [4, 8], "dtype": "fp32", "eps": 1e-5},
            ]
        )
    )
    run = suite("--backend", "fake-numpy", "--cases", str(bad))
    assert run.returncode == 4
    assert (
        f"--cases={bad}: entry 1: dtype='fp32' is not allowed; allowed: float64, float32, float16, bfloat16"
        in run.output
    )


def test_malformed_tolerance_file_names_file_rule_and_field(suite, tmp_path):
    bad = tmp_path / "tol.toml"
    bad.write_text('[[rule]]\noutput = "y"\nrtol = -1\natol = 0\nwhy = "x"\n')
    run = suite("--backend", "fake-numpy", "--tolerances", str(bad))
    assert run.returncode == 4
    assert f"{bad}: rule[0]: rtol=-1 is not allowed; allowed: a finite number >= 0" in run.output


def test_list_backends_shows_origin_availability_and_capabilities(suite):
    run = suite("--list-backends")
    assert run.returncode == 0, run.output[-2000:]
    text = run.output
    assert "torch-nn\n  origin: entry point backends.torch.modules:TorchNN from normconf" in text
    assert "fake-numpy\n  origin: register() in fakes.core.NumpyFake" in text
    assert "fake-unavailable" in text and "available: no (needs a device this machine does not have)" in text
    assert re.search(r"\ntorch-nn\n(?:  .*\n)*?  features: backward, [^\n]*momentum_none", text), text[:3000]


def test_unavailable_backend_under_all_is_skipped_with_reason(suite):
    run = suite(
        "--backend",
        "all",
        "--profile",
        "smoke",
        "--op",
        "rms_norm",
        "--dtype",
        "float32",
        "-k",
        "fake-unavailable or fake-numpy",
    )
    records = [r for r in run.records if r["backend"] == "fake-unavailable"]
    assert records and {r["outcome"] for r in records} == {"skipped"}
    assert "needs a device this machine does not have" in records[0]["reason"]


def _ledger(tmp_path, body):
    path = tmp_path / "ledger.toml"
    path.write_text(body)
    return str(path)


def test_ledger_entry_turns_a_known_failure_into_xfailed(suite, tmp_path):
    ledger = _ledger(
        tmp_path,
        '[[deviation]]\nbackend = "fake-bias-ignored"\ncheck = "forward"\noutput = "y"\n'
        'op = ["layer_norm", "batch_norm", "add_layer_norm"]\n'
        'band = [1.0, 1e15]\nnote = "no model yet"\nreason = "bias is not applied"\n',
    )
    run = suite(
        "--backend", "fake-bias-ignored", "--profile", "smoke", "-k", "test_forward", "--ledger", ledger
    )
    assert run.returncode == 0, run.output[-3000:]
    outcomes = {r["case"]["id"]: r["outcome"] for r in run.records}
    assert outcomes["layer_norm-float32-6x40-eps1e-05-normal"] == "xfailed"
    assert outcomes["rms_norm-float32-6x40-eps1e-05-normal"] == "passed"


def test_stale_ledger_entry_is_reported_as_xpassed_failure_in_strict_mode(suite, tmp_path):
    ledger = _ledger(
        tmp_path,
        '[[deviation]]\nbackend = "fake-numpy"\ncheck = "forward"\noutput = "y"\n'
        'case = "rms_norm-float32-*"\n'
        'band = [1.0, 10.0]\nnote = "no model yet"\nreason = "once wrong"\n',
    )
    plain = suite("--backend", "fake-numpy", "--profile", "smoke", "-k", "test_forward", "--ledger", ledger)
    assert plain.returncode == 0 and "xpassed" not in plain.outcomes()
    args = ("--backend", "fake-numpy", "--profile", "smoke", "-k", "test_forward", "--ledger", ledger)
    run = suite(*args, "--strict-ledger")
    assert run.returncode == 1
    stale = [r for r in run.records if r["outcome"] == "xpassed"]
    assert stale and all(r["case"]["id"].startswith("rms_norm-float32-") for r in stale)
    assert "expects output 'y' to fail (once wrong), but it passed" in stale[0]["reason"]


def test_deviation_beyond_its_band_fails(suite, tmp_path):
    ledger = _ledger(
        tmp_path,
        '[[deviation]]\nbackend = "fake-bias-ignored"\ncheck = "forward"\noutput = "y"\nop = "layer_norm"\n'
        'band = [1.0, 1.5]\nnote = "no model yet"\nreason = "bias is not applied"\n',
    )
    run = suite(
        "--backend",
        "fake-bias-ignored",
        "--profile",
        "smoke",
        "-k",
        "test_forward",
        "--ledger",
        ledger,
        "--op",
        "layer_norm",
    )
    assert run.returncode == 1
    failed = [r for r in run.records if r["outcome"] == "failed"]
    assert failed and "the deviation grew beyond its recorded band" in failed[0]["reason"]


def _report(when: str, properties: list[tuple[str, object]]) -> pytest.TestReport:
    return pytest.TestReport(
        "t.py::t", ("t.py", 0, "t"), {}, "passed", None, when, user_properties=properties
    )


def test_a_record_crosses_as_its_json_line_on_the_call_report_only():
    record = {"kind": "result", "outcome": "passed", "comparisons": [{"worst_ratio": 0.1 + 0.2}]}
    item = type("Item", (), {"user_properties": []})()
    plugin.attach(item, record)  # type: ignore[arg-type]
    assert item.user_properties == [(plugin.PROPERTY, line(record))]
    other = ("mine", "kept")
    for when, expected in (("call", [*item.user_properties, other]), ("teardown", [other])):
        hook = plugin.pytest_runtest_makereport(item, None)  # type: ignore[arg-type]
        next(hook)
        with pytest.raises(StopIteration) as done:
            hook.send(_report(when, [*item.user_properties, other]))
        assert done.value.value.user_properties == expected, when
    assert plugin.recorded(_report("call", item.user_properties)) == record  # floats bit for bit
    assert plugin.recorded(_report("call", [other])) is None


def test_an_expected_failure_ends_without_a_traceback_to_format():
    with pytest.raises(pytest.xfail.Exception) as raised:
        outcomes.enforce("xfailed", "known deviation")
    assert raised.value.msg == "known deviation" and raised.value.pytrace is False
