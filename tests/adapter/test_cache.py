"""The graph cache folder adapters share between workers and runs (conformance.adapter.cache)."""

from __future__ import annotations

import os

from conformance.adapter import cache


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
