"""Each script of scripts/ledger_checks run as the ledger's reasons cite it (python scripts/ledger_checks/X.py
RESULTS) on a small real run, so that the evidence a reason names keeps working: it must confirm its cause
on a case the cause is known to explain, and report a cause as not confirmed where it does not apply (a
record that claims a deviation the backend does not show, or a cause the ledger gives to another entry).

One suite run (ci profile, a few small cases per backend) writes the shared results file; records of checks
that passed are added to it relabelled as failed, the deviation they claim being one the backend does not
show. Every framework is installed in the project's environment; where one is not, the checks that
need it skip.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.shared import once
from support.suite import ROOT

SCRIPTS = ROOT / "scripts" / "ledger_checks"
GROUP_F16_OFFSET = "group_norm-float16-2x6x10-eps1e-05-offset-g3"
GROUP_F32_OFFSET = "group_norm-float32-2x6x10-eps1e-05-offset-g3"
GROUP_F32_LARGE = "group_norm-float32-2x6x10-eps1e-05-large-g3"
GROUP_F64_OFFSET = "group_norm-float64-2x6x10-eps1e-05-offset-g3"
GROUP_F64_LARGE = "group_norm-float64-2x6x10-eps1e-05-large-g3"
ADD_LN_F16_OFFSET = "add_layer_norm-float16-12x100-eps1e-05-offset"
ADD_RMS_F32_LARGE = "add_rms_norm-float32-12x100-eps1e-05-large"
ADD_RMS_F64_LARGE = "add_rms_norm-float64-12x100-eps1e-05-large"
# (backend, case ids) of the shared run: cases the ledger entries citing the scripts cover.
RUN = {
    "torch-nn": (GROUP_F16_OFFSET, ADD_LN_F16_OFFSET, ADD_RMS_F32_LARGE),
    "flax": (GROUP_F32_OFFSET, GROUP_F32_LARGE, ADD_LN_F16_OFFSET),
    "keras": (GROUP_F32_OFFSET, GROUP_F32_LARGE, GROUP_F64_OFFSET, ADD_RMS_F64_LARGE),
    "onnxruntime": (GROUP_F32_OFFSET, ADD_LN_F16_OFFSET),
    "onnx-export-opset21": (GROUP_F64_OFFSET, GROUP_F64_LARGE),
    "onnx-export-optimized": (ADD_LN_F16_OFFSET,),
    "onnxruntime-contrib": (ADD_LN_F16_OFFSET,),
    "openvino": (GROUP_F64_OFFSET, ADD_LN_F16_OFFSET),
}
# Passed records added as failed: (backend, case id, check). No cause may be confirmed on them.
CLAIMED = (
    ("torch-nn", GROUP_F16_OFFSET, "forward"),
    ("flax", GROUP_F32_LARGE, "forward"),
    ("keras", GROUP_F32_LARGE, "forward"),
    ("onnxruntime", ADD_LN_F16_OFFSET, "forward"),
)
LINE = re.compile(r"^(\S+)\s+(\S+)\s+(\S+)\s+(\S+): .* -> (confirmed|NOT confirmed|measured)$")
Key = tuple[str, str, str, str]  # (backend, check, case id, cause)


@dataclass(frozen=True)
class Check:
    """One script's run on the shared results and what its output must say."""

    script: str
    needs: tuple[str, ...]  # the frameworks it imports
    confirmed: tuple[Key, ...]
    refuted: tuple[Key, ...]
    args: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return " ".join((self.script, *self.args))


