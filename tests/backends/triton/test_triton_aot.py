"""Ahead-of-time compilation of the Triton kernels for GPUs this machine does not have: the fast subset
of `make gpu-aot` (one target per vendor, a few specializations per kernel), the broken kernels of
tests/fakes/aot.py that its checks must catch, the recorded launches against the launch
policy, and the mode that makes it possible. Every compile runs in a subprocess without
TRITON_INTERPRET, since the kernels must be decorated for a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.shared import once
from support.suite import ROOT, TESTS

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")
pytest.importorskip("triton.backends.amd")

KERNELS = {
    "layer_norm_fwd",
    "layer_norm_bwd",
    "rms_norm_fwd",
    "rms_norm_bwd",
    "column_sum",
    "group_norm_fwd",
    "channel_sums",
    "group_norm_dx",
    "running_update",
}
ROW_KERNELS = KERNELS - {"running_update"}


def _run(args: list[str], timeout: int = 600, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS)])
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def subset(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict]:
    def make(folder: Path) -> Any:
        out = folder / "aot.json"
        args = ["-m", "backends.triton.kernels.aot", "--targets", "sm_90,gfx942", "--sources", "ci"]
        done = _run([*args, "--sample", "3", "--variants", "--jobs", "2", "--json", str(out)])
        return done, json.loads(out.read_text()) if out.exists() else {}

    return once(tmp_path_factory, "triton-aot-subset", make)


@pytest.mark.heavy
def test_the_fast_subset_compiles_and_passes_every_check(subset):
    done, data = subset
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert set(data["results"]) == {"sm_90", "gfx942"}
    for target, records in data["results"].items():
        assert {r["kernel"] for r in records} == KERNELS, target
        for r in records:
            assert r["problems"] == [], r
            used = r["resources"]
            assert used["registers"] > 0 and used["spills"] == 0, r
            assert 0.0 < r["occupancy"]["fraction"] <= 1.0, r
        # Each row kernel has a sampled specialization that must vectorize, and does.
        vectorized = {
            r["kernel"] for r in records if r["vector_bits"] == 128 and r["tile_access_bits"] == [128]
        }
        assert vectorized == ROW_KERNELS, target
    assert "specializations compiled, 0 failing" in done.stdout


def test_amd_occupancy_agrees_with_llvm(subset):
    """LLVM states the waves per SIMD its register use allows; targets.py computes the same."""
    _, data = subset
    from backends.triton.kernels.aot import targets

    gfx942 = targets.TARGETS["gfx942"]
    for r in data["results"]["gfx942"]:
        used = r["resources"]
        ours = min(targets.amd_vgpr_waves(gfx942, used["registers"]), targets.amd_sgpr_waves(used["sgprs"]))
        assert used["stated_waves"] == ours, r


_FAKES = """
import json
from backends.triton.kernels import mode
mode.compile_only()
from backends.triton.kernels.aot import build, targets
import fakes.aot as F
for name in ("sm_90", "gfx942"):
    for fake, launch in F.LAUNCHES.items():
        c = build.compile_launch(launch, targets.TARGETS[name])
        print(json.dumps({"target": name, "fake": fake, "problems": list(c.problems), "bits": c.vector_bits}))
