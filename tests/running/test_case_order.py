"""The suite's backend x case tests run case-major: a case's checks follow each other (its oracle is
computed once), whichever check module pytest collected first."""

from __future__ import annotations

from itertools import groupby

from conformance.model import profiles


def test_a_backends_checks_of_one_case_run_together(suite, tmp_path):
    log = tmp_path / "prepares.log"
    run = suite("--backend", "fake-prepare-log", env={"NORMCONF_FAKE_PREPARE_LOG": str(log)})
    assert run.returncode == 0, run.output[-3000:]
    profile = [case.id for case in profiles.cases("smoke")]
    # The checks' prepares (fingerprint probes and property examples prepare cases of their own).
    order = [c for c in (line.split()[1] for line in log.read_text().splitlines()) if c in set(profile)]
    runs = [case_id for case_id, _ in groupby(order)]
    # One contiguous run of prepares per case (forward, backward, the bitwise checks, ...), in the
    # profile's order; check-major, every case would come back once per check.
    assert runs == [case_id for case_id in profile if case_id in set(order)]
    assert len(order) > len(runs)  # several checks prepared each case
