"""Compile ahead in a second process while a one-process run checks (``pytest conformance``, no ``-n``).

A one-process run leaves a machine's other cores idle while it compiles: on two cores, a first
``pytest conformance`` spent ~140 of its ~310 s in torch-compile's canonical compiles (inductor's
C++), one graph at a time, between the checks. When the graph cache is on, more than one core is
usable and a selected backend has the optional ``precompile(case, *, grad) -> str`` hook, the run
writes its plan (each of that backend's (case, grad) targets, in the run's order: the checks' cases,
then the fingerprint questions' probe cases) and starts
``python -m conformance.running.precompile PLAN``, which walks it, building each entry into the
graph cache ahead of the run. The run's own prepare then loads what is there.

Each entry is built once: both processes claim it first (``conformance.adapter.cache.claim``); the
run waits for an entry in progress, the process ahead skips one the run holds or has built. The hook
builds what the run's prepare would build, from the same inputs (its contract), so outcomes do not
depend on which process built an entry: a failure ahead is logged and left for the run to meet.
``--no-precompile`` turns it off.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from conformance.adapter import cache, registry
from conformance.adapter.backend import Backend
from conformance.model.case import Case

HOOK = "precompile"
# The log of the process ahead (what it built, skipped or failed), in the graph cache.
LOG = "precompile.log"
# How long the run waits, at its end, for the process ahead to finish the entry it is building.
STOP_WAIT_S = 60.0


@dataclass(frozen=True)
class Target:
    """One entry to build ahead: a backend's case, with or without gradients."""

    backend: str
    case: Case
    grad: bool

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "case": self.case.to_dict(), "grad": self.grad}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Target:
        return cls(str(data["backend"]), Case.from_dict(data["case"]), bool(data["grad"]))


def plan(targets: Iterable[Target]) -> list[Target]:
    """``targets`` in their order, each once."""
    return list(dict.fromkeys(targets))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def why_not(*, disabled: bool, parallel: bool, collect_only: bool) -> str | None:
    """Why a run compiles nothing ahead, or None when it does (given a plan)."""
    if disabled:
        return "--no-precompile"
    if parallel:
        return "xdist workers use the cores"
    if collect_only:
        return "nothing runs"
    if cache.root() is None:
        return "no graph cache"
    if not cache.can_claim():
        return "no file locks on this platform"
    if usable_cores() < 2:
        return "one core"
    return None


class Ahead:
    """The process compiling ahead, started on a written plan; ``stop()`` at the end of the run."""

    def __init__(self, targets: Sequence[Target], modules: Sequence[str], folder: Path) -> None:
        fd, name = tempfile.mkstemp(prefix=".precompile-", suffix=".json", dir=folder)
        with os.fdopen(fd, "w") as out:
            json.dump({"modules": list(modules), "targets": [t.to_dict() for t in targets]}, out)
        self.plan_path = Path(name)
        self.log_path = folder / LOG
        # The run's import path (its rootdir, an ini ``pythonpath``, conftest folders), so the modules
        # that register its backends import there too.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with open(self.log_path, "w") as log:
            # Its own session: a Ctrl-C in the run's terminal reaches the run, which stops it.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "conformance.running.precompile", str(self.plan_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def stop(self) -> None:
        """Let it finish the entry it is building (an entry is written whole, never half), then end it;
        past STOP_WAIT_S it is killed, its compilers left to finish the files they write."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        finally:
            self.plan_path.unlink(missing_ok=True)


def start(targets: Sequence[Target], modules: Sequence[str]) -> Ahead | None:
    """Start compiling ``targets`` ahead (None when there is nothing to build or no cache to build in);
    ``modules`` are imported there first: those that register the backends (a plugin's register())."""
    folder = cache.folder()
    if not targets or folder is None:
        return None
    try:
        return Ahead(targets, modules, folder)
    except OSError:  # no process, no plan file: the run compiles as it goes
        return None


class Helper:
    """The run's share of the plan: while the run waits for an entry the process ahead is building,
    it builds the next entry nobody has claimed (``cache.while_waiting``), through the same backend
    object its checks prepare with, so both cores build. One entry per call; False once the plan is
    walked. A hook that raises here costs nothing: the run meets the failure when it prepares."""

    def __init__(self, targets: Sequence[Target], backends: dict[str, Backend]) -> None:
        self.targets = list(targets)
        self.backends = backends
        self.next = 0
        self.counts: dict[str, int] = {}

    def __call__(self) -> bool:
        while self.next < len(self.targets):
            target = self.targets[self.next]
            self.next += 1
            # Its warnings are not the waiting check's: they would be recorded on that check's result.
            with warnings.catch_warnings(record=True):
                answer = _answer(self.backends[target.backend], target)
            self.counts[answer] = self.counts.get(answer, 0) + 1
            if answer not in SKIPPED:
                return True
        return False


# The hook's answers that did no work: the walk goes on to the next entry at once.
SKIPPED = frozenset({"cached", "claimed"})


def _answer(backend: Backend, target: Target) -> str:
    """The hook's answer for ``target``, or "failed" (printed) when it raised anything but an interrupt:
    a pytest outcome (skip, fail) raised in a hook is the hook's failure, not the run's."""
    try:
        return str(getattr(backend, HOOK)(target.case, grad=target.grad))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        print(f"{target.backend} {target.case.id} grad={target.grad}: {type(exc).__name__}: {exc}")
        return "failed"


_stopping = False


def _stop(signum: int, frame: FrameType | None) -> None:
    global _stopping
    _stopping = True


def run(targets: Sequence[Target], backends: dict[str, Backend], parent: int | None = None) -> dict[str, int]:
    """Build ``targets`` in order, each through its backend's hook; counts of the hook's answers. Stops
    between entries when asked (SIGTERM) or when the run that started it is gone."""
    counts: dict[str, int] = {}
    for target in targets:
        if _stopping or (parent is not None and os.getppid() != parent):
            break
        if target.backend not in backends:
            continue  # it did not load here: the run builds its entries itself
        start = time.perf_counter()
        answer = _answer(backends[target.backend], target)  # a failure: the run meets it and reports it
        counts[answer] = counts.get(answer, 0) + 1
        seconds = time.perf_counter() - start
        print(f"{answer} {target.backend} {target.case.id} grad={target.grad} {seconds:.2f}s", flush=True)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parent = os.getppid()
    signal.signal(signal.SIGTERM, _stop)
    with contextlib.suppress(OSError):
        os.nice(10)  # the run's own work first; this uses what the run leaves idle
    given = json.loads(Path(args[0]).read_text())
    for module in given["modules"]:
        try:
            importlib.import_module(module)
        except Exception as exc:  # its backends are left to the run
            print(f"import {module}: {type(exc).__name__}: {exc}")
    targets = [Target.from_dict(d) for d in given["targets"]]
    backends: dict[str, Backend] = {}
    table = registry.entries()
    for name in dict.fromkeys(t.backend for t in targets):
        try:
            backends[name] = table[name].load()
        except Exception as exc:
            print(f"load {name}: {type(exc).__name__}: {exc}")
    counts = run(targets, backends, parent)
    print("done", json.dumps(counts, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
