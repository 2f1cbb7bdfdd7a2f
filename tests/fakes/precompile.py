"""Fakes with the optional ``precompile(case, *, grad)`` hook (conformance/running/precompile.py).

Loaded with ``-p fakes.precompile``. Each "graph" is one (case, grad) entry in the graph cache,
claimed and built the way torch-compile builds its canonical graphs: the process that holds the
claim builds it and leaves a ``.done`` file. Both fakes compute as fakes.core's correct fake.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import conformance
from conformance.adapter import cache
from conformance.model.case import Case

from fakes.core import F, NumpyFake, Prepared

# How long the lockstep fake's prepare waits for the process ahead to answer an entry.
ANSWER_WAIT_S = 120.0
# How long the slow fake's hook takes per entry in the process ahead.
AHEAD_BUILD_S = 2.0


def entry_of(case: Case, grad: bool) -> Path:
    folder = cache.folder("fake-precompile")
    assert folder is not None, "the precompile fakes run with a graph cache"
    return folder / cache.digest(case.id, grad)


def _log(entry: Path, who: str, case: Case, grad: bool) -> None:
    with open(entry.parent / "built.log", "a") as log:
        log.write(f"{who} {os.getpid()} {case.id} grad={grad}\n")


def _claim_and_build(entry: Path, who: str, case: Case, grad: bool, seconds: float = 0.0) -> str:
    """A hook's build of one entry, as torch-compile's: claim it without waiting, build it (log ``who``,
    take ``seconds``) unless another process holds it or it is done."""
    with cache.claim(entry) as held:
        if not held:
            return "claimed"
        if entry.with_suffix(".done").exists():
            return "cached"
        _log(entry, who, case, grad)
        time.sleep(seconds)
        cache.store(entry.with_suffix(".done"), b"")
        return "built"


def _build_after(sign: Path, entry: Path, case: Case, grad: bool) -> None:
    """The run's prepare: once ``sign`` exists (or after ANSWER_WAIT_S), claim the entry (waiting for
    a process building it) and build it unless it is done."""
    deadline = time.monotonic() + ANSWER_WAIT_S
    while not sign.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    with cache.claim(entry, wait=ANSWER_WAIT_S):
        if not entry.with_suffix(".done").exists():
            _log(entry, "run", case, grad)
            cache.store(entry.with_suffix(".done"), b"")


@conformance.register("fake-precompile-lockstep")
class Lockstep(NumpyFake):
    """Correct, with a precompile hook that builds each entry it can claim. Its prepare first waits for
    the process ahead to have answered the entry (an ``.answered`` file), so the test sees every entry
    of the plan offered to the hook, in order, however the two processes are scheduled; then builds
    the entry itself unless it is done."""

    name = "fake-precompile-lockstep"

    def precompile(self, case: Case, *, grad: bool) -> str:
        entry = entry_of(case, grad)
        try:
            return _claim_and_build(entry, "ahead", case, grad)
        finally:
            cache.store(entry.with_suffix(".answered"), b"")

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Prepared:
        entry = entry_of(case, grad)
        _build_after(entry.with_suffix(".answered"), entry, case, grad)
        return super().prepare(case, inputs, grad=grad)


@conformance.register("fake-precompile-raises")
class PrecompileRaises(NumpyFake):
    """Correct, but its precompile hook raises on every entry: the run must not notice."""

    name = "fake-precompile-raises"

    def precompile(self, case: Case, *, grad: bool) -> str:
        raise RuntimeError(f"precompile hook broken on {case.id}")


@conformance.register("fake-precompile-slow")
class PrecompileSlow(NumpyFake):
    """Correct; its precompile hook sleeps ``$NORMCONF_FAKE_PRECOMPILE_SLEEP`` seconds per entry, so a
    test can stop the process ahead in the middle of its walk."""

    name = "fake-precompile-slow"

    def precompile(self, case: Case, *, grad: bool) -> str:
        time.sleep(float(os.environ.get("NORMCONF_FAKE_PRECOMPILE_SLEEP", "0")))
        return "slept"


def _ahead() -> bool:
    """Whether this is the process compiling ahead (python -m conformance.running.precompile)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec is not None and spec.name == "conformance.running.precompile"


@conformance.register("fake-precompile-slow-ahead")
class SlowAhead(NumpyFake):
    """Correct; its hook takes ``AHEAD_BUILD_S`` per entry in the process ahead and no time in the run.
    Its prepare starts once that process has begun its first entry, so the run waits for it and, while
    it waits, builds the following entries itself (logged "helper"; the process ahead logs "ahead")."""

    name = "fake-precompile-slow-ahead"

    def precompile(self, case: Case, *, grad: bool) -> str:
        ahead = _ahead()
        who, seconds = ("ahead", AHEAD_BUILD_S) if ahead else ("helper", 0.0)
        return _claim_and_build(entry_of(case, grad), who, case, grad, seconds)

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Prepared:
        entry = entry_of(case, grad)
        _build_after(entry.parent / "built.log", entry, case, grad)
        return super().prepare(case, inputs, grad=grad)
