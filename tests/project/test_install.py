"""Installed like a library: the sdist and the wheel built from it, installed into a fresh venv (no
editable install, no checkout on the path) with an out-of-tree adapter package, run from an empty
folder through both documented commands."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from support.guide import guide_files
from support.suite import ROOT

# What a source tree holds that is not the project (caches, environments, build output).
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".tox", ".normconf", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
)


def _run(command: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # A clean environment: nothing from this checkout or its venv on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _built(tmp_path: Path) -> tuple[Path, Path]:
    """(sdist, wheel); the wheel is built from the sdist, so the sdist must be complete."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)], tmp_path)
    (sdist,) = dist.glob("normconf-*.tar.gz")
    (wheel,) = dist.glob("normconf-*.whl")
    return sdist, wheel


@pytest.mark.heavy
def test_wheel_in_a_fresh_venv_runs_both_commands_from_an_empty_folder(tmp_path):
    sdist, wheel = _built(tmp_path)
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(n.endswith("conformance/judging/tolerances.toml") for n in names)
    assert any(n.endswith("reports/templates/report.html.j2") for n in names)
    # `python -m backends.triton.kernels.aot` (README) runs from the installed package.
    with zipfile.ZipFile(wheel) as archive:
        assert "backends/triton/kernels/aot/__main__.py" in archive.namelist()

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], tmp_path)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for name, text in guide_files().items():
        (adapter / name).write_text(text)
    # The adapter package is built as its own project would build it, and installed beside normconf.
    built = tmp_path / "adapter-dist"
    _run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(built), str(adapter)],
        tmp_path,
    )
    (adapter_wheel,) = built.glob("*.whl")
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(adapter_wheel)], tmp_path)

    empty = tmp_path / "project"
    empty.mkdir()
    # No backend library is installed: the built-in backends are unavailable, with the install command.
    listing = _run([str(venv / "bin" / "normconf"), "backends", "-v"], empty).stdout
    assert "torch-nn\n" in listing and "example-rmsnorm\n" in listing
    assert "available: no (needs torch, which is not installed (pip install 'normconf[torch]'))" in listing
    assert "broken" not in listing
    short = _run([str(venv / "bin" / "normconf"), "backends"], empty).stdout.splitlines()
    assert any(line.split()[:2] == ["example-rmsnorm", "available"] for line in short)
    assert any(line.split()[:2] == ["torch-nn", "unavailable"] for line in short)
    done = _run(
        [
            str(venv / "bin" / "normconf"),
            "run",
            "--backend",
            "example-rmsnorm",
            "--profile",
            "smoke",
            "-o",
            "out",
        ],
        empty,
    )
    assert "example-rmsnorm" in done.stdout and (empty / "out" / "report.html").is_file()
    records = [json.loads(line) for line in (empty / "out" / "results.jsonl").read_text().splitlines()[1:]]
    results = [r for r in records if r["kind"] == "result"]
    assert results and not [r for r in results if r["outcome"] in ("failed", "error")]
    # The example adapter implements RMSNorm only, without some of its features: the rest is unsupported.
    rms = {r["outcome"] for r in results if r["case"]["op"] == "rms_norm"}
    assert "passed" in rms and rms <= {"passed", "unsupported"}
    # Every property and fingerprint ran (hypothesis is installed with normconf), none failed.
    assert {r["outcome"] for r in records if r["kind"] == "property"} <= {"passed", "unsupported"}
    assert all(r["outcome"] != "error" for r in records if r["kind"] == "fingerprint")

    done = _run(
        [str(venv / "bin" / "pytest"), "--pyargs", "conformance", "--backend", "example-rmsnorm", "-q"], empty
    )
    last = done.stdout.strip().splitlines()[-1]
    assert " passed" in last and "failed" not in last and "error" not in last, last
    assert (empty / ".normconf" / "results.jsonl").is_file()


# A user's own broken variant of the guide's adapter, in their project folder: y off by 1 %.
BROKEN = """
import conformance
from example_rmsnorm import ExampleRMSNorm, _Prepared


class _Scaled(_Prepared):
    def __call__(self):
        super().__call__()
        self.result["y"] = (self.result["y"] * 1.01).astype(self.result["y"].dtype)


@conformance.register("broken-rmsnorm")
class BrokenRMSNorm(ExampleRMSNorm):
    name = "broken-rmsnorm"

    def prepare(self, case, inputs, *, grad):
        return _Scaled(case, inputs, grad)
"""


@pytest.mark.heavy
def test_a_printed_reproduce_command_runs_from_the_users_folder(tmp_path):
    """The reproduce command of a failure, run as printed from the user's folder against the installed
    wheel: the one test fails again, into a scratch results file; the run's own results stay."""
    _, wheel = _built(tmp_path)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)], tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    (project / "example_rmsnorm.py").write_text(guide_files()["example_rmsnorm.py"])
    (project / "broken_rmsnorm.py").write_text(BROKEN)
    run = [str(venv / "bin" / "normconf"), "run", "--backend", "broken-rmsnorm", "-p", "broken_rmsnorm"]
    run += ["--op", "rms_norm", "--dtype", "float32", "-n", "0", "-o", "out"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(run, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    results = (project / "out" / "results.jsonl").read_text()
    records = [json.loads(line) for line in results.splitlines()[1:]]
    failed = [r for r in records if r["kind"] == "result" and r["outcome"] == "failed"]
    assert failed and all("-p broken_rmsnorm" in r["reproduce"] for r in failed)
    command = failed[0]["reproduce"]
    words = shlex.split(command)
    # The interpreter normconf ran under (the venv's), its pytest by the test's package path.
    assert words[0] == str(venv / "bin" / "python") and words[1:4] == ["-m", "pytest", "--pyargs"]
    assert words[4].startswith("conformance.suite.") and "conformance.cli" not in command
    # As the user would paste it into their shell, with the venv's pytest first on PATH.
    shell_env = {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}
    again = subprocess.run(
        ["bash", "-c", command], cwd=project, env=shell_env, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 1 and "1 failed" in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
    scratch = (project / ".normconf" / "reproduce" / "results.jsonl").read_text().splitlines()[1:]
    assert [json.loads(line)["outcome"] for line in scratch if '"result"' in line] == ["failed"]
    assert (project / "out" / "results.jsonl").read_text() == results
