"""Compiling ahead in a second process during a one-process run (conformance/running/precompile.py)."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from conformance import fingerprint
from conformance.adapter import cache
from conformance.model.case import Case
from conformance.running import precompile

from fakes.precompile import Lockstep, PrecompileRaises, entry_of
from support.suite import ROOT, TESTS, run_suite

BITWISE_GRAD = {"forward": False, "training": False}  # every other check prepares with gradients here
# The checks alone: the lockstep fake's prepare waits for the process ahead to answer each entry, and
# the properties' examples are drawn as they run, never planned; the fingerprint has a test of its own.
ONLY_CHECKS = "not fingerprint and not properties"


def test_a_plan_keeps_the_first_of_each_target_in_order() -> None:
    a, b = Case("layer_norm", (2, 8), "float32", 1e-5), Case("rms_norm", (2, 8), "float32", 1e-5)
    given = [
        precompile.Target("x", a, False),
        precompile.Target("x", a, True),
        precompile.Target("x", a, False),
    ]
    given += [precompile.Target("x", b, False)]
    assert precompile.plan(given) == [given[0], given[1], given[3]]
    assert precompile.Target.from_dict(given[1].to_dict()) == given[1]


def test_why_not_names_each_reason(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path))
    monkeypatch.setattr(precompile, "usable_cores", lambda: 2)
    ok = {"disabled": False, "parallel": False, "collect_only": False}
    assert precompile.why_not(**ok) is None
    assert precompile.why_not(**{**ok, "disabled": True}) == "--no-precompile"
    assert precompile.why_not(**{**ok, "parallel": True}) == "xdist workers use the cores"
    assert precompile.why_not(**{**ok, "collect_only": True}) == "nothing runs"
    monkeypatch.setattr(precompile, "usable_cores", lambda: 1)
    assert precompile.why_not(**ok) == "one core"
    monkeypatch.setenv(cache.VARIABLE, cache.OFF)
    assert precompile.why_not(**ok) == "no graph cache"


def test_a_broken_hook_is_logged_and_the_walk_goes_on(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path))
    cases = [Case("layer_norm", (2, n), "float32", 1e-5) for n in (8, 9, 10)]
    targets = [precompile.Target("fake-precompile-raises", c, False) for c in cases]
    counts = precompile.run(targets, {"fake-precompile-raises": PrecompileRaises()})
    assert counts == {"failed": 3}
    out = capsys.readouterr().out
    assert out.count("RuntimeError: precompile hook broken on") == 3


def test_each_entry_is_built_once_by_whoever_claims_it_first(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path))
    case = Case("layer_norm", (2, 8), "float32", 1e-5)
    backend = Lockstep()
    targets = [precompile.Target(backend.name, case, False), precompile.Target(backend.name, case, True)]
    with cache.claim(entry_of(case, False)):  # the run holds the forward entry
        assert precompile.run(targets, {backend.name: backend}) == {"claimed": 1, "built": 1}
    assert precompile.run(targets, {backend.name: backend}) == {"built": 1, "cached": 1}
    assert len((tmp_path / "fake-precompile" / "built.log").read_text().splitlines()) == 2


def test_the_runs_helper_builds_the_next_unclaimed_entry_per_call(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path))
    cases = [Case("layer_norm", (2, n), "float32", 1e-5) for n in (8, 9, 10)]
    backend = Lockstep()
    targets = [precompile.Target(backend.name, c, False) for c in cases]
    targets.append(precompile.Target("fake-precompile-raises", cases[0], False))
    helper = precompile.Helper(targets, {backend.name: backend, "fake-precompile-raises": PrecompileRaises()})
    with cache.claim(entry_of(cases[1], False)):  # the process ahead holds the second
        assert helper() is True and helper.counts == {"built": 1}
        assert helper() is True and helper.counts == {"built": 2, "claimed": 1}
    assert helper() is True and helper.counts == {"built": 2, "claimed": 1, "failed": 1}
    assert helper() is False


def _pairs(run_records: list[dict[str, object]]) -> set[tuple[str, bool]]:
    return {(r["case"]["id"], BITWISE_GRAD.get(str(r["check"]), True)) for r in run_records}  # type: ignore[index]


def _built(
    tmp_path, backend: str, op: str
) -> tuple[list[str], list[tuple[str, bool]], set[tuple[str, bool]]]:
    """A run of ``backend`` over ``op`` (checks alone) on its own graph cache: who built each entry
    (the fakes' log, in order), the entries, and the (case, grad) pairs the run's checks prepared."""
    graphs = tmp_path / "cache"
    run = run_suite(
        tmp_path, "-p", "fakes.precompile", "--backend", backend, "--op", op, "--graph-cache", str(graphs),
        "-k", ONLY_CHECKS,
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    assert run.outcomes() and set(run.outcomes()) <= {"passed"}
    who, pairs = _log(graphs)
    return who, pairs, _pairs(run.records)


def _log(graphs) -> tuple[list[str], list[tuple[str, bool]]]:
    """The precompile fakes' log in the graph cache ``graphs``: who built each entry, and the entries
    ((case id, grad)), in order."""
    lines = (graphs / "fake-precompile" / "built.log").read_text().splitlines()
    built = [re.fullmatch(r"(\w+) \d+ (\S+) grad=(True|False)", line) for line in lines]
    assert all(m is not None for m in built), lines
    return [m[1] for m in built if m], [(m[2], m[3] == "True") for m in built if m]


@pytest.mark.heavy(20)
def test_a_one_process_run_offers_every_target_ahead_in_its_order(tmp_path) -> None:
    who, pairs, prepared = _built(tmp_path, "fake-precompile-lockstep", "layer_norm")
    assert set(who) == {"ahead"}  # the run built none itself
    assert len(pairs) == len(set(pairs)) and set(pairs) == prepared
    first = {case: i for i, (case, _) in reversed(list(enumerate(pairs)))}
    assert pairs == sorted(pairs, key=lambda p: (first[p[0]], p[1]))  # case by case, forward first
    log = (tmp_path / "cache" / precompile.LOG).read_text().splitlines()
    assert log[-1] == "done " + json.dumps({"built": len(pairs)})


@pytest.mark.heavy(20)
def test_the_fingerprints_probes_are_offered_ahead_after_the_checks(tmp_path) -> None:
    graphs = tmp_path / "cache"
    run = run_suite(
        tmp_path, "-p", "fakes.precompile", "--backend", "fake-precompile-lockstep", "--op", "rms_norm",
        "--graph-cache", str(graphs), "-k", "not properties",
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    who, pairs = _log(graphs)
    assert set(who) == {"ahead"}  # the run built none itself, probes included
    ids = [case_id for case_id, _ in pairs]
    checked = {r["case"]["id"] for r in run.records}
    # Every probe the run asked through prepare() (not the library-eps questions) was built ahead, after
    # the checks' cases.
    asked = {
        r["probe"]
        for r in run.kind("fingerprint")
        if r["outcome"] == "answered" and not str(r.get("answer")).startswith(fingerprint.NOT_ASKABLE)
        and not fingerprint.QUESTIONS[r["question"]].default_eps
    }  # fmt: skip
    assert asked and asked <= set(ids) and not asked & checked
    first_probe = min(ids.index(i) for i in asked)
    assert set(ids[:first_probe]) == checked


@pytest.mark.heavy(20)
def test_while_the_run_waits_for_an_entry_it_builds_the_next_ones(tmp_path) -> None:
    who, pairs, prepared = _built(tmp_path, "fake-precompile-slow-ahead", "rms_norm")
    assert len(pairs) == len(set(pairs)) and set(pairs) == prepared  # each entry built once
    assert who[0] == "ahead" and "helper" in who, who  # the run built while it waited


@pytest.mark.heavy(20)
def test_a_broken_hook_changes_nothing_and_no_precompile_starts_nothing(tmp_path) -> None:
    common = (
        "-p",
        "fakes.precompile",
        "--backend",
        "fake-precompile-raises",
        "--op",
        "rms_norm",
        "-k",
        ONLY_CHECKS,
    )
    with_it = run_suite(tmp_path / "a", *common, "--graph-cache", str(tmp_path / "a" / "cache"))
    without = run_suite(
        tmp_path / "b", *common, "--graph-cache", str(tmp_path / "b" / "cache"), "--no-precompile"
    )
    assert with_it.returncode == without.returncode == 0, with_it.output[-3000:]
    assert (tmp_path / "a" / "cache" / precompile.LOG).exists()  # it was started
    assert not (tmp_path / "b" / "cache" / precompile.LOG).exists()
    key = lambda r: (r["case"]["id"], r["check"], r["outcome"])  # noqa: E731
    assert sorted(map(key, with_it.records)) == sorted(map(key, without.records))


def test_stop_lets_the_current_entry_finish_and_ends_the_walk(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path))
    monkeypatch.setenv("NORMCONF_FAKE_PRECOMPILE_SLEEP", "0.2")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    cases = [Case("layer_norm", (2, n), "float32", 1e-5) for n in range(8, 208)]
    ahead = precompile.start(
        [precompile.Target("fake-precompile-slow", c, False) for c in cases], ["fakes.precompile"]
    )
    assert ahead is not None
    deadline = time.monotonic() + 60
    while "slept" not in ahead.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    ahead.stop()
    assert ahead.process.returncode == 0
    log = ahead.log_path.read_text().splitlines()
    assert log[-1].startswith("done ") and 0 < sum("slept" in line for line in log) < len(cases)
    assert not ahead.plan_path.exists()
