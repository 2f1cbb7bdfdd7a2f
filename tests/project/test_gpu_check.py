"""scripts/gpu_check.sh's logic on the CPU: a stub nvidia-smi, the interpreter given as PYTHON (as the GPU
image's own virtual environment is), torch's CPU device; no install is attempted where normconf is
already importable from the checkout, and nothing is downloaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.suite import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _stub_nvidia_smi(folder: Path, fails: bool = False) -> None:
    stub = folder / "nvidia-smi"
    body = "exit 9\n" if fails else 'echo "name, driver_version, compute_cap"; echo "Stub GPU, 1.0, 9.0"\n'
    stub.write_text("#!/usr/bin/env bash\n" + body)
    stub.chmod(0o755)


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "WORKERS": "1",
        **env,
    }
    full.pop("OUT", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *args, str(tmp_path / "out")],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.heavy
def test_quick_check_runs_the_backends_with_the_interpreter_given(tmp_path):
    _stub_nvidia_smi(tmp_path)
    done = _run(tmp_path, "--quick", DEVICE="cpu", BACKENDS="torch-functional", TIMINGS="0", AOT="0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert "normconf is already importable from this checkout" in done.stdout
    assert "torch-functional, smoke profile" in done.stdout.replace("conformance: ", "")
    assert (out / "conformance.jsonl").is_file() and (out / "gpu.csv").read_text().startswith("name")
    assert "Stub GPU" in (out / "gpu_check.log").read_text()


@pytest.mark.heavy
def test_a_backend_off_the_expected_device_stops_the_check(tmp_path):
    _stub_nvidia_smi(tmp_path)
    done = _run(tmp_path, "--quick", BACKENDS="torch-functional", TIMINGS="0", AOT="0")
    assert done.returncode == 4
    assert "backend torch-functional is not running on cuda" in done.stdout


def test_no_gpu_is_said_and_nothing_runs(tmp_path):
    _stub_nvidia_smi(tmp_path, fails=True)
    done = _run(tmp_path, "--quick")
    assert done.returncode == 2 and "no NVIDIA GPU here" in done.stdout
    assert not (tmp_path / "out" / "conformance.jsonl").exists()