"""


@pytest.mark.heavy(55)
def test_the_checks_catch_each_broken_kernel():
    done = _run(["-c", _FAKES])
    assert done.returncode == 0, done.stderr[-4000:]
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(found) == 10
    caught = {"row_scale_unspecialized": "not vectorized", "row_scale_spilling": "spills:",
              "tile_dot_staged": "shared memory", "not_a_kernel": "compile error"}  # fmt: skip
    for r in found:
        if r["fake"] == "row_scale":
            assert r["problems"] == [] and r["bits"] == 128, r
        else:
            assert any(caught[r["fake"]] in p for p in r["problems"]), r
    unvectorized = [r for r in found if r["fake"] == "row_scale_unspecialized"]
    # Named at the kernel's source lines, loads and stores both.
    for r in unvectorized:
        assert any(p.startswith("aot.py:") and "load of 16 bits" in p for p in r["problems"]), r
        assert any("store of 16 bits" in p for p in r["problems"]), r


_LAUNCHES = """
import json, math
from backends.triton.kernels import mode, blocks
mode.compile_only()
from backends.triton import backend as triton_backend
from backends.triton.kernels.aot import launches
from conformance.model.case import Case
pol = blocks.native_policy(132, blocks.NVIDIA_MAX_REGISTERS)
cases = [
    Case(op="layer_norm", shape=(4, 4096), dtype="bfloat16", eps=1e-5, param_dtype="float32"),
    Case(op="layer_norm", shape=(4, 4096), dtype="float64", eps=1e-5),
    Case(op="add_rms_norm", shape=(2048, 8192), dtype="bfloat16", eps=1e-5, residual_dtype="float32"),
    Case(op="group_norm", shape=(2, 320, 64, 64), dtype="float16", eps=1e-5, num_groups=32),
]
for case in cases:
    for backend in launches.BACKENDS:
        got = [(l.name, l.kwargs.get("BLOCK_M"), l.kwargs.get("BLOCK_N"), l.warps, l.programs, l.backward,
                l.kwargs.get("maxnreg"), l.kwargs.get("SAVE_STATS"))
               for l in launches.launches(case, backend, pol)]
        print(json.dumps({"case": case.id, "backend": backend, "launches": got}))
    prepared = triton_backend.TritonPrepared(case, launches._tensors(case, True), True, mode.select(), pol)
    print(json.dumps({"case": case.id, "backend": "info", "launches": dict(prepared.info())}))
