"""The benchmarks end to end: every benchmark runs once with timing disabled (so none can rot), a
short timed run writes pytest-benchmark JSON with normconf's extra_info, and the suite skips them."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conformance.bench import bytemodel
from conformance.model import sweep
from conformance.model.case import Case
from conformance.results import benchjson

from support.suite import ROOT, TESTS

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


def bench(
    *args: str, fakes: bool = True, timeout: float = 300, paths: Sequence[Path] = ()
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest conformance/bench <args>`` from the repository root, as a user runs it."""
    # An xdist worker's variables would make pytest-benchmark in the child believe it runs under xdist.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(TESTS), os.environ.get("PYTHONPATH", "")])
    env.pop("NORMCONF_ORT_SPINNING", None)  # the benchmarks' own default, whatever the caller has set
    plugins = ["-p", "fakes.bench"] if fakes else []
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
    # The torch backends run every row-op case; the image ops run where a backend declares them.
    rows = [case for case in sweep.cases("tiny") if case.op in sweep.OPS]
    assert counts.get("passed", 0) >= 1 + 3 * 2 * len(rows)
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("unsupported:" in line for line in skips), skips


@pytest.mark.heavy
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
        "--backend", "fake-numpy,torch-nn,onnxruntime",
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


def test_ort_sessions_are_timed_spinning_as_ort_configures_them(timed: dict[str, Any]) -> None:
    """A conformance run's ORT sessions wait blocked between runs (backends/common/ort_support.py); the
    benchmarks time them with ORT's own default, spinning, unless NORMCONF_ORT_SPINNING says otherwise."""
    from conformance.bench import conftest

    ort_support = pytest.importorskip("backends.common.ort_support")
    assert conftest.ORT_SPINNING == ort_support.SPINNING_VARIABLE
    records = [b["extra_info"] for b in timed["json"]["benchmarks"] if "case_id" in b["extra_info"]]
    ort = [r for r in records if r["backend"] == "onnxruntime"]
    assert {r["case_id"].split("-")[0] for r in ort} == {"layer_norm", "add_rms_norm"}
    assert all(r["info"]["intra_op_spinning"] is True for r in ort), [r["info"] for r in ort]


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


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One timed run over a CPU backend and the two fakes that answer device_timing()."""
    out = tmp_path_factory.mktemp("split") / "bench.json"
    done = bench(
        "--benchmark-only", "--bench-profile", "tiny", "--op", "rms_norm", "--dtype", "float32",
        "--backend", "fake-numpy,fake-device-timing,fake-device-timing-broken",
        "--bench-time", "0.002", "--bench-copy-mib", "1", "--bench-threads", "1",
        "--benchmark-json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [(b["stats"], b["extra_info"]) for b in json.loads(out.read_text())["benchmarks"]]
    return {
        name: [(stats, info) for stats, info in records if info.get("backend") == name]
        for name in ("fake-numpy", "fake-device-timing", "fake-device-timing-broken")
    }


def test_records_split_wall_time_into_device_and_host(split: dict[str, Any]) -> None:
    from fakes.bench import DEVICE

    assert split["fake-device-timing"]
    for stats, info in split["fake-device-timing"]:
        assert info["wall_ms"] == pytest.approx(stats["median"] * 1e3)
        assert info["device_ms"] == DEVICE["device_ms"] and info["device_method"] == "fake"
        assert info["host_ms"] == pytest.approx(info["wall_ms"] - DEVICE["device_ms"])
        assert (info["launches"], info["h2d_copies"], info["kernel_sum_ms"]) == (3.0, 0.0, 0.001)
        assert info["device_gbps"] == pytest.approx(info["bytes"] / 1e-6 / 1e9)
        assert info["device_roofline_fraction"] == pytest.approx(info["device_gbps"] / info["copy_gbps"])
        assert info["roofline_fraction"] == pytest.approx(info["gbps"] / info["copy_gbps"])  # wall's


def test_a_cpu_record_says_there_is_no_separate_device_time(split: dict[str, Any]) -> None:
    from conformance.bench.timing import NO_DEVICE

    assert split["fake-numpy"]
    for stats, info in split["fake-numpy"]:
        assert info["wall_ms"] == pytest.approx(stats["median"] * 1e3)
        assert info["device_method"] == NO_DEVICE
        fields = ("device_ms", "host_ms", "launches", "h2d_copies", "device_gbps", "device_roofline_fraction")
        assert all(info[k] is None for k in fields)


def test_a_failing_device_timing_is_recorded_beside_the_wall_time(split: dict[str, Any]) -> None:
    assert split["fake-device-timing-broken"]
    for _, info in split["fake-device-timing-broken"]:
        assert info["device_timing_error"] == "RuntimeError: capture failed: the fake's stream was busy"
        assert info["device_ms"] is None and info["wall_ms"] > 0 and info["gbps"] > 0


def test_the_split_arithmetic() -> None:
    from conformance.bench.timing import Roofline, split

    roof = Roofline("cuda", "torch", nbytes=1_000_000, threads=1, median_s=1e-3)  # 2 GB/s
    got = split(
        0.002, {"device_ms": 0.5, "launches": 2, "h2d_copies": 1, "device_method": "m"}, 1_000_000, roof.gbps
    )
    assert got["wall_ms"] == 2.0 and got["device_ms"] == 0.5 and got["host_ms"] == 1.5
    assert got["device_gbps"] == pytest.approx(2.0) and got["device_roofline_fraction"] == pytest.approx(1.0)
    assert (got["launches"], got["h2d_copies"], got["device_method"]) == (2, 1, "m")
    assert split(0.002, {"device_ms": 0.0}, 10, roof.gbps)["device_gbps"] is None
    assert split(None, None, 10, roof.gbps)["wall_ms"] is None


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
    # Shipped in the package: python -m reports.bench_tables from any folder.
    command = [
        sys.executable,
        "-m",
        "reports.bench_tables",
        str(timed["path"]),
        "--noise",
        str(timed["path"]),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for title in ("LayerNorm vs RMSNorm", "Fused vs composed", "Best and worst roofline", "Noise between"):
        assert title in done.stdout
    assert "| forward | torch-nn | composed | float32 |" in done.stdout


# A backend for GroupNorm and InstanceNorm only: the oracle, rounded to the case's dtypes. The
# benchmark path of the image ops runs on it whichever real backends declare those ops.
IMAGE_FAKE = """
    import conformance
    from conformance import oracle
    from conformance.adapter.backend import FEATURES, Capabilities
    from conformance.model.dtypes import numpy_dtype
    from conformance.model.outputs import output_dtype, produced


    class Prepared:
        def __init__(self, case, inputs, grad):
            self.case, self.inputs, self.grad, self.result = case, inputs, grad, {}

        def __call__(self):
            out = oracle.evaluate(self.case, self.inputs, grad=self.grad)
            names = produced(self.case, self.grad)
            self.result = {n: out[n].astype(numpy_dtype(output_dtype(self.case, n))) for n in names}

        def synchronize(self):
            pass

        def outputs(self):
            return self.result


    @conformance.register("fake-oracle-images")
    class OracleImages:
        name = "fake-oracle-images"

        def capabilities(self):
            ops, dtypes = {"group_norm", "instance_norm"}, {"float64", "float32", "float16", "bfloat16"}
            return Capabilities(frozenset(ops), frozenset(dtypes), frozenset(FEATURES), "cpu", "numpy")

        def prepare(self, case, inputs, *, grad):
            return Prepared(case, inputs, grad)
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("images")
    (folder / "normconf_image_fake.py").write_text(textwrap.dedent(IMAGE_FAKE))
    out = folder / "bench.json"
    done = bench(
        "--benchmark-only", "--bench-profile", "tiny", "--op", "group_norm,instance_norm",
        "--backend", "fake-oracle-images", "-p", "normconf_image_fake",
        "--bench-time", "0.002", "--benchmark-min-rounds", "2", "--bench-copy-mib", "1",
        "--bench-threads", "1", "--benchmark-json", str(out),
        fakes=False, paths=[folder],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"json": json.loads(out.read_text()), "path": out}


