"""The run flags' one table: pytest conformance and normconf run take the same flags with the same help,
and what normconf run forwards to pytest arrives as the user gave it."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from conformance.cli.main import build_parser
from conformance.running import flags

from support.suite import ROOT


def _plugin_parser() -> argparse.ArgumentParser:
    """The flags as the plugin declares them (pytest's own defaults), in a plain argparse parser."""
    parser = argparse.ArgumentParser()
    flags.add(parser.add_argument, flags.RUN)
    return parser


def _normconf_run(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *args])


GIVEN = [
    "--backend", "torch-nn,onnxruntime", "--op", "rms_norm", "--dtype", "float32,bfloat16",
    "--profile", "full", "--shard", "2/3", "--call-timeout", "12.5", "--max-timeouts", "7",
    "--tolerances", "t.toml", "--ledger", "a.toml", "--ledger", "b", "--no-builtin-ledger",
    "--strict-ledger", "--save-failures", "bundles",
]  # fmt: skip


def test_what_normconf_run_forwards_arrives_unchanged():
    args = _normconf_run(*GIVEN)
    forwarded = flags.forward(args, flags.RUN)
    received = _plugin_parser().parse_args(forwarded)
    for flag in flags.RUN:
        assert getattr(received, flag.dest) == getattr(args, flag.dest), flag.name
    assert received.ledger == ["a.toml", "b"] and received.call_timeout == 12.5


def test_normconf_runs_defaults_forward_as_pytest_defaults():
    """One default for both ways of running, passed on explicitly so that no PYTEST_ADDOPTS or ini
    addopts can replace what normconf run announced."""
    args = _normconf_run()
    forwarded = flags.forward(args, flags.RUN)
    assert forwarded[forwarded.index("--profile") + 1] == "smoke"
    received = _plugin_parser().parse_args(flags.forward(args, flags.RUN))
    assert {f.dest: getattr(received, f.dest) for f in flags.RUN} == {
        f.dest: getattr(args, f.dest) for f in flags.RUN
    }


@pytest.mark.parametrize("flag", flags.RUN, ids=lambda f: f.name)
def test_pytest_and_normconf_run_describe_each_flag_alike(flag, run_help, pytest_help):
    words = " ".join(flag.help.format(default="").split()[:6])
    assert flag.name in pytest_help and flag.name in run_help
    assert words in " ".join(pytest_help.split()) and words in " ".join(run_help.split())


def test_a_flag_missing_from_the_forwarded_list_is_caught():
    """The round trip above would see a dropped flag: forward without --dtype loses the user's value."""
    args = _normconf_run(*GIVEN)
    without = [f for f in flags.RUN if f is not flags.DTYPE]
    received = _plugin_parser().parse_args(flags.forward(args, without))
    assert received.dtype != args.dtype


def _help(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", *command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def run_help() -> str:
    return _help("conformance.cli.main", "run")


@pytest.fixture(scope="module")
def pytest_help() -> str:
    return _help("pytest", "-p", "no:cacheprovider")
