"""A costly fixture value computed once per test session, however many pytest-xdist workers ask for it.

A module-scoped fixture runs once per worker that runs a test of its module; when the scheduler spreads
a module's tests over both workers, a subprocess run of the suite (tens of seconds) runs twice. Here the
first worker to ask computes the value under a file lock in the session's shared temporary folder and
pickles it; the others load it. Without xdist the folder is the session's own and the lock is uncontended.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")


def _root(factory: pytest.TempPathFactory) -> Path:
    base = factory.getbasetemp()
    # Under xdist each worker's basetemp is <session folder>/popen-gwN: the parent is shared.
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """``make(folder)`` on the session's first request for ``name``; its pickled value afterwards.

    ``folder`` is a folder of the shared session temp, so paths inside the value stay valid for every
    worker. A ``make`` that raises is not remembered: the next request tries again and raises again.
    """
    root = _root(factory) / "shared" / name
    root.mkdir(parents=True, exist_ok=True)
    stored = root / "value.pickle"
    with FileLock(str(root / "lock")):
        if stored.exists():
            with stored.open("rb") as handle:
                value: T = pickle.load(handle)
            return value
        work = root / "work"
        work.mkdir(exist_ok=True)
        value = make(work)
        partial = root / "value.pickle.partial"
        with partial.open("wb") as handle:
            pickle.dump(value, handle)
        partial.replace(stored)
        return value
