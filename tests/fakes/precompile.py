"""Fakes with the optional ``precompile(case, *, grad)`` hook (conformance/running/precompile.py).

Loaded with ``-p fakes.precompile``. Each "graph" is one (case, grad) entry in the graph cache,
claimed and built the way torch-compile builds its canonical graphs: the process that holds the
claim builds it and leaves a ``.done`` file. Both fakes compute as fakes.core's correct fake.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import conformance
from conformance.adapter import cache
from conformance.model.case import Case

from fakes.core import F, NumpyFake, Prepared

# How long the lockstep fake's prepare waits for the process ahead to answer an entry.
ANSWER_WAIT_S = 120.0


def entry_of(case: Case, grad: bool) -> Path:
    folder = cache.folder("fake-precompile")
    assert folder is not None, "the precompile fakes run with a graph cache"
    return folder / cache.digest(case.id, grad)


def _log(entry: Path, who: str, case: Case, grad: bool) -> None:
    with open(entry.parent / "built.log", "a") as log:
        log.write(f"{who} {os.getpid()} {case.id} grad={grad}\n")


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
            with cache.claim(entry) as held:
                if not held:
                    return "claimed"
                if entry.with_suffix(".done").exists():
                    return "cached"
                _log(entry, "ahead", case, grad)
                cache.store(entry.with_suffix(".done"), b"")
                return "built"
        finally:
            cache.store(entry.with_suffix(".answered"), b"")

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Prepared:
        entry = entry_of(case, grad)
        deadline = time.monotonic() + ANSWER_WAIT_S
        while not entry.with_suffix(".answered").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with cache.claim(entry, wait=ANSWER_WAIT_S):
            if not entry.with_suffix(".done").exists():
                _log(entry, "run", case, grad)
                cache.store(entry.with_suffix(".done"), b"")
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
