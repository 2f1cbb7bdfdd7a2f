"""Meta-tests: every deliberately broken fake backend is caught by ``pytest conformance``.

Each fake changes one thing in an otherwise correct NumPy implementation (tests/fakes/core.py);
the suite must fail it with a message naming the output and the tolerance rule, while the correct
fake passes everything. One smoke run of every broken and misbehaving fake serves their tests (each
backend's records are its own: the suite judges and isolates backends one by one); the fakes that need
a run of their own (another call timeout, xdist workers) get one.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.shared import once
from support.suite import SuiteRun, run_suite

# fake -> (check, output) that must be reported failing with a tolerance message
BROKEN = {
    "fake-eps-outside-sqrt": ("forward", "y"),
    "fake-unbiased-variance": ("forward", "y"),
    "fake-one-pass-variance": ("forward", "y"),
    "fake-low-precision-stats": ("forward", "y"),
    "fake-ln-dx-no-mean-terms": ("backward", "dx"),
    "fake-bn-biased-running-var": ("training", "running_var"),
    "fake-bias-ignored": ("forward", "y"),
    "fake-wrong-axes": ("forward", "y"),
}


# fake -> what its first error record (forward: checks run case-major) says; each misbehaves on one case
MISBEHAVING = {
    "fake-raises": "__call__() raised RuntimeError: kernel launch failed",
    "fake-missing-output": "outputs() is missing ['y']",
    "fake-wrong-shape": "output 'y' has shape (240,), expected (6, 40)",
    "fake-not-array": "output 'y' is list, expected a NumPy array",
    "fake-unsupported-late": "Unsupported raised from __call__(); it is honoured only from prepare()",
    "fake-hangs": "did not finish within 2 s",
}
SHARED = (*sorted(BROKEN), *MISBEHAVING, "fake-mutates-inputs", "fake-nondeterministic")


def _shared_run(folder: Path) -> SuiteRun:
    """The one smoke run of every fake in SHARED (a call timeout of 2 s, for fake-hangs)."""
    return run_suite(folder, "--backend", ",".join(SHARED), "--profile", "smoke", "--call-timeout", "2")


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The shared run's check records by backend (read once: the file holds ~10,000)."""
    run = once(tmp_path_factory, "core-fakes", _shared_run)
    # Every fake in it is broken somewhere: a run that passed would have judged none of them.
    assert run.returncode == 1, run.output[-3000:]
    records: dict[str, list[dict[str, Any]]] = {}
    for record in run.records:
        records.setdefault(record["backend"], []).append(record)
    assert set(records) == set(SHARED), run.output[-3000:]
    return records


def _of(fakes: dict[str, list[dict[str, Any]]], fake: str, outcome: str) -> list[dict[str, Any]]:
    return [r for r in fakes[fake] if r["outcome"] == outcome]


def _failing_outputs(record):
    return {c["output"] for c in record["comparisons"] if c["worst_ratio"] == "inf" or c["worst_ratio"] > 1}


@pytest.mark.heavy
def test_correct_float32_fake_passes_everything(suite):
    run = suite("--backend", "fake-numpy", "--profile", "ci", "-n", "2")
    assert run.returncode == 0, run.output[-3000:]
    assert set(run.outcomes()) == {"passed"}
    assert len(run.records) > 1000


@pytest.mark.parametrize("fake", sorted(BROKEN))
def test_broken_fake_is_caught(fakes, fake):
    check, output = BROKEN[fake]
    caught = [r for r in _of(fakes, fake, "failed") if r["check"] == check and output in _failing_outputs(r)]
    assert caught, f"{fake}: no failed {check} record for {output}"
    reason = caught[0]["reason"]
    assert f"output '{output}' out of tolerance" in reason
    assert "tolerances.toml rule[" in reason and "why:" in reason
    assert f"-m pytest --pyargs conformance.suite.test_{check}::test_{check}[{fake}:" in reason.replace(
        "'", ""
    )


def test_reproduce_command_reruns_exactly_that_case(suite, tmp_path):
    run = suite("--backend", "fake-bias-ignored", "--profile", "smoke", "--call-timeout", "77")
    failed = next(r for r in run.records if r["outcome"] == "failed")
    command = shlex.split(failed["reproduce"])
    assert command[:4] == [sys.executable, "-m", "pytest", "--pyargs"]
    # The run's own settings travel with it: here its call timeout.
    assert command[command.index("--call-timeout") + 1] == "77"
    # From another folder: the test by its package path, its result into the scratch file there.
    rerun = subprocess.run(
        [sys.executable, *command[1:], "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert rerun.returncode == 1, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "1 failed" in rerun.stdout
    scratch = (tmp_path / ".normconf" / "reproduce" / "results.jsonl").read_text().splitlines()
    assert len(scratch) == 2 and '"failed"' in scratch[1]


def run_env():
    import os

    from support.suite import TESTS

    return {**os.environ, "PYTHONPATH": str(TESTS)}


def test_inputs_mutated_in_place_is_caught(fakes):
    failed = _of(fakes, "fake-mutates-inputs", "failed")
    # The second call sees the mutated x, so determinism fails too; single calls are still correct. The
    # aliasing check sees the undeclared write as well.
    assert {r["check"] for r in failed} == {"inputs_unchanged", "aliasing", "determinism"}
    aliasing = next(r for r in failed if r["check"] == "aliasing")
    assert "input 'x' was written by the call" in aliasing["reason"]
    unchanged = next(r for r in failed if r["check"] == "inputs_unchanged")
    assert "x: " in unchanged["reason"] and "changed by 2 calls" in unchanged["reason"]


def test_nondeterministic_output_is_caught(fakes):
    failed = _of(fakes, "fake-nondeterministic", "failed")
    assert {r["check"] for r in failed} == {"determinism"}
    assert "y: 1 of" in failed[0]["reason"] and "between two calls" in failed[0]["reason"]


@pytest.mark.parametrize("fake", list(MISBEHAVING))
def test_misbehaving_adapter_is_that_cases_error(fakes, fake):
    message = MISBEHAVING[fake]
    errors = _of(fakes, fake, "error")
    assert errors and all(r["case"]["id"] == "layer_norm-float32-6x40-eps1e-05-normal" for r in errors)
    # The first check that ran the case (case-major: forward) says what went wrong; after a hang the
    # case's other checks are errors without another call.
    first = next(r for r in errors if r["check"] == "forward")
    assert message in first["reason"]
    # Every other case still ran and passed: one bad case does not take the run down.
    assert len(_of(fakes, fake, "passed")) == len(fakes[fake]) - len(errors) > 0


@pytest.mark.heavy
def test_native_crash_in_a_worker_is_reported_and_the_run_goes_on(suite):
    run = suite("--backend", "fake-crashes", "--profile", "smoke", "-n", "2")
    assert run.returncode == 1
    errors = [r for r in run.records if r["outcome"] == "error"]
    assert errors and all(r["case"]["id"] == "layer_norm-float32-6x40-eps1e-05-normal" for r in errors)
    assert "crashed" in errors[0]["reason"]
    assert run.outcomes()["passed"] == len(run.records) - len(errors)
