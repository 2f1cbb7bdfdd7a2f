"""A persistent child process that runs Keras cases on a Keras backend other than this process's.

Keras 3 picks its backend once per process, when keras is imported; an adapter whose backend differs
sends each case (a pickled Plan and the inputs) to a child started with KERAS_BACKEND set for it, over
a socket. The child builds, warms up, runs and returns outputs; it exits when the socket closes (its
parent exited or died), so it never outlives the parent. Every receive has a timeout, and a child
that dies or hangs is that request's error; the next request starts a fresh child.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, Any

import numpy as np

from backends.keras.plan import Plan
from conformance.adapter.backend import Outputs, Unsupported

# A reply slower than this is a hung child (the suite's own --call-timeout, 300 s by default, fires
# first; this bounds a run outside the suite). Starting a child (importing keras) is part of a prepare.
TIMEOUT_S = 600.0
# How often a waiting receive checks that the child is still alive.
POLL_S = 0.2
_TAIL = 2000  # characters of the child's output quoted in an error


class ChildError(RuntimeError):
    """The Keras child process died, hung, or raised while serving a request."""


@dataclass(frozen=True)
class Handle:
    """A case prepared in one child process (``generation`` counts the child's restarts)."""

    generation: int
    ident: int


class _Child:
    """One started child process: its process, its end of the socket, the file its output goes to."""

    def __init__(self, keras_backend: str) -> None:
        self.keras_backend = keras_backend
        ours, theirs = socket.socketpair()
        # Keras reads KERAS_BACKEND when the child imports it; sys.path makes the child import the
        # same backends/ and conformance/ as this process (an editable checkout, tests/ for fakes).
        env = {
            **os.environ,
            "KERAS_BACKEND": keras_backend,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        # Append mode: the child writes at the end whatever offset this process last read from.
        self.log: IO[bytes] = tempfile.TemporaryFile(mode="a+b")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "backends.keras.child", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            env=env,
        )
        theirs.close()  # only the child holds its end: its receive sees EOF when this process exits
        self.conn = Connection(ours.detach())

    @property
    def name(self) -> str:
        return f"the Keras child process (KERAS_BACKEND={self.keras_backend}, pid {self.proc.pid})"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """End the process now; the socket and log stay open for whoever is reading them."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Ask the child to exit, make sure it has, and release everything; idempotent."""
        if self.alive():
            with contextlib.suppress(OSError):  # it may be gone already
                self.conn.send(("exit",))
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.wait()
        self.conn.close()
        self.log.close()

    def tail(self) -> str:
        """The end of the child's output (stdout and stderr), for an error message."""
        if self.log.closed:
            return ""
        self.log.flush()
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, self.log.tell() - _TAIL))
        return self.log.read().decode("utf-8", "replace").strip()


