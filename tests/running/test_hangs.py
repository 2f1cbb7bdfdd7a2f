"""One hang costs one call timeout: the other tests of the hung case, and once a backend has hung on
--max-timeouts cases all its remaining tests, are errors without another call, saying why."""

from __future__ import annotations

import pytest


def _hung(records: list[dict]) -> list[dict]:
    """Records of calls that actually waited out the call timeout."""
    return [r for r in records if "hung" in r.get("extra", {})]


@pytest.mark.heavy
def test_a_backend_that_hangs_on_one_case_costs_one_timeout(suite):
    run = suite("--backend", "fake-hangs", "--profile", "smoke", "--call-timeout", "2")
    assert run.returncode == 1, run.output[-3000:]
    errors = [r for r in run.records if r["outcome"] == "error"]
    (waited,) = _hung(run.records)  # a single call waited for the timeout
    assert "did not finish within 2 s" in waited["reason"] and waited["extra"]["hung"]
    hung_case = waited["case"]["id"]
    others = [r for r in errors if r["check"] != waited["check"]]
    assert others and all(r["case"]["id"] == hung_case for r in others)
    expected = f"not run: fake-hangs hung on this case in check {waited['check']} (--call-timeout 2 s)"
    assert all(r["reason"].startswith(expected) for r in others)
    assert sum(r["duration_s"] for r in others) < 1.0  # no other call waited
    assert run.outcomes()["passed"] == len(run.records) - len(errors)


def test_after_max_timeouts_a_backends_remaining_tests_error_at_once(suite):
    args = ("--profile", "smoke", "--op", "rms_norm", "--dtype", "float32", "--call-timeout", "1")
    run = suite("-p", "fakes.broken", "--backend", "fake-hangs-always", *args, "--max-timeouts", "2")
    assert run.returncode == 1, run.output[-3000:]
    assert len(_hung(run.records)) == 2
    assert len({r["case"]["id"] for r in _hung(run.records)}) == 2  # two cases, one timeout each
    rest = [r for r in run.records if "hung" not in r.get("extra", {})]
    assert rest and {r["outcome"] for r in rest} == {"error"}
    assert any("hung on 2 cases in this process (--max-timeouts 2)" in r["reason"] for r in rest)
    for kind in ("fingerprint", "property"):
        found = [r for r in run.kind(kind) if r["outcome"] != "skipped"]
        assert found and all("--max-timeouts 2" in r["reason"] for r in found), kind


def test_max_timeouts_must_be_at_least_one(suite):
    run = suite("--backend", "fake-numpy", "--max-timeouts", "0")
    assert run.returncode == 4
    assert "--max-timeouts=0 is not allowed; allowed: a whole number >= 1" in run.output
