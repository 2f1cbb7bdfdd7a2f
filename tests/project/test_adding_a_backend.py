"""docs/adding-a-backend.md works as written: its package builds, installs and runs under the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.guide import guide_files


@pytest.mark.heavy
def test_guide_package_installs_and_runs_by_name(tmp_path, suite):
    files = guide_files()
    assert set(files) == {"pyproject.toml", "example_rmsnorm.py"}
    package = tmp_path / "normconf-example-rmsnorm"
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(text)
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(package),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {"PYTHONPATH": str(site)}
    listing = suite("--list-backends", env=env)
    assert (
        "example-rmsnorm\n  origin: entry point example_rmsnorm:ExampleRMSNorm"
        " from normconf-example-rmsnorm 0.1.0" in listing.output
    )
    run = suite("--backend", "example-rmsnorm", "--profile", "smoke", env=env)
    assert run.returncode == 0, run.output[-3000:]
    by_op = {}
    for record in run.records:
        by_op.setdefault(record["case"]["op"], set()).add(record["outcome"])
    assert by_op["layer_norm"] == {"unsupported"} and by_op["batch_norm"] == {"unsupported"}
    assert "passed" in by_op["rms_norm"]
    passed = [r for r in run.records if r["outcome"] == "passed"]
    assert {r["check"] for r in passed} >= {"forward", "backward", "inputs_unchanged", "determinism"}
