"""Meta-test: a real Triton kernel whose padded lanes enter the variance is caught by the suite.

The fake (tests/normconf_triton_fakes.py) is exact when a row fills its power-of-two block, so the
suite must fail it on exactly the other row lengths, naming y and the tolerance rule, while the same
kernel with the lanes masked out passes every case.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")

ROWS = (1, 3, 8, 32, 40, 64, 100, 127, 256, 300)


def _cases(tmp_path):
    cases = [
        {"op": "layer_norm", "shape": [5, n], "dtype": dtype, "eps": 1e-5, "dist": dist}
        for n in ROWS
        for dtype in ("float32", "float16")
        for dist in ("normal", "offset")
    ]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(cases))
    return str(path)


def _row(record):
    return record["case"]["shape"][-1]


def _power_of_two(n):
    return n & (n - 1) == 0


@pytest.fixture
def triton_suite(suite, tmp_path):
    def run(backend):
        return suite("--backend", backend, "--cases", _cases(tmp_path), "-p", "normconf_triton_fakes")

    return run


def test_masked_lanes_in_the_variance_are_caught(triton_suite):
    run = triton_suite("fake-triton-masked-lanes")
    assert run.returncode == 1, run.output[-3000:]
    forward = [r for r in run.records if r["check"] == "forward"]
    failed = [r for r in forward if r["outcome"] == "failed"]
    # Every row length that leaves padding fails in float32; every full block passes everywhere.
    assert {_row(r) for r in failed if r["case"]["dtype"] == "float32"} == {
        n for n in ROWS if not _power_of_two(n)
    }
    assert all(r["outcome"] == "passed" for r in forward if _power_of_two(_row(r)))
    reason = failed[0]["reason"]
    assert "output 'y' out of tolerance" in reason
    assert "tolerances.toml rule[" in reason and "why:" in reason
    assert "reproduce: pytest conformance/suite/test_forward.py::test_forward[fake-triton-masked-lanes:" in (
        reason.replace("'", "")
    )


def test_the_same_kernel_with_lanes_masked_out_passes(triton_suite):
    run = triton_suite("fake-triton-rowwise")
    assert run.returncode == 0, run.output[-3000:]
    outcomes = run.outcomes()
    # The fake declares no backward: those checks are unsupported, never passed.
    assert set(outcomes) == {"passed", "unsupported"}
    assert outcomes["unsupported"] == len(ROWS) * 4