def test_image_op_records_carry_the_byte_model(images: dict[str, Any]) -> None:
    records = [b["extra_info"] for b in images["json"]["benchmarks"] if "case_id" in b["extra_info"]]
    tiny = [case for case in sweep.cases("tiny") if case.op in ("group_norm", "instance_norm")]
    assert sorted((r["case_id"], r["check"]) for r in records) == sorted(
        (case.id, check) for case in tiny for check in ("forward", "backward")
    )
    for record in records:
        case = Case.from_dict(record["case"])
        traffic = bytemodel.traffic(case, record["check"])
        assert (record["bytes"], record["weight_bytes"]) == (traffic.activations, traffic.weights)
        assert record["gbps"] > 0 and record["roofline_fraction"] > 0


def test_tables_script_has_an_image_section(images: dict[str, Any]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reports.bench_tables", str(images["path"]), "--noise", str(images["path"])],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("### GroupNorm and InstanceNorm per image shape", 1)[1].split("###", 1)[0]
    lines = [
        line for line in section.splitlines() if line.startswith("| forward") or line.startswith("| backward")
    ]
    assert len(lines) == 2 * 2 * 3  # two ops, two checks, three dtypes
    assert "| forward | fake-oracle-images | group_norm | 2x8x4x4 | 2 | float32 |" in section
    assert "| forward | fake-oracle-images | instance_norm | 2x8x4x4 | 8 | bfloat16 |" in section
    # Image shapes are their own noise group, not rows of an LN-sized table.
    noise = done.stdout.split("### Noise between the two runs", 1)[1]
    assert "| image | 12 |" in noise and "| mid |" not in noise
