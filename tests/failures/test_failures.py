"""--save-failures: failures shrink to a few numbers, bundles keep the exact bits, and a saved bundle
replays in a fresh process (from another folder) with the same figures."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import conformance
from conformance import oracle
from conformance.adapter.backend import FEATURES, Capabilities
from conformance.failures import bundle
from conformance.failures import shrink as failures
from conformance.judging import tolerances
from conformance.model.case import Case
from conformance.model.dtypes import numpy_dtype
from conformance.model.outputs import output_dtype, produced
from conformance.running import checks

import fakes.core  # noqa: F401  (registers the fake backends)
from support.suite import ROOT, TESTS

TABLE = tolerances.read_tolerances()


def _first(backend, case, check="forward"):
    names = checks.CHECKS[check].outputs(case)
    grad = check == "backward"
    run = failures.runner(backend, names, grad, TABLE, 30)
    inputs = conformance.model.inputs.make_inputs(case, grad=True)
    attempt = run(case, inputs if grad else {k: v for k, v in inputs.items() if k != "dy"})
    assert attempt is not None and attempt.failing
    return attempt, run


def _fake(name):
    return conformance.adapter.registry.entries()[name].load()


def test_a_row_failure_shrinks_to_one_row_of_one_feature():
    first, run = _first(_fake("fake-bias-ignored"), Case("layer_norm", (64, 384), "float32", 1e-5))
    shrunk, info = failures.shrink(first, run)
    assert shrunk.case.shape == (1, 1) and shrunk.failing == {"y"}
    assert info["regenerated"] and info["runs"] <= failures.MAX_RUNS


def test_the_failing_rows_of_the_original_input_are_kept():
    case = Case("layer_norm", (16, 8), "float32", 1e-5)
    first, run = _first(_fake("fake-ln-dx-no-mean-terms"), case, "backward")
    shrunk, kept = failures.fewest_units(first, run)
    assert shrunk.case.shape == (1, 8) and shrunk.failing == {"dx"}
    (row,) = kept
    np.testing.assert_array_equal(shrunk.inputs["x"][0], first.inputs["x"][row])
    np.testing.assert_array_equal(shrunk.inputs["dy"][0], first.inputs["dy"][row])


def test_batch_norm_keeps_the_fewest_channels():
    first, run = _first(_fake("fake-bias-ignored"), Case("batch_norm", (6, 40), "float32", 1e-5))
    shrunk, info = failures.shrink(first, run)
    assert shrunk.case.shape == (6, 1) and len(info["kept_units"]) == 1
    (channel,) = info["kept_units"]
    np.testing.assert_array_equal(shrunk.inputs["x"][:, 0], first.inputs["x"][:, channel])
    assert shrunk.inputs["running_var"][0] == first.inputs["running_var"][channel]


def test_collapsed_leading_dims_and_two_normalized_dims():
    case = Case("layer_norm", (2, 3, 4, 5), "float32", 1e-5, norm_ndim=2)
    first, run = _first(_fake("fake-wrong-axes"), case)
    shrunk, _ = failures.shrink(first, run)
    assert len(shrunk.case.shape) == 3 and shrunk.case.shape[:2] == (1, 4)


class _ShortcutPrepared:
    def __init__(self, case, inputs, grad):
        self.case, self.inputs, self.grad, self.result = case, inputs, grad, {}

    def __call__(self):
        case = self.case
        x = self.inputs["x"].astype(np.float64).reshape(case.shape[0], case.groups, -1)
        constant = np.ptp(x, axis=2).max(axis=1) == 0  # per sample: every group without spread
        out = oracle.evaluate(case, self.inputs, grad=self.grad)
        out["y"] = np.where(constant.reshape(-1, *(1,) * (len(case.shape) - 1)), 0.0, out["y"])
        if case.training:
            out |= self.running_without(constant)
        names = produced(case, self.grad)
        self.result = {n: out[n].astype(numpy_dtype(output_dtype(case, n))) for n in names}

    def running_without(self, constant):
        """The running statistics updated from the other samples only (unchanged if there are none)."""
        running = {name: self.inputs[name] for name in ("running_mean", "running_var")}
        if constant.all():
            return running
        varied = dataclasses.replace(self.case, shape=(int((~constant).sum()), *self.case.shape[1:]))
        out = oracle.evaluate(varied, {**self.inputs, "x": self.inputs["x"][~constant]}, grad=False)
        return {name: out[name] for name in running}

    def synchronize(self):
        pass

    def outputs(self):
        return self.result


class ConstantSampleShortcut:
    """GroupNorm/InstanceNorm by the oracle, wrong on a sample whose groups are all constant: a
    zero-variance shortcut returns 0 there (the bias forgotten), and a training step leaves such
    samples out of the running statistics' batch average. Not registered: the shrinker is handed it."""

    name = "fake-constant-sample-shortcut"

    def capabilities(self):
        return Capabilities(
            frozenset({"group_norm", "instance_norm"}), frozenset({"float32"}), frozenset(FEATURES)
        )

    def prepare(self, case, inputs, *, grad):
        return _ShortcutPrepared(case, inputs, grad)


