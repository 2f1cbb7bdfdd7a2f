"""Meta-tests for the fused residual ops and the aliasing contract: every broken fake is caught.

Each fake in tests/fakes/residual.py changes one thing in the correct NumPy fake: the sum the
norm reads, the dtype residual_out is stored in, the residual_out cotangent, or what shares memory with
what. The suite must fail it in the check (and output, or aliasing message) the change reaches, and the
fingerprint must name the residual conventions; the declared in-place fake passes everything. One smoke
run of the two add ops serves all of them.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.fingerprint import QUESTIONS

from support.suite import SuiteRun, run_suite

ARGS = ("-p", "fakes.residual", "--op", "add_rms_norm,add_layer_norm", "--profile", "smoke")
ADD_QUESTIONS = {name for name, q in QUESTIONS.items() if q.op in ("add_rms_norm", "add_layer_norm")}

# fake -> (check, output or a phrase of the aliasing message), fingerprint answers that differ
BROKEN: dict[str, tuple[tuple[str, str], dict[str, str]]] = {
    "fake-add-exact-sum": (
        ("forward", "y"),
        {
            f"{op}.sum{suffix}": "exact"
            for op in ("add_layer_norm", "add_rms_norm")
            for suffix in ("", ".float16")
        },
    ),
    "fake-add-float32-stream": (
        ("forward", "residual_out"),
        {"add_layer_norm.stream": "float32", "add_rms_norm.stream": "float32"},
    ),
    "fake-add-no-residual-grad": (("backward", "dresidual"), {}),
    "fake-add-inplace-undeclared": (
        ("aliasing", "output 'residual_out' shares memory with input 'residual'"),
        {},
    ),
    "fake-add-inplace-stale": (
        ("aliasing", "input 'residual' is declared as 'residual_out''s buffer but does not hold"),
        {},
    ),
    "fake-output-aliases-input": (("aliasing", "output 'y' shares memory with input 'x'"), {}),
    "fake-shared-gradient": (("aliasing", "outputs 'dresidual' and 'dx' share memory"), {}),
}


def _failing_outputs(record: dict[str, Any]) -> set[str]:
    return {c["output"] for c in record["comparisons"] if c["worst_ratio"] == "inf" or c["worst_ratio"] > 1}


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    return run_suite(tmp_path_factory.mktemp("broken"), "--backend", ",".join(BROKEN), *ARGS)


def test_declared_inplace_fake_passes_everything(suite: Any) -> None:
    # y written into x's buffer and x + residual into residual's, both declared: every check passes,
    # the aliasing check included, and inputs_unchanged leaves the declared buffers to it.
    run = suite("--backend", "fake-add-inplace-declared", *ARGS)
    assert run.returncode == 0, run.output[-3000:]
    assert set(run.outcomes()) == {"passed"}
    assert {"forward", "backward", "aliasing", "inputs_unchanged", "determinism"} <= {
        r["check"] for r in run.records
    }
    aliasing = [r for r in run.records if r["check"] == "aliasing"]
    assert aliasing and all("outputs() returned" in r["extra"]["info"]["memory_evidence"] for r in aliasing)
    answers = {r["question"]: r for r in run.kind("fingerprint")}
    assert set(answers) >= ADD_QUESTIONS
    for name in ADD_QUESTIONS:
        assert (answers[name]["answer"], answers[name]["matched"]) == (QUESTIONS[name].reference, True), name


@pytest.mark.parametrize("fake", sorted(BROKEN))
def test_broken_residual_fake_is_caught(broken: SuiteRun, fake: str) -> None:
    (check, what), _ = BROKEN[fake]
    assert broken.returncode == 1, broken.output[-3000:]
    failed = [r for r in broken.records if r["backend"] == fake and r["outcome"] == "failed"]
    if check == "aliasing":
        caught = [r for r in failed if r["check"] == check and what in r["reason"]]
    else:
        caught = [r for r in failed if r["check"] == check and what in _failing_outputs(r)]
    assert caught, f"{fake}: no failed {check} record for {what}"


@pytest.mark.parametrize("fake", sorted(BROKEN))
def test_fingerprint_names_the_residual_convention(broken: SuiteRun, fake: str) -> None:
    _, differing = BROKEN[fake]
    answers = {r["question"]: r for r in broken.kind("fingerprint") if r["backend"] == fake}
    for name in ADD_QUESTIONS:
        expected = differing.get(name, QUESTIONS[name].reference)
        assert answers[name]["answer"] == expected, (fake, name, answers[name]["evidence"])