CHECKS = (
    Check(
        "groups_torch",
        ("torch",),
        confirmed=(("torch-nn", "backward", GROUP_F16_OFFSET, "half_stats"),),
        refuted=(("torch-nn", "forward", GROUP_F16_OFFSET, "half_stats"),),
    ),
    Check(
        "groups_flax",
        ("flax",),
        confirmed=(
            ("flax", "forward", GROUP_F32_OFFSET, "one_pass"),
            ("flax", "backward", GROUP_F32_OFFSET, "one_pass"),
            ("flax", "backward", GROUP_F32_LARGE, "rsqrt_grad"),
        ),
        refuted=(("flax", "forward", GROUP_F32_LARGE, "rsqrt_grad"),),
    ),
    Check(
        "groups_keras",
        ("keras", "torch"),
        args=("keras",),
        confirmed=(
            ("keras", "forward", GROUP_F32_OFFSET, "one_pass"),
            ("keras", "backward", GROUP_F32_LARGE, "rsqrt_grad"),
            ("keras", "forward", GROUP_F64_OFFSET, "float64"),
            ("keras", "backward", GROUP_F64_OFFSET, "float64"),
        ),
        refuted=(("keras", "forward", GROUP_F32_LARGE, "rsqrt_grad"),),
    ),
    Check(
        "groups_onnx",
        ("onnxruntime", "onnx", "torch", "openvino"),
        confirmed=(
            ("onnxruntime", "forward", GROUP_F32_OFFSET, "one_pass"),
            ("onnx-export-opset21", "forward", GROUP_F64_LARGE, "stash64"),
            ("openvino", "forward", GROUP_F64_OFFSET, "float32_twin"),
        ),
        # On offset groups the float64 stash leaves the float64 one-pass error of ORT's function body
        # (the onnxruntime offset entry), so the stash alone does not explain them.
        refuted=(("onnx-export-opset21", "forward", GROUP_F64_OFFSET, "stash64"),),
    ),
    Check(
        "residual_torch",
        ("torch",),
        confirmed=(("torch-nn", "backward", ADD_LN_F16_OFFSET, "saved_stats"),),
        # torch's kernel reads the stored sum: the unrounded one explains nothing.
        refuted=(("torch-nn", "backward", ADD_LN_F16_OFFSET, "exact_sum"),),
    ),
    Check(
        "residual_ort",
        ("onnxruntime", "onnx", "openvino"),
        confirmed=(
            ("onnxruntime-contrib", "forward", ADD_LN_F16_OFFSET, "exact"),
            ("openvino", "forward", ADD_LN_F16_OFFSET, "exact"),
            ("openvino", "forward", ADD_LN_F16_OFFSET, "twin"),
        ),
        refuted=(("onnxruntime", "forward", ADD_LN_F16_OFFSET, "exact"),),
    ),
    Check(
        "residual_export",
        ("onnxruntime", "onnx", "torch"),
        confirmed=(("onnx-export-optimized", "forward", ADD_LN_F16_OFFSET, "exact"),),
        refuted=(
            ("onnx-export-optimized", "forward", ADD_LN_F16_OFFSET, "noeps"),
            ("onnx-export-optimized", "forward", ADD_LN_F16_OFFSET, "eps32"),
        ),
    ),
    Check(
        "residual_frameworks",
        ("flax",),
        args=("flax",),
        confirmed=(
            ("flax", "forward", ADD_LN_F16_OFFSET, "one_pass"),
            ("flax", "backward", ADD_LN_F16_OFFSET, "one_pass"),
        ),
        # float16 offset rows are the one-pass variance's: the unrounded sum alone makes them worse.
        refuted=(("flax", "forward", ADD_LN_F16_OFFSET, "exact_sum"),),
    ),
    Check(
        "residual_rsqrt",
        ("torch", "flax", "keras"),
        confirmed=(("torch-nn", "backward", ADD_RMS_F32_LARGE, "rsqrt_grad"),),
        # keras' float64 'large' rows overflow float32 (float64 runs in float32): not the rsqrt underflow.
        refuted=(("keras", "backward", ADD_RMS_F64_LARGE, "rsqrt_grad"),),
    ),
)


def environment() -> dict[str, str]:
    """This checkout's packages first, so that the subprocesses import them rather than an install's."""
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.pop("KERAS_BACKEND", None)  # each script that runs Keras chooses the backend it verifies
    return env


def suite_run(results: Path) -> None:
    selected = " or ".join(f"{name}:{case}]" for name, cases in RUN.items() for case in cases)
    command = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-q"]
    command += ["--backend", ",".join(RUN), "--profile", "ci", "-k", selected, "--results", str(results)]
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def claimed(record: dict[str, Any]) -> dict[str, Any]:
    """A passed record turned into a failure of its first output, which the backend does not show."""
    made = copy.deepcopy(record)
    made["outcome"] = "failed"
    made["reason"] = "a deviation claimed by the test, which the backend does not show"
    made["comparisons"][0]["worst_ratio"] = 5.0
    return made


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def make(folder: Path) -> Any:
        path = folder / "results.jsonl"
        suite_run(path)
        lines = path.read_text().splitlines()
        records = [json.loads(line) for line in lines]
        passed = {
            (r["backend"], r["case"]["id"], r["check"]): r for r in records if r.get("outcome") == "passed"
        }
        missing = [key for key in CLAIMED if key not in passed]
        assert not missing, f"records expected to pass did not: {missing}"
        path.write_text("\n".join([*lines, *(json.dumps(claimed(passed[key])) for key in CLAIMED)]) + "\n")
        return path

    return once(tmp_path_factory, "ledger-checks", make)


def verdicts(output: str) -> dict[Key, str]:
    found = {}
    for line in output.splitlines():
        matched = LINE.match(line)
        if matched:
            backend, check, case, cause, verdict = matched.groups()
            found[backend, check, case, cause] = verdict
    return found


@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
def test_ledger_check_confirms_its_cause_and_only_where_it_applies(check: Check, results: Path) -> None:
    for module in check.needs:
        # Looked up, not imported: the script imports it in its own process, and keras cannot be
        # imported before a process has chosen its Keras backend.
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{check.script} needs {module}, which is not installed")
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / f"{check.script}.py"), str(results), *check.args],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = verdicts(done.stdout)
    for key in check.confirmed:
        assert found.get(key) == "confirmed", f"{key}: {found.get(key)}\n{done.stdout}"
    for key in check.refuted:
        assert found.get(key) == "NOT confirmed", f"{key}: {found.get(key)}\n{done.stdout}"
    for backend, case, name in CLAIMED:
        assert all(v != "confirmed" for k, v in found.items() if k[:3] == (backend, name, case)), done.stdout
