"""Broken adapters are that adapter's problem: listed with the reason, their tests are errors, every
other backend's results are complete; naming one explicitly is a usage error (exit 4) with the reason."""

from __future__ import annotations

import textwrap
from importlib import metadata

import pytest

from conformance.adapter import registry
from conformance.adapter.opening import Absent, open_backend

BROKEN = (
    "fake-broken-capabilities",
    "fake-broken-constructor",
    "fake-broken-capabilities-type",
    "fake-misspelt-capabilities",
)
REASONS = {
    "fake-broken-capabilities": "capabilities() raised TypeError: capabilities() of this adapter "
    "has a bug (at broken.py:",
    "fake-broken-constructor": "register() in fakes.broken.BrokenConstructor failed to "
    "load: RuntimeError: the adapter cannot be built (at broken.py:",
    "fake-broken-capabilities-type": "capabilities() returned dict, not Capabilities",
    "fake-misspelt-capabilities": "capabilities() declares ops='rmsnorm' (did you mean 'rms_norm'?), "
    "which the suite does not know; allowed: layer_norm, rms_norm,",
}


def test_listing_shows_broken_backends_beside_the_healthy_ones(suite):
    run = suite("-p", "fakes.broken", "--list-backends")
    assert run.returncode == 0, run.output[-2000:]
    assert "Traceback" not in run.output and "INTERNALERROR" not in run.output
    for name, reason in REASONS.items():
        assert f"{name}\n  origin: register() in fakes.broken." in run.output
        assert f"  available: no, broken ({reason}" in run.output
    assert "fake-numpy\n  origin: register() in fakes.core.NumpyFake" in run.output
    assert "torch-nn\n  origin: entry point" in run.output


def test_broken_backends_tests_are_errors_and_the_others_complete(suite):
    selected = " or ".join(("fake-numpy", *BROKEN))
    args = (
        "--backend",
        "all",
        "--profile",
        "smoke",
        "--op",
        "rms_norm",
        "--dtype",
        "float32",
        "-k",
        selected,
    )
    run = suite("-p", "fakes.broken", *args)
    assert run.returncode == 1, run.output[-3000:]
    assert "INTERNALERROR" not in run.output
    by_backend: dict[str, set[str]] = {}
    for record in run.records:
        by_backend.setdefault(record["backend"], set()).add(record["outcome"])
    assert by_backend["fake-numpy"] == {"passed"}
    healthy = [r for r in run.records if r["backend"] == "fake-numpy"]
    for name, reason in REASONS.items():
        assert by_backend[name] == {"error"}, name
        records = [r for r in run.records if r["backend"] == name]
        assert len(records) == len(healthy)  # every check of every case, each an error with the reason
        assert all(r["reason"].startswith(f"backend {name} is broken: {reason}") for r in records)
        assert run.header["backends"][name]["broken"] is True
        assert reason in run.header["backends"][name]["unavailable"]
        for kind in ("fingerprint", "property"):
            assert {r["outcome"] for r in run.kind(kind) if r["backend"] == name} == {"error"}


@pytest.mark.parametrize("name", BROKEN)
def test_naming_a_broken_backend_is_a_usage_error_with_the_reason(suite, name):
    run = suite("-p", "fakes.broken", "--backend", f"{name},fake-numpy", "--profile", "smoke")
    assert run.returncode == 4, run.output[-2000:]
    assert f"--backend {name} is broken: {REASONS[name]}" in run.output
    assert "INTERNALERROR" not in run.output and "Traceback" not in run.output
    assert not run.results.exists()


def _entry(value: str) -> registry.Entry:
    point = metadata.EntryPoint(name="third-party", value=value, group=registry.GROUP)
    return registry._entry_point(point)


def test_an_entry_point_naming_a_missing_module_is_broken():
    opened = open_backend(_entry("no_such_adapter_module:Adapter"))
    assert isinstance(opened, Absent) and opened.broken and opened.outcome == "error"
    assert "ModuleNotFoundError: No module named 'no_such_adapter_module'" in opened.reason


def test_an_adapter_missing_an_optional_library_is_unavailable_with_the_install_command(
    tmp_path, monkeypatch
):
    (tmp_path / "needs_a_library.py").write_text(
        textwrap.dedent(
            """
            import onnxscript_that_is_not_installed_xyz

            class Adapter:
                name = "third-party"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    opened = open_backend(_entry("needs_a_library:Adapter"))
    assert isinstance(opened, Absent) and not opened.broken and opened.outcome == "skipped"
    assert "needs onnxscript_that_is_not_installed_xyz, which is not installed" in opened.reason
    assert "(pip install onnxscript_that_is_not_installed_xyz)" in opened.reason


def test_a_built_in_adapter_missing_its_library_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "needs_onnx.py").write_text("import onnx.not_a_real_submodule_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    opened = open_backend(_entry("needs_onnx:Adapter"))
    assert isinstance(opened, Absent) and not opened.broken
    assert "(pip install 'normconf[onnx]')" in opened.reason


IDLE = ("-p", "fakes.broken", "--profile", "smoke", "--dtype", "float32")


def test_a_backend_that_executed_no_check_fails_the_run_with_a_loud_line(suite):
    run = suite(*IDLE, "--backend", "fake-rms-norm-only,fake-numpy", "--op", "layer_norm")
    assert run.returncode == 1, run.output[-2000:]
    assert "normconf: FAILED: backend fake-rms-norm-only executed no check (" in run.output
    assert "op=layer_norm not in declared ops ['rms_norm']" in run.output
    assert "backend fake-numpy executed no check" not in run.output
    assert run.header["exitstatus"] == 1
    assert {r["outcome"] for r in run.records if r["backend"] == "fake-rms-norm-only"} == {"unsupported"}
    # Selecting what it declares, the same backend runs and the run is green.
    assert suite(*IDLE, "--backend", "fake-rms-norm-only", "--op", "rms_norm").returncode == 0


def test_one_shard_does_not_call_a_backend_idle(suite):
    run = suite(*IDLE, "--backend", "fake-rms-norm-only", "--op", "layer_norm", "--shard", "1/2")
    assert run.returncode == 0, run.output[-2000:]
    assert "executed no check" not in run.output
