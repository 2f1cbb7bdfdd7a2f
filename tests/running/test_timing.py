"""Where a run spent its time: the phases a check records and normconf profile's sums of them."""

from __future__ import annotations

import json
import time

import pytest

from conformance.adapter.backend import Unsupported
from conformance.adapter.execute import Execution
from conformance.judging.ledger import Ledger
from conformance.judging.tolerances import read_tolerances
from conformance.model.case import Case
from conformance.running import timing
from conformance.running.checks import CheckContext, Phases, run_check

from fakes.core import NumpyFake


def _execution(prepare_s: float, call_s: float, info: dict[str, object]) -> Execution:
    return Execution((), {}, info=info, prepare_s=prepare_s, call_s=call_s)


def test_phases_split_compile_out_of_prepare_and_leave_judging_the_rest():
    phases = Phases()
    phases.ran(_execution(3.0, 0.5, {"compile_s": 2.5}))
    phases.ran(_execution(0.25, 0.25, {"compile_s": 0.0, "opset": 18}))
    phases.oracle_s += 1.0
    got = phases.to_dict(duration_s=6.0)
    assert got == {"prepare_s": 0.75, "compile_s": 2.5, "call_s": 0.75, "oracle_s": 1.0, "judge_s": 1.0}


def test_a_compile_time_above_prepare_time_is_capped_and_odd_values_are_ignored():
    phases = Phases()
    phases.ran(_execution(1.0, 0.0, {"compile_s": 4.0}))
    phases.ran(_execution(1.0, 0.0, {"compile_s": "fast"}))
    got = phases.to_dict(duration_s=1.5)
    assert (got["compile_s"], got["prepare_s"]) == (2.0, 0.0)  # capped at the prepare time
    assert got["judge_s"] == 0.0  # never negative


def _result(backend: str, duration: float, phases: dict[str, float] | None) -> dict[str, object]:
    extra = {"phases": phases} if phases is not None else {}
    return {"kind": "result", "backend": backend, "duration_s": duration, "extra": extra}


def test_profile_sums_phases_per_backend_and_counts_what_no_record_holds():
    phases = {"prepare_s": 1.0, "compile_s": 6.0, "call_s": 0.5, "oracle_s": 0.25, "judge_s": 0.25}
    records = [
        _result("slow", 8.0, phases),
        _result("slow", 0.001, None),  # unsupported: no phases
        _result("quick", 1.0, {**phases, "compile_s": 0.0, "prepare_s": 0.0}),
        {"kind": "fingerprint", "backend": "quick", "question": "q", "duration_s": 2.0},
        {"kind": "property", "backend": "slow", "property": "p", "duration_s": 3.0},
    ]
    header = {"kind": "header", "timing": {"wall_s": 10.0, "workers": 2, "write_s": 0.5}}
    found = timing.profile(header, records)
    assert [row.name for row in found.rows] == ["slow", "quick"]
    slow = found.rows[0]
    assert slow.records == 3
    assert slow.seconds["compile"] == 6.0 and slow.seconds["properties"] == 3.0
    assert slow.seconds["other"] == pytest.approx(0.001)
    assert found.total.total == pytest.approx(8.0 + 0.001 + 1.0 + 2.0 + 3.0)
    assert found.capacity_s == 20.0
    text = "\n".join(timing.lines(found))
    assert "20.0 worker-seconds" in text and "outside the records: 6.0 s (30%)" in text
    assert "0.50 s serializing" in text


def test_profile_of_a_file_without_timing_says_so():
    found = timing.profile({"kind": "header"}, [_result("a", 1.0, None)])
    assert found.capacity_s is None
    assert timing.lines(found)[-1].startswith("run: no wall time in the header")


def test_a_suite_run_records_phases_and_the_header_its_timing(suite, tmp_path):
    run = suite("--backend", "fake-numpy", "--op", "rms_norm", "--dtype", "float32")
    assert run.returncode == 0, run.output[-2000:]
    lines = [json.loads(line) for line in run.results.read_text().splitlines()]
    header, records = lines[0], lines[1:]
    assert header["timing"]["wall_s"] > 0 and header["timing"]["workers"] == 0
    checks = [r for r in records if r["kind"] == "result" and r["outcome"] == "passed"]
    assert checks and all(
        set(r["extra"]["phases"]) == {f"{p}_s" for p in timing.CHECK_PHASES} for r in checks
    )
    for record in checks:
        assert sum(record["extra"]["phases"].values()) == pytest.approx(record["duration_s"], abs=1e-5)


class _SlowRefusal(NumpyFake):
    """Spends a while in prepare() and then cannot express the case (an exporter refusing it)."""

    name = "fake-slow-refusal"

    def prepare(self, case, inputs, *, grad):
        time.sleep(0.2)
        raise Unsupported("the exporter cannot express this case")


def test_a_prepare_that_raised_counts_as_prepare_not_judging():
    backend = _SlowRefusal()
    ctx = CheckContext(read_tolerances(), Ledger("", "", ()), 30.0)
    case = Case("rms_norm", (4, 16), "float32", 1e-5)
    result = run_check("forward", backend, backend.capabilities(), case, ctx)
    assert result.outcome == "unsupported"
    phases = result.extra["phases"]
    assert phases["prepare_s"] >= 0.2 and phases["judge_s"] < 0.1