def _with_constant_sample(case, sample):
    """The case's inputs with every group of ``sample`` set to its first value."""
    inputs = conformance.model.inputs.make_inputs(case, grad=True)
    x = inputs["x"][sample].reshape(case.groups, -1)
    inputs["x"][sample] = np.repeat(x[:, :1], x.shape[1], axis=1).reshape(case.shape[1:])
    return inputs


@pytest.mark.parametrize(
    "case",
    [
        Case("group_norm", (8, 6, 10), "float32", 1e-5, num_groups=3),
        Case("instance_norm", (8, 3, 2, 3), "float32", 1e-5),
    ],
    ids=lambda case: case.id,
)
def test_a_group_op_failure_shrinks_to_the_failing_sample(case):
    """The worst element of y lies in the broken sample: it alone is tried first, and still fails."""
    inputs = _with_constant_sample(case, 5)
    run = failures.runner(ConstantSampleShortcut(), ("y",), False, TABLE, 30)
    first = run(case, {k: v for k, v in inputs.items() if k != "dy"})
    assert first is not None and first.failing == {"y"}
    tried = []

    def counted(smaller, given):
        tried.append(smaller.shape)
        return run(smaller, given)

    alone, kept = failures.fewest_units(first, counted)
    assert kept == [5] and tried == [(1, *case.shape[1:])] and alone.failing == {"y"}
    shrunk, info = failures.shrink(first, run)
    assert shrunk.case.shape == (1, *case.shape[1:]) and shrunk.failing == {"y"}
    assert info["kept_units"] == [5] and not info["regenerated"]  # fresh inputs have no constant sample
    np.testing.assert_array_equal(shrunk.inputs["x"][0], inputs["x"][5])
    np.testing.assert_array_equal(shrunk.inputs["weight"], inputs["weight"])  # per channel: kept whole


def test_a_running_statistics_failure_halves_the_samples_down_to_one():
    """Running statistics are per channel, so no element points at a sample: halving finds it."""
    case = Case("instance_norm", (8, 3, 6), "float32", 1e-5, training=True, track_running_stats=True)
    inputs = _with_constant_sample(case, 5)
    run = failures.runner(ConstantSampleShortcut(), ("running_mean", "running_var"), False, TABLE, 30)
    first = run(case, {k: v for k, v in inputs.items() if k != "dy"})
    assert first is not None and "running_mean" in first.failing
    assert failures._worst_unit(first) is None
    shrunk, kept = failures.fewest_units(first, run)
    assert kept == [5] and shrunk.case.shape == (1, 3, 6)
    np.testing.assert_array_equal(shrunk.inputs["x"][0], inputs["x"][5])
    for name in ("running_mean", "running_var"):
        np.testing.assert_array_equal(shrunk.inputs[name], inputs[name])


