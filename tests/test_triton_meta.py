"""Meta-test: a real Triton kernel whose padded lanes enter the variance is caught by the suite.

The fake (tests/normconf_triton_fakes.py) is exact when a row fills its power-of-two block, so the
suite must fail it on exactly the other row lengths, naming y and the tolerance rule, while the same
kernel with the lanes masked out passes every case.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_suite

pytest.importorskip("triton")

ROWS = (1, 3, 8, 32, 40, 64, 100, 127, 256, 300)
BROKEN, CONTROL = "fake-triton-masked-lanes", "fake-triton-rowwise"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("triton-meta")
    cases = [
        {"op": "layer_norm", "shape": [5, n], "dtype": dtype, "eps": 1e-5, "dist": dist}
        for n in ROWS
        for dtype in ("float32", "float16")
        for dist in ("normal", "offset")
    ]
    (folder / "rows.json").write_text(json.dumps(cases))
    # One run for both fakes: the interpreter's start-up is paid once.
    args = ("--backend", f"{BROKEN},{CONTROL}", "--cases", str(folder / "rows.json"))
    return run_suite(folder, *args, "-p", "normconf_triton_fakes")


def _row(record):
    return record["case"]["shape"][-1]


def _power_of_two(n):
    return n & (n - 1) == 0


def test_masked_lanes_in_the_variance_are_caught(run):
    assert run.returncode == 1, run.output[-3000:]
    forward = [r for r in run.records if r["backend"] == BROKEN and r["check"] == "forward"]
    failed = [r for r in forward if r["outcome"] == "failed"]
    # Every row length that leaves padding fails in float32; every full block passes everywhere.
    assert {_row(r) for r in failed if r["case"]["dtype"] == "float32"} == {
        n for n in ROWS if not _power_of_two(n)
    }
    assert all(r["outcome"] == "passed" for r in forward if _power_of_two(_row(r)))
    reason = failed[0]["reason"]
    assert "output 'y' out of tolerance" in reason
    assert "tolerances.toml rule[" in reason and "why:" in reason
    assert f"reproduce: pytest conformance/suite/test_forward.py::test_forward[{BROKEN}:" in (
        reason.replace("'", "")
    )


def test_the_same_kernel_with_lanes_masked_out_passes(run):
    records = [r for r in run.records if r["backend"] == CONTROL]
    outcomes = {r["outcome"] for r in records}
    # The fake declares no backward: those checks are unsupported, never passed.
    assert outcomes == {"passed", "unsupported"}
    assert sum(r["outcome"] == "unsupported" for r in records) == len(ROWS) * 4
