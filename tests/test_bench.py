"""The benchmarks end to end: every benchmark runs once with timing disabled (so none can rot), a
short timed run writes pytest-benchmark JSON with normconf's extra_info, and the suite skips them."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conformance.bench import sweep
from conformance.results import benchjson

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
KEYS = {
    "case_id",
    "backend",
    "check",
    "bytes",
    "weight_bytes",
    "gbps",
    "roofline_fraction",
    "copy_gbps",
    "threads",
    "device",
}
FAST = "fake-numpy,torch-eager,torch-nn,torch-functional"

pytest.importorskip("pytest_benchmark")


def bench(*args: str, fakes: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m pytest conformance/bench <args>`` from the repository root, as a user runs it."""
    # An xdist worker's variables would make pytest-benchmark in the child believe it runs under xdist.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    plugins = ["-p", "normconf_bench_fakes"] if fakes else []
    command = [sys.executable, "-m", "pytest", "conformance/bench", "-p", "no:cacheprovider", *plugins]
    return subprocess.run(
        [*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _counts(output: str) -> dict[str, int]:
    """Outcome counts from pytest's final line, e.g. '67 passed, 6 skipped in 13.75s'."""
    last = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", last)}


def test_every_benchmark_runs_once_with_timing_disabled() -> None:
    done = bench("--benchmark-disable", "--bench-profile", "tiny", "--backend", FAST, "-rs")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counts = _counts(done.stdout)
    # The copy, then forward and backward of every case on every backend; skips only for what a
    # backend does not declare.
    assert counts.get("passed", 0) + counts.get("skipped", 0) == 1 + 4 * 2 * len(sweep.cases("tiny"))
    assert counts.get("passed", 0) >= 1 + 3 * 2 * len(sweep.cases("tiny"))  # the torch backends run all
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("unsupported:" in line for line in skips), skips


def test_every_backend_runs_once_with_timing_disabled() -> None:
    # torch-compile and the exporters are slow to prepare: one case each, every registered backend.
    done = bench(
        "--benchmark-disable", "--bench-profile", "tiny", "--op", "rms_norm", "--dtype", "float32", "-v",
        fakes=False,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for check in ("forward", "backward"):
        assert (
            f"test_bench_{check}[torch-compile:rms_norm-float32-4x64-eps1e-05-normal] PASSED" in done.stdout
        )


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    done = bench(
        "--benchmark-only",
        "--bench-profile", "tiny",
        "--backend", "fake-numpy,torch-nn",
        "--op", "layer_norm,add_rms_norm",
        "--dtype", "float32",
        "--bench-time", "0.003",
        "--benchmark-min-rounds", "2",
        "--bench-copy-mib", "4",
        "--bench-threads", "1",
        "--benchmark-json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"json": json.loads(out.read_text()), "path": out}


def test_every_record_carries_bytes_gbps_and_roofline_fraction(timed: dict[str, Any]) -> None:
    records = [b["extra_info"] for b in timed["json"]["benchmarks"] if "case_id" in b["extra_info"]]
    assert {(r["backend"], r["case_id"].split("-")[0], r["check"]) for r in records} >= {
        ("torch-nn", op, check) for op in ("layer_norm", "add_rms_norm") for check in ("forward", "backward")
    }
    for record in records:
        assert set(record) >= KEYS
        assert record["gbps"] > 0 and record["copy_gbps"] > 0 and record["bytes"] > 0
        assert record["roofline_fraction"] == pytest.approx(record["gbps"] / record["copy_gbps"])
        assert record["threads"] == 1 and record["device"] == "cpu"
    torch_nn = [r for r in records if r["backend"] == "torch-nn"]
    assert all(r["info"]["threads"] == 1 for r in torch_nn)  # the fixed count reached torch


def test_copy_benchmark_and_machine_info_record_the_roofline(timed: dict[str, Any]) -> None:
    data = timed["json"]
    copies = [b for b in data["benchmarks"] if "case_id" not in b["extra_info"]]
    assert len(copies) == 1 and copies[0]["extra_info"]["device"] == "cpu"
    assert copies[0]["extra_info"]["source"] == "torch-nn"  # the first selected backend with a copy
    normconf = data["machine_info"]["normconf"]
    assert normconf["threads"] == 1 and normconf["rooflines"]["cpu"]["gbps"] > 0
    assert normconf["allocator"].startswith("pinned (glibc mallopt") or platform.libc_ver()[0] != "glibc"


def test_report_reader_joins_the_json(timed: dict[str, Any]) -> None:
    read = benchjson.read(timed["path"])
    timed_cases = [b for b in timed["json"]["benchmarks"] if "case_id" in b["extra_info"]]
    assert len(read.benchmarks) == len(timed_cases) >= 4 and len(read.auxiliary) == 1
    assert all(b.roofline_fraction is not None for b in read.benchmarks)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One timed run over the bench fakes: own copy kernel, interpreted, wrong thread count."""
    out = tmp_path_factory.mktemp("fakes") / "bench.json"
    done = bench(
        "--benchmark-only", "--bench-profile", "tiny", "--op", "rms_norm", "--dtype", "float32", "-rs",
        "--backend", "fake-own-copy,fake-interpreted,fake-wrong-threads",
        "--bench-time", "0.002", "--bench-copy-mib", "1", "--bench-threads", "2",
        "--benchmark-json", str(out),
    )  # fmt: skip
    return {"done": done, "json": json.loads(out.read_text())}


def test_a_backend_copy_kernel_is_the_roofline(fakes: dict[str, Any]) -> None:
    copy = next(b for b in fakes["json"]["benchmarks"] if "case_id" not in b["extra_info"])
    assert copy["extra_info"]["source"] == "fake-own-copy"


def test_a_backend_on_other_threads_fails(fakes: dict[str, Any]) -> None:
    assert fakes["done"].returncode == 1
    assert "ran with threads=999; the session fixed 2" in fakes["done"].stdout


def test_interpreted_backends_are_not_timed_unless_asked(fakes: dict[str, Any], tmp_path: Path) -> None:
    assert "--bench-interpreted times it anyway" in fakes["done"].stdout
    backends = {b["extra_info"].get("backend") for b in fakes["json"]["benchmarks"]}
    assert "fake-interpreted" not in backends
    out = tmp_path / "b.json"
    timed_run = bench(
        "--benchmark-only", "--bench-profile", "tiny", "--op", "rms_norm", "--dtype", "float32",
        "--backend", "fake-interpreted", "--bench-interpreted", "--bench-time", "0.002",
        "--bench-copy-mib", "1", "--benchmark-json", str(out),
    )  # fmt: skip
    assert timed_run.returncode == 0, timed_run.stdout[-2000:]
    records = [
        b["extra_info"] for b in json.loads(out.read_text())["benchmarks"] if "case_id" in b["extra_info"]
    ]
    assert records and all(r["interpreted"] is True for r in records)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bench-profile", "huge"], "--bench-profile='huge' is not allowed"),
        (["--bench-threads", "0"], "--bench-threads=0 is not allowed"),
        (["--bench-time", "0"], "--bench-time=0.0 is not allowed"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    done = bench("--benchmark-disable", "--bench-profile", "tiny", "--backend", "fake-numpy", *args)
    assert done.returncode == 4 and message in done.stderr


def test_the_conformance_suite_does_not_collect_the_benchmarks() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "conformance",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and "test_forward[" in done.stdout
    assert "conformance/bench" not in done.stdout


def test_tables_script_reads_the_json(timed: dict[str, Any]) -> None:
    script = ROOT / "scripts" / "bench_tables.py"
    command = [sys.executable, str(script), str(timed["path"]), "--noise", str(timed["path"])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for title in ("LayerNorm vs RMSNorm", "Fused vs composed", "Best and worst roofline", "Noise between"):
        assert title in done.stdout
    assert "| forward | torch-nn | composed | float32 |" in done.stdout
