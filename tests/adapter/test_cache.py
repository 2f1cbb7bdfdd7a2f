"""The graph cache folder adapters share between workers and runs (conformance.adapter.cache)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types

import pytest

try:
    import fcntl
except ImportError:  # no advisory locks: the claim tests are skipped
    fcntl = None  # type: ignore[assignment]

from conformance.adapter import cache

from support.suite import ROOT


def test_no_folder_when_the_cache_is_off_or_unset(monkeypatch):
    monkeypatch.setenv(cache.VARIABLE, cache.OFF)
    assert cache.root() is None and cache.folder("x") is None
    monkeypatch.delenv(cache.VARIABLE)
    assert cache.folder("x") is None


def test_a_kind_gets_its_folder_and_the_root_its_tag(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path / "c"))
    folder = cache.folder("onnx-export")
    assert folder == tmp_path / "c" / "onnx-export" and folder.is_dir()
    assert (tmp_path / "c" / cache.TAG).read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")


def test_digest_is_stable_and_separates_every_part():
    key = ("layer_norm", "float32", 1e-5, (64,), None)
    assert cache.digest(1, key) == cache.digest(1, key)
    assert cache.digest(1, key) != cache.digest(2, key)
    assert cache.digest(1, key) != cache.digest(1, ("layer_norm", "float32", 1e-6, (64,), None))
    assert cache.digest(1, key) != cache.digest(1, key, 3)


def _module(path, source):
    path.write_text(source)
    module = types.ModuleType(path.stem)
    module.__file__ = str(path)
    return module


def test_the_sources_digest_follows_each_modules_code(tmp_path):
    one, two = _module(tmp_path / "one.py", "A = 1\n"), _module(tmp_path / "two.py", "B = 2\n")
    digest = cache.sources(one, two)
    assert cache.sources(one, two) == digest and cache.sources(two, one) != digest
    edited = _module(tmp_path / "one_edited.py", "A = 2\n")
    edited.__name__ = "one"
    assert cache.sources(edited, two) != digest
    # A module without a file counts by its name and the installed version: still a key, never a crash.
    assert len(cache.sources(types.ModuleType("nofile"))) == 32


def test_store_writes_whole_files_and_load_misses_quietly(tmp_path):
    path = tmp_path / "entry.bin"
    assert cache.load(path) is None
    cache.store(path, b"graph")
    assert cache.load(path) == b"graph"
    assert os.listdir(tmp_path) == ["entry.bin"]  # no temporary file left behind


def test_a_full_disk_costs_the_cache_not_the_run(tmp_path, monkeypatch):
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    cache.store(tmp_path / "entry.bin", b"graph")
    assert os.listdir(tmp_path) == []  # nor a temporary file
    cache.store(tmp_path / "missing" / "entry.bin", b"graph")  # no folder to write in: no exception


def test_a_folder_that_cannot_be_made_turns_the_cache_off(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cache.VARIABLE, str(blocker))
    assert cache.folder("onnx-export") is None


needs_flock = pytest.mark.skipif(not cache.can_claim(), reason="no advisory file locks on this platform")


@needs_flock
def test_a_claim_excludes_another_holder_until_released(tmp_path):
    path = tmp_path / "entry.lock"
    with cache.claim(path) as first:
        with cache.claim(path) as second:
            assert first is True and second is False
        start = time.monotonic()
        with cache.claim(path, wait=0.2) as waited:
            assert waited is False and time.monotonic() - start >= 0.2
    with cache.claim(path) as again:
        assert again is True


HOLDER = """
import sys, time
from pathlib import Path
from conformance.adapter import cache
with cache.claim(Path(sys.argv[1])) as held:
    print(held, flush=True)
    time.sleep(600)
"""


@needs_flock
def test_a_killed_holder_leaves_no_claim_behind(tmp_path):
    path = tmp_path / "entry.lock"
    command = [sys.executable, "-c", HOLDER, str(path)]
    holder = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        with cache.claim(path) as held:
            assert held is False
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    with cache.claim(path, wait=5) as held:
        assert held is True


def test_a_claim_that_cannot_make_its_lock_file_builds_unlocked(tmp_path):
    with cache.claim(tmp_path / "missing" / "entry.lock") as held:
        assert held is True


@needs_flock
def test_a_waiting_claim_does_the_waiting_work_one_unit_at_a_time(tmp_path):
    path = tmp_path / "entry.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another holder, let go on the work's third unit
    calls: list[bool] = []

    def work() -> bool:
        with cache.claim(path, wait=0.05) as nested:  # a wait inside the work does none of it
            calls.append(nested)
        if len(calls) == 3:
            os.close(holder)
        return True

    cache.while_waiting(work)
    try:
        with cache.claim(path, wait=60) as held:
            assert held is True
        assert calls == [False, False, False]
        with cache.claim(path) as first, cache.claim(path, wait=1) as second:  # < WORK_MARGIN_S left
            assert first and not second and len(calls) == 3
    finally:
        cache.while_waiting(None)


@needs_flock
def test_a_run_caps_every_wait(tmp_path):
    path = tmp_path / "entry.lock"
    cache.while_waiting(None, cap=0.1)
    try:
        start = time.monotonic()
        with cache.claim(path), cache.claim(path, wait=60) as held:
            assert held is False and time.monotonic() - start < 30
    finally:
        cache.while_waiting(None)
