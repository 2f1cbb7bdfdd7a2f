"""The liger-* adapters (backends/liger/norms.py, the opt-in ``kernels`` group): unavailable here with the
reason (Liger's kernels need CUDA), selected by ``--backend kernels``, and run end to end over stand-in
classes (tests/fakes/liger.py): the sound ones pass every case, the two defects a GPU run of the real
library showed are failed by the suite where they matter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.liger import norms
from conformance.adapter import registry
from conformance.adapter.backend import BackendUnavailable, Unsupported
from conformance.model.case import Case

from support.shared import once
from support.suite import TESTS, run_suite

SOUND = [
    "fake-liger-rms",
    "fake-liger-rms-gemma",
    "fake-liger-layer-norm",
    "fake-liger-add-rms",
    "fake-liger-group-norm",
]
BROKEN = ["fake-liger-rms-dweight", "fake-liger-gn-variance"]


def test_unavailable_without_cuda_with_the_reason():
    for cls in (
        norms.LigerRMS,
        norms.LigerRMSGemma,
        norms.LigerLayerNorm,
        norms.LigerAddRMS,
        norms.LigerGroupNorm,
    ):
        with pytest.raises(BackendUnavailable, match=r"run on CUDA only .* no CUDA device"):
            cls().capabilities()


def test_the_kernels_word_selects_them_and_all_does_not():
    table = registry.entries()
    kernels = registry.resolve("kernels", table)
    assert sorted(kernels) == sorted([*norms.KINDS, "triton-graph"])
    assert not set(kernels) & set(registry.resolve("all", table))


def test_gemma_module_takes_only_its_own_offset():
    from fakes import liger

    backend = liger.registry_backend("fake-liger-rms-gemma")
    inputs = {"x": np.ones((2, 8), np.float32), "weight": np.zeros(8, np.float32)}
    with pytest.raises(Unsupported, match=r"scales by 1 \+ w: weight_offset=0.0"):
        backend.prepare(Case(op="rms_norm", shape=(2, 8), dtype="float32", eps=1e-6), inputs, grad=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    def make(folder: Path) -> Any:
        names = ",".join(SOUND + BROKEN)
        return run_suite(
            folder,
            "--backend",
            names,
            "--cases",
            str(TESTS / "data" / "liger_cases.json"),
            "-p",
            "fakes.liger",
        )

    return once(tmp_path_factory, "liger", make)


def _by(run, backend):
    return [r for r in run.records if r.get("backend") == backend]


def test_sound_stand_ins_pass_every_case_they_run(run):
    for name in SOUND:
        records = _by(run, name)
        assert [r for r in records if r["outcome"] in ("failed", "error")] == [], name
        assert any(r["outcome"] == "passed" and r["check"] == "backward" for r in records), name
    gemma = [
        r for r in _by(run, "fake-liger-rms-gemma") if r["outcome"] == "passed" and r["check"] == "forward"
    ]
    assert {r["case"]["weight_offset"] for r in gemma} == {1.0}


def test_a_float32_weights_gradient_summed_in_bfloat16_fails(run):
    failed = [r for r in _by(run, "fake-liger-rms-dweight") if r["outcome"] == "failed"]
    assert [(r["check"], r["case"]["id"]) for r in failed] == [
        ("backward", "rms_norm-bfloat16-pfloat32-16x256-eps1e-06-normal")
    ]
    assert "output 'dweight' out of tolerance" in failed[0]["reason"]


def test_an_unclamped_one_pass_group_variance_fails_on_offset_groups(run):
    failed = {
        (r["check"], r["case"]["id"]) for r in _by(run, "fake-liger-gn-variance") if r["outcome"] == "failed"
    }
    for dtype in ("float32", "bfloat16"):
        assert ("forward", f"group_norm-{dtype}-2x8x4x4-eps1e-05-offset-g4") in failed
    assert all("group_norm" in case for _, case in failed)
    sound = {
        (r["check"], r["case"]["id"]) for r in _by(run, "fake-liger-group-norm") if r["outcome"] == "passed"
    }
    assert failed <= sound  # the same cases pass with the two-pass variance


def test_the_run_fails_because_of_the_broken_stand_ins_only(run):
    assert run.returncode == 1, run.output[-2000:]
    failing = {r["backend"] for r in run.records if r.get("outcome") in ("failed", "error")}
    assert failing == set(BROKEN)
