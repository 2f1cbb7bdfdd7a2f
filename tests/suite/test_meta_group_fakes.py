"""Meta-tests for GroupNorm and InstanceNorm: every broken group fake is caught by ``pytest conformance``.

Each fake changes one thing in the correct NumPy GroupNorm/InstanceNorm (tests/fakes/group.py);
the suite must fail it in the check and output that the change reaches, with a tolerance message, and
the fingerprint must name the change; the correct fake passes everything, fingerprint and properties
included. The broken fakes share one suite run (ci profile, the two ops only) to keep this cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.fingerprint import QUESTIONS
from conformance.properties.catalog import PROPERTIES

from support.shared import once
from support.suite import SuiteRun, run_suite

ARGS = ("-p", "fakes.group", "--op", "group_norm,instance_norm", "--profile", "ci")

# fake -> (check, output) reported failing, and the fingerprint answers that differ from the reference
BROKEN: dict[str, tuple[tuple[str, str], dict[str, str]]] = {
    "fake-gn-per-channel-stats": (("forward", "y"), {"group_norm.groups": "per-channel"}),
    "fake-gn-per-group-affine": (("forward", "y"), {"group_norm.affine": "per-group"}),
    "fake-gn-one-pass-variance": (
        ("forward", "y"),
        # Its float32 E[x^2] - E[x]^2 on the float16 statistics probe is matched by the float32 family's
        # one-pass variant: the statistics answer is the reference's.
        {"group_norm.passes": "one-pass", "instance_norm.passes": "one-pass"},
    ),
    "fake-in-frozen-running-stats": (
        ("training", "running_mean"),
        {
            "instance_norm.momentum": "not-updated",
            "instance_norm.momentum_none": "as-0",
            "instance_norm.running_var": "unmatched",
        },
    ),
}


def _failing_outputs(record: dict[str, Any]) -> set[str]:
    return {c["output"] for c in record["comparisons"] if c["worst_ratio"] == "inf" or c["worst_ratio"] > 1}


def _failed(run: SuiteRun, fake: str) -> list[dict[str, Any]]:
    return [r for r in run.records if r["backend"] == fake and r["outcome"] == "failed"]


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    def make(folder: Path) -> Any:
        return run_suite(folder, "--backend", ",".join(BROKEN), *ARGS)

    return once(tmp_path_factory, "group-fakes-broken", make)


def test_correct_group_fake_passes_everything(suite: Any) -> None:
    run = suite("--backend", "fake-group-numpy", *ARGS)
    assert run.returncode == 0, run.output[-3000:]
    assert set(run.outcomes()) == {"passed"}
    assert {r["case"]["op"] for r in run.records} == {"group_norm", "instance_norm"}
    assert {"forward", "backward", "training"} <= {r["check"] for r in run.records}
    answers = {r["question"]: r for r in run.kind("fingerprint")}
    assert set(answers) == {n for n, q in QUESTIONS.items() if q.op in ("group_norm", "instance_norm")}
    for name, record in answers.items():
        expected = "1e-05" if QUESTIONS[name].default_eps else QUESTIONS[name].reference
        assert (record["answer"], record["matched"]) == (expected, True), (name, record["evidence"])
    properties = {r["property"]: r for r in run.kind("property")}
    assert set(properties) == {n for n, p in PROPERTIES.items() if p.grouped}
    for name, record in properties.items():
        assert record["outcome"] == "passed" and record["examples"] > 0, (name, record["reason"])


@pytest.mark.parametrize("fake", sorted(BROKEN))
def test_broken_group_fake_is_caught(broken: SuiteRun, fake: str) -> None:
    (check, output), _ = BROKEN[fake]
    assert broken.returncode == 1, broken.output[-3000:]
    caught = [r for r in _failed(broken, fake) if r["check"] == check and output in _failing_outputs(r)]
    assert caught, f"{fake}: no failed {check} record for {output}"
    reason = caught[0]["reason"]
    assert f"output '{output}' out of tolerance" in reason
    assert "tolerances.toml rule[" in reason and "why:" in reason
    assert f"-m pytest --pyargs conformance.suite.test_{check}::test_{check}[{fake}:" in reason.replace(
        "'", ""
    )


@pytest.mark.parametrize("fake", sorted(BROKEN))
def test_the_fingerprint_names_what_each_group_fake_changed(broken: SuiteRun, fake: str) -> None:
    _, differing = BROKEN[fake]
    answers = {r["question"]: r for r in broken.kind("fingerprint") if r["backend"] == fake}
    assert set(answers) == {n for n, q in QUESTIONS.items() if q.op in ("group_norm", "instance_norm")}
    for name, record in answers.items():
        reference = "1e-05" if QUESTIONS[name].default_eps else QUESTIONS[name].reference
        assert record["answer"] == differing.get(name, reference), (name, record["evidence"])


def _only_groups_of_several_channels(records: list[dict[str, Any]]) -> bool:
    return all(
        r["case"]["op"] == "group_norm" and r["case"]["num_groups"] < r["case"]["shape"][1] for r in records
    )


def test_group_mistakes_show_only_where_a_group_has_several_channels(broken: SuiteRun) -> None:
    """Per-channel statistics and per-group parameters are right when every group is one channel:
    InstanceNorm and num_groups = C pass. Every other GroupNorm forward on normal values with a weight
    fails (constant, zero and tiny groups normalize to the bias either way; without a weight and bias
    per-group parameters are no parameters)."""
    for fake in ("fake-gn-per-channel-stats", "fake-gn-per-group-affine"):
        failed = _failed(broken, fake)
        assert failed and _only_groups_of_several_channels(failed), fake
        forward = [r for r in broken.records if r["backend"] == fake and r["check"] == "forward"]
        telling = [
            r
            for r in forward
            if _only_groups_of_several_channels([r]) and r["case"]["dist"] == "normal" and r["case"]["weight"]
        ]
        assert telling and all(r["outcome"] == "failed" for r in telling), fake


def test_one_pass_variance_is_caught_on_offset_groups(broken: SuiteRun) -> None:
    forward = [r for r in _failed(broken, "fake-gn-one-pass-variance") if r["check"] == "forward"]
    assert forward and {r["case"]["dist"] for r in forward} == {"offset"}
    assert {r["case"]["op"] for r in forward} == {"group_norm", "instance_norm"}


def test_frozen_running_stats_fail_only_the_training_update(broken: SuiteRun) -> None:
    failed = _failed(broken, "fake-in-frozen-running-stats")
    assert failed and {r["check"] for r in failed} == {"training"}
    assert all(r["case"]["op"] == "instance_norm" and r["case"]["training"] for r in failed)
    trained = [
        r
        for r in broken.records
        if r["backend"] == "fake-in-frozen-running-stats" and r["check"] == "training"
    ]
    # Every training step moves the running statistics (momentum 0.1, 0.5 or None = factor 1).
    assert trained and all(r["outcome"] == "failed" for r in trained)
