"""What README and the Makefile claim about setting up: the CPU build of torch from PyTorch's CPU
wheel index, and `make conformance` installing only what it runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from support.suite import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _dry_run(target: str, tmp_path) -> list[str]:
    """The commands ``make TARGET`` would run in a fresh checkout (a venv that does not exist yet)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # Not as a sub-make of a surrounding make (make test in CI): no "Entering directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", f"VENV={tmp_path / 'venv'}", target],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def test_make_conformance_installs_only_what_it_runs(tmp_path):
    lines = _dry_run("conformance", tmp_path)
    installs = [line for line in lines if "pip install" in line and "--upgrade pip" not in line]
    assert len(installs) == 2, installs
    assert "torch==2.13.0" in installs[0] and f"--extra-index-url {CPU_INDEX}" in installs[0]
    assert installs[1].endswith('-e ".[all]" -c .ci/constraints.txt')
    assert not [line for line in lines if re.search(r"frameworks|lint|test\]", line)]
    assert lines[-1].split()[1:3] == ["run", "--profile"]


def test_make_test_adds_the_test_lint_and_framework_packages(tmp_path):
    installs = [line for line in _dry_run("test", tmp_path) if "pip install" in line]
    assert installs[-1].endswith('-e ".[all,frameworks,test,lint]" -c .ci/constraints.txt')


def test_the_environment_holds_the_projects_constraints():
    """Every requirement of .ci/constraints.txt holds in the environment running the tests (made by
    make setup or tox): a test run here is not slowed by what the file holds back."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    lines = (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
    requirements = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert requirements
    broken = [(str(r), version(r.name)) for r in requirements if version(r.name) not in r.specifier]
    assert not broken, broken


def test_every_torch_install_the_docs_give_takes_the_cpu_build():
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands = [
        (path.name, line)
        for path in texts
        for line in path.read_text().splitlines()
        if re.search(r"pip install[^\n]*torch==", line)
    ]
    assert commands
    # The one that names a plain install does so to warn against it.
    bad = [(name, line) for name, line in commands if CPU_INDEX not in line and "plain" not in line]
    assert not bad, bad


def test_make_recipes_write_bytecode_whatever_the_environment_says():
    # Each recipe's processes see no PYTHONDONTWRITEBYTECODE, even when the caller's environment has it.
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    probe = 'normconf-probe: ; @echo "[$$PYTHONDONTWRITEBYTECODE]"'
    done = subprocess.run(
        ["make", "--no-print-directory", "--eval", probe, "normconf-probe"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "[]"
