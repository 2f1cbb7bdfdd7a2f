"""Where adapters keep what outlives a run: compiled graphs and exports, under ``.normconf/cache``.

The pytest plugin sets ``NORMCONF_CACHE_DIR`` (``--graph-cache``; default ``.normconf/cache`` under
the rootdir, ``none`` for no cache) before any backend loads, so every xdist worker and a second run
find the same folder. An adapter asks ``folder(kind)`` for its own subfolder, keys each entry by
everything its content depends on (``digest``: the library versions, the graph's options), and
writes entries whole (``store``), so workers that build the same entry at once never read half of
one. ``normconf cache`` lists the folder; ``normconf cache --clear`` (or deleting it) empties it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from types import ModuleType

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; claim() then always holds (nothing runs ahead there)
    fcntl = None  # type: ignore[assignment]

VARIABLE = "NORMCONF_CACHE_DIR"
DEFAULT = Path(".normconf") / "cache"
# --graph-cache none: adapters keep their in-process caches only.
OFF = "none"
# The Cache Directory Tagging Specification's file: backup tools skip the folder, and ``normconf cache
# --clear`` deletes only a folder that has it.
TAG = "CACHEDIR.TAG"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by normconf (its graph cache).\n"
)


def root() -> Path | None:
    """The cache folder of this run, or None when caching is off or no run set one."""
    value = os.environ.get(VARIABLE, "").strip()
    return None if not value or value == OFF else Path(value)


def folder(kind: str = "") -> Path | None:
    """``kind``'s subfolder of the cache (created; the cache folder itself without one), or None when
    caching is off or the folder cannot be made (a read-only checkout: the run goes on without it)."""
    base = root()
    if base is None:
        return None
    path = base / kind
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not (base / TAG).exists():
        store(base / TAG, _TAG_TEXT.encode())
    return path


def digest(*parts: object) -> str:
    """A file name for an entry keyed by ``parts`` (their reprs: tuples of strings, numbers, None)."""
    text = json.dumps([repr(part) for part in parts])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.cache  # once per process and modules: the files do not change under a run
def sources(*modules: ModuleType) -> str:
    """A digest of the modules' source, for the key of an entry that code of this package builds (an
    exporter's input module, say): an upgrade, or an edit in a checkout, then builds the entry again
    instead of serving one the old code built. A module whose source cannot be read (no file) counts
    by its name and this package's version."""
    h = hashlib.sha256()
    for module in modules:
        file = getattr(module, "__file__", None)
        try:
            source = Path(file).read_bytes() if file is not None else _version().encode()
        except OSError:
            source = _version().encode()
        for part in (module.__name__.encode(), source):  # each with its length: no two splits collide
            h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:32]


def _version() -> str:
    try:
        return metadata.version("normconf")
    except metadata.PackageNotFoundError:
        return "unknown"


def load(path: Path) -> bytes | None:
    """An entry's bytes, or None when it is not there (or cannot be read: it is then built again)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def store(path: Path, data: bytes) -> None:
    """Write an entry whole (a temporary file, then a rename); a full or read-only disk costs the
    cache, never the run."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


# Work a process may do while it waits for another's claim, one unit per call, False once there is
# none left: a run that compiles ahead in a second process (conformance/running/precompile.py)
# builds the next entries of its plan itself instead of idling while that process builds this one.
_while_waiting: Callable[[], bool] | None = None
_working = threading.Lock()  # held during that work: a claim it waits for (any thread) does none
# The longest any claim waits (a run sets it below its call timeout, which a prepare's wait counts
# against), and the least time left before a wait's end for another unit of work to start.
_wait_cap = math.inf
WORK_MARGIN_S = 30.0


def while_waiting(work: Callable[[], bool] | None, *, cap: float = math.inf) -> None:
    """Set (or, with None, clear) the work claim() does while it waits, and cap every wait at ``cap``
    seconds."""
    global _while_waiting, _wait_cap
    _while_waiting, _wait_cap = work, cap


def _wait_work(deadline: float) -> bool:
    """One unit of the waiting work; False when there is none, or too little time is left for one
    (then the caller sleeps)."""
    global _while_waiting
    work = _while_waiting
    if work is None or deadline - time.monotonic() < WORK_MARGIN_S or not _working.acquire(blocking=False):
        return False
    try:
        more = work()
    finally:
        _working.release()
    if not more:
        _while_waiting = None
    return more


def can_claim() -> bool:
    """Whether claim() excludes other processes here (POSIX advisory locks); the precompiling process
    (conformance/running/precompile.py) runs only where it does."""
    return fcntl is not None


@contextlib.contextmanager
def claim(path: Path, *, wait: float = 0.0) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created) for the block, so two processes do not build one
    entry at once: yields True once held, or False when another process still holds it after ``wait``
    seconds (the caller then builds without it, or leaves the entry to the other). The lock goes with
    the process (an advisory ``flock``): a killed process leaves none behind. Where no lock can be
    taken (no lock file, no ``flock``) it yields True unlocked: the cache, never the run, pays."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield True
        return
    try:
        yield fcntl is None or _lock(fd, time.monotonic() + min(wait, _wait_cap))
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            if not _wait_work(deadline):
                time.sleep(0.02)
        except OSError:  # a file system without locks: build unlocked
            return True