def test_bundles_store_bfloat16_losslessly(tmp_path):
    every = np.arange(0, 2**16, 97, dtype=np.uint16)
    bits = every[np.isfinite(every.view(ml_dtypes.bfloat16).astype(np.float32))]
    x = bits.view(ml_dtypes.bfloat16)
    case = Case("rms_norm", (1, x.size), "bfloat16", 1e-6)
    meta = {"backend": "b", "check": "forward", "grad": False, "outputs": ["y"], "case": case.to_dict()}
    path = bundle.write(
        tmp_path,
        "one",
        meta,
        {"inputs": {"x": x}, "expected": {"y": x.astype(np.float64)}, "actual": {"y": x}},
    )
    saved = bundle.read(path)
    assert saved.inputs["x"].dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(saved.inputs["x"].view(np.uint16), bits)
    assert saved.case == case and saved.outputs == ("y",)
    assert "normconf replay" in json.loads((path / "bundle.json").read_text())["replay"]


def test_a_bundle_of_another_format_is_refused(tmp_path):
    with pytest.raises(bundle.BundleError):
        bundle.read(tmp_path)


def _replay(bundle_path, *args, cwd):
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    command = [sys.executable, "-m", "conformance.replay", str(bundle_path), "-p", "fakes.core", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_saved_failure_replays_elsewhere_with_the_same_figures(suite, tmp_path):
    saved = tmp_path / "bundles"
    run = suite(
        "--backend",
        "fake-bias-ignored",
        "--op",
        "layer_norm",
        "--dtype",
        "bfloat16",
        "--profile",
        "smoke",
        "--save-failures",
        str(saved),
        "-k",
        "forward",
    )
    assert run.returncode == 1, run.output[-3000:]
    failed = [r for r in run.records if r["outcome"] == "failed"]
    assert failed and all("bundle" in r["extra"] for r in failed)
    assert "replay: normconf replay" in failed[0]["reason"]
    original = failed[0]["extra"]["bundle"]
    # A fresh process in an unrelated folder, with nothing but the bundle: same figures, still failing.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    copy = shutil.copytree(original, elsewhere / "bundle")
    replayed = _replay(copy, "--json", cwd=elsewhere)
    assert replayed.returncode == 1, replayed.stderr
    recorded = json.loads((copy / "bundle.json").read_text())
    assert json.loads(replayed.stdout) == recorded["figures"]
    assert recorded["case"]["shape"] == [1, 1] and recorded["original_case"]["id"] == failed[0]["case"]["id"]
    # The same bundle against a correct backend passes; an unknown backend is a usage error.
    assert _replay(copy, "--backend", "fake-numpy", cwd=elsewhere).returncode == 0
    unknown = _replay(copy, "--backend", "no-such-backend", cwd=elsewhere)
    assert unknown.returncode == 2 and "unknown backend" in unknown.stderr


def test_replay_prints_the_figures_for_people(tmp_path):
    first, run = _first(_fake("fake-bias-ignored"), Case("layer_norm", (4, 8), "float32", 1e-5))
    path = failures.save(
        tmp_path, "fake-bias-ignored", "forward", "failed", "", first, run, grad=False, tolerances=TABLE
    )
    done = _replay(path, cwd=ROOT)
    assert done.returncode == 1
    assert "FAIL y: worst_ratio" in done.stdout and "tolerances.toml rule[" in done.stdout
    assert (path / "README.md").read_text().startswith("# fake-bias-ignored forward failed")


def test_normconf_replay_imports_a_plugin_module_from_the_current_folder(tmp_path):
    """As normconf run does (python -m pytest), normconf replay -p finds a module in the user's folder,
    though the normconf script's own folder is first on its path."""
    first, run = _first(_fake("fake-bias-ignored"), Case("layer_norm", (4, 8), "float32", 1e-5))
    path = failures.save(
        tmp_path / "b", "fake-bias-ignored", "forward", "failed", "", first, run, grad=False, tolerances=TABLE
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_adapters.py").write_text("import fakes.core  # registers the fakes\n")
    script = Path(sys.executable).parent / "normconf"
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        [str(script), "replay", str(path), "-p", "my_adapters"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "FAIL y: worst_ratio" in done.stdout, done.stderr