"""


def test_recorded_launches_are_the_policys():
    from backends.triton.kernels import blocks
    from conformance.model.case import Case

    done = _run(["-c", _LAUNCHES])
    assert done.returncode == 0, done.stderr[-4000:]
    found = {(r["case"], r["backend"]): r["launches"] for r in map(json.loads, done.stdout.splitlines())}
    pol = blocks.native_policy(132, blocks.NVIDIA_MAX_REGISTERS)

    def launch(name: str, b: blocks.Blocks, backward: bool, save: bool | None = None) -> list:
        return [name, b.block_m, b.block_n, b.warps, b.programs, backward, 255, save]

    # The forward alone, which keeps no statistics; under autograd, which keeps them; the backward.
    ln = Case(op="layer_norm", shape=(4, 4096), dtype="bfloat16", eps=1e-5, param_dtype="float32")
    f, b = blocks.forward(4, 4096, pol), blocks.backward(4, 4096, pol)
    assert found[(ln.id, "triton")][:3] == [
        launch("layer_norm_fwd", f, False, False),
        launch("layer_norm_fwd", f, False, True),
        launch("layer_norm_bwd", b, True),
    ]
    # dweight and dbias: one column sum over both partial buffers (TWO).
    assert [x[0] for x in found[(ln.id, "triton")][3:]] == ["column_sum"]
    assert found[(ln.id, "triton-inplace")] == []  # not an add op

    # float64: half the tile, so rows of 4096 in two chunks of 2048.
    wide = Case(op="layer_norm", shape=(4, 4096), dtype="float64", eps=1e-5)
    f, b = blocks.forward(4, 4096, pol, wide=True), blocks.backward(4, 4096, pol, wide=True)
    assert (f.block_n, f.chunks) == (2048, 2)
    assert found[(wide.id, "triton")][:3] == [
        launch("layer_norm_fwd", f, False, False),
        launch("layer_norm_fwd", f, False, True),
        launch("layer_norm_bwd", b, True),
    ]

    add = Case(op="add_rms_norm", shape=(2048, 8192), dtype="bfloat16", eps=1e-5, residual_dtype="float32")
    f, b = blocks.forward(2048, 8192, pol), blocks.backward(2048, 8192, pol)
    assert found[(add.id, "triton")][:3] == [
        launch("rms_norm_fwd", f, False, False),
        launch("rms_norm_fwd", f, False, True),
        launch("rms_norm_bwd", b, True),
    ]
    # The in-place backend declares no float32 stream: it does not run this case.
    assert found[(add.id, "triton-inplace")] == []

    gn = Case(op="group_norm", shape=(2, 320, 64, 64), dtype="float16", eps=1e-5, num_groups=32)
    names = [x[0] for x in found[(gn.id, "triton")]]
    # The forward once (autograd's run of it again is not repeated), then the backward's three: dweight
    # and dbias reduced in one column sum.
    assert names == ["group_norm_fwd", "channel_sums", "group_norm_dx", "column_sum"]

    # What a result's extra.info records is what was launched.
    for case in (ln, wide, add):
        info = found[(case.id, "info")]
        fwd, _, bwd = found[(case.id, "triton")][:3]
        for prefix, got in (("forward", fwd), ("backward", bwd)):
            keys = ("block_m", "block_n", "warps", "programs", "max_registers")
            recorded = [info[f"{prefix}_{k}"] for k in keys]
            assert recorded == [got[1], got[2], got[3], got[4], got[6]], (case.id, prefix)


def test_compile_only_is_refused_after_another_mode_or_with_the_interpreter():
    done = _run(["-m", "backends.triton.kernels.aot", "--targets", "sm_90"], TRITON_INTERPRET="1")
    assert done.returncode == 2 and "TRITON_INTERPRET=1 is set" in done.stderr
    done = _run(["-c", "from backends.triton.kernels import mode\nmode.select()\nmode.compile_only()"])
    assert done.returncode != 0 and "was already chosen" in done.stderr
    early = "from backends.triton.kernels import mode\nmode.select()\n"
    early += "from backends.triton.kernels.aot import launches"
    done = _run(["-c", early])
    assert done.returncode != 0 and "needs backends.triton.kernels.mode.compile_only() first" in done.stderr


def test_bad_arguments_name_the_field_and_the_choices():
    done = _run(["-m", "backends.triton.kernels.aot", "--targets", "sm_75"])
    assert done.returncode == 2 and "target='sm_75' is not allowed; allowed: all, sm_80" in done.stderr
    done = _run(["-m", "backends.triton.kernels.aot", "--sources", "nightly"])
    assert done.returncode == 2 and "source='nightly' is not allowed; allowed:" in done.stderr


_COUNTS = """
import json, warnings
warnings.simplefilter("ignore")
from backends.triton.kernels import mode
mode.compile_only()
from collections import Counter
from backends.triton.kernels.aot import run, targets
out = {}
for target in targets.TARGETS.values():
    out[target.name] = Counter(f.kernel for f in run.specializations(target, run.SOURCES))
print(json.dumps(out))
"""


@pytest.mark.heavy
def test_the_figures_in_the_docs_are_this_enumerations():
    """docs/triton.md's table counts, per kernel and target, the specializations the current kernels and
    launch policy make: a change to the policy or to the kernels' flags without `make gpu-aot` leaves
    the counts stale, and fails here (the figures beside them only `make gpu-aot` recomputes)."""
    import re

    done = _run(["-c", _COUNTS])
    assert done.returncode == 0, done.stderr[-4000:]
    now = json.loads(done.stdout.splitlines()[-1])
    page = (ROOT / "docs" / "triton.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| (\d+) \|", page, re.MULTILINE)
    documented: dict[str, dict[str, int]] = {}
    for kernel, target, count in rows:
        documented.setdefault(target, {})[kernel] = int(count)
    assert documented == now, "docs/triton.md's figures are stale: run `make gpu-aot`"
    assert "Cases: ci, full, sweep." in page