class Worker:
    """The parent's side: starts the child lazily, sends requests, receives replies with a timeout.

    The child is closed by close(), when the Worker is garbage collected, or at interpreter exit
    (weakref.finalize); if this process dies without any of them, the child sees EOF and exits.
    """

    def __init__(self, keras_backend: str, *, timeout_s: float = TIMEOUT_S) -> None:
        self.keras_backend = keras_backend
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._box: list[_Child] = []  # the current child, if any (shared with the finalizer)
        self._generation = 0
        self._next = 0
        self._released: list[int] = []
        self._gone = ""  # why the last child ended, for requests that still name it
        self._finalizer = weakref.finalize(self, _close_box, self._box)

    @property
    def pid(self) -> int | None:
        return self._box[0].proc.pid if self._box else None

    def prepare(self, plan: Plan, arrays: Mapping[str, np.ndarray], grad: bool) -> tuple[Handle, Any]:
        """Build and warm up ``plan`` in the child; its info() comes back with the handle."""
        with self._exclusive():
            current = self._ensure()
            self._next += 1
            handle = Handle(self._generation, self._next)
            message = ("prepare", handle.ident, plan, dict(arrays), grad)
            info = self._exchange(current, message, f"prepare of {plan.case_id}")
            return handle, info

    def request(self, handle: Handle, kind: str) -> Any:
        """``run`` (call + synchronize in the child) or ``outputs`` of a prepared case."""
        with self._exclusive():
            if handle.generation != self._generation or not self._box:
                raise ChildError(f"the Keras child process that prepared this case is gone: {self._gone}")
            return self._exchange(
                self._box[0], (kind, handle.ident), f"{kind} of prepared case {handle.ident}"
            )

    def release(self, handle: Handle) -> None:
        """Forget a prepared case; sent with the next request (no I/O here: this may run inside GC)."""
        if handle.generation == self._generation:
            self._released.append(handle.ident)

    def close(self) -> None:
        """Ask the child to exit and release it; the next request starts a fresh one."""
        _close_box(self._box)

    def kill(self, why: str) -> None:
        """End the child now (a hung or abandoned request); the next request starts a fresh one.

        Only the process is ended here: a thread still waiting on it sees it die and closes it."""
        if self._box:
            self._forget(self._box[0], why).kill()

    def _forget(self, current: _Child, why: str) -> _Child:
        """Stop using ``current`` (if it is still the current child), remembering why it ended."""
        if self._box and self._box[0] is current:
            self._box.pop()
            self._gone = why
        return current

    # ------------------------------------------------------------------ internals
    def _exclusive(self) -> _Release:
        """The request lock. Held by another thread only when that thread's caller gave up on it
        (the suite abandons a timed-out call in its daemon thread, conformance.adapter.execute): the
        child is stuck in that request, so it is killed, which ends the abandoned wait at once."""
        if not self._lock.acquire(blocking=False):
            self.kill("killed: a request was still waiting on it (abandoned after a call timeout)")
            if not self._lock.acquire(timeout=self.timeout_s):
                raise ChildError("the Keras child process's previous request never finished")
        return _Release(self._lock)

    def _ensure(self) -> _Child:
        if self._box and self._box[0].alive():
            return self._box[0]
        _close_box(self._box)
        self._box.append(_Child(self.keras_backend))
        self._generation += 1
        self._released.clear()
        return self._box[0]

    def _exchange(self, current: _Child, message: tuple[Any, ...], what: str) -> Any:
        try:
            if self._released:
                # Swap before sending: a finalizer may append while this runs.
                released, self._released = self._released, []
                current.conn.send(("release", tuple(released)))
            current.conn.send(message)
        except OSError as exc:
            raise self._died(current, what) from exc
        return _unwrap(self._receive(current, what), what, current.name)

    def _receive(self, current: _Child, what: str) -> Any:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if current.conn.poll(POLL_S):
                    return current.conn.recv()
            except (EOFError, OSError) as exc:
                raise self._died(current, what) from exc
            if not current.alive():
                raise self._died(current, what)
            if time.monotonic() > deadline:
                why = f"{current.name} sent no reply within {self.timeout_s:g} s to {what}; it was killed"
                self._forget(current, why).kill()
                current.close()
                raise ChildError(why)

    def _died(self, current: _Child, what: str) -> ChildError:
        try:
            code = current.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # the socket failed but the process lives on: end it
            current.kill()
            code = current.proc.returncode
        why = f"{current.name} died with exit code {code} during {what}"
        tail = current.tail()
        self._forget(current, why).close()
        return ChildError(why + (f"; its last output:\n{tail}" if tail else ""))


def _close_box(box: list[_Child]) -> None:
    while box:
        box.pop().close()


class _Release:
    """Context manager that releases an already-acquired lock."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _unwrap(reply: Any, what: str, where: str) -> Any:
    status, *rest = reply
    if status == "ok":
        return rest[0]
    if status == "unsupported":
        raise Unsupported(rest[0])
    raise ChildError(f"{what} failed in {where}: {rest[0]}\n{rest[1]}")


# ---------------------------------------------------------------------------------- the child side
def _serve(runners: dict[int, Any], message: tuple[Any, ...]) -> tuple[Any, ...]:
    kind = message[0]
    try:
        if kind == "prepare":
            from backends.keras import (
                run as _keras_run,  # imports keras: its backend is this process's KERAS_BACKEND
            )

            _, ident, plan, arrays, grad = message
            runners[ident] = _keras_run.runner(plan, arrays, grad)
            return ("ok", {**runners[ident].info(), "process": f"child pid {os.getpid()}"})
        runner = runners[message[1]]
        if kind == "run":
            runner()
            runner.synchronize()
            return ("ok", None)
        if kind == "outputs":
            outputs: Outputs = runner.outputs()
            return ("ok", dict(outputs))
        return ("error", f"unknown request {kind!r}", "")
    except Unsupported as exc:
        return ("unsupported", str(exc))
    except Exception as exc:
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())


def main(argv: list[str]) -> int:
    """The child's loop: serve requests until the parent says exit or its end of the socket closes."""
    conn = Connection(int(argv[1]))
    runners: dict[int, Any] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return 0  # the parent is gone: exit with it
        except Exception as exc:  # a request that does not unpickle is that request's error
            conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            continue
        if message[0] == "exit":
            return 0
        if message[0] == "release":
            for ident in message[1]:
                runners.pop(ident, None)
            continue
        conn.send(_serve(runners, message))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
