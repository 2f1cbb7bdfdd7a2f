"""The launch path (backends/triton/kernels/launcher.py): recording, and bound launches checked against a
fake Triton kernel whose compiled object records what its launcher receives. Native launches need a GPU;
what runs here is the decision logic, with the launcher signature Triton 3.6 and 3.9 share."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from backends.triton.kernels import launcher


class FakeCompiled:
    """What ``JITFunction.run`` returns: the launcher, the loaded function and the packed metadata."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.function, self.packed_metadata = "fn-handle", "packed"
        self.run = lambda *a: calls.append(a)


class FakeKernel:
    """A JITFunction's surface: parameter names, ``run`` (Triton's path) and ``kernel[grid](...)``."""

    __name__ = "fake_kernel"
    arg_names: ClassVar[list[str]] = ["X", "Y", "n_cols", "FLAG", "BLOCK"]

    def __init__(self, compiled: type = FakeCompiled) -> None:
        self.slow: list[tuple[Any, ...]] = []  # Triton's path: (grid, args, options)
        self.fast: list[tuple[Any, ...]] = []  # the compiled launcher's arguments
        self.compiled = compiled

    def run(self, *args: Any, grid: Any, warmup: bool, **options: Any) -> Any:
        self.slow.append((grid, args, options))
        return self.compiled(self.fast)

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **options: self.run(*args, grid=grid, warmup=False, **options)


DRIVER = launcher.Driver(lambda: 0, lambda device: f"stream-{device}")


def _bound(kernel: FakeKernel, hooks: bool = False) -> launcher.Bound:
    return launcher.Bound(kernel, DRIVER, hooks_installed=lambda: hooks)


def _go(bound: launcher.Bound, x: torch.Tensor, n_cols: int = 8, flag: bool = True) -> None:
    bound.launch(4, (x, x, n_cols), {"FLAG": flag, "BLOCK": 16, "num_warps": 4})


def test_a_repeated_launch_calls_the_compiled_launcher_with_the_arguments_in_parameter_order():
    kernel, x = FakeKernel(), torch.zeros(8)
    bound = _bound(kernel)
    _go(bound, x)
    assert len(kernel.slow) == 1 and kernel.fast == []
    _go(bound, x)
    assert len(kernel.slow) == 1
    # (grid x, y, z, stream, function, packed metadata, launch metadata and hooks: none), then every
    # parameter in order, constexprs included and launch options (num_warps) left out.
    assert kernel.fast == [(4, 1, 1, "stream-0", "fn-handle", "packed", None, None, None, x, x, 8, True, 16)]
    assert bound.unbound is None


@pytest.mark.parametrize(
    "change",
    [
        lambda x: {"x": x.to(torch.float64)},  # another dtype
        lambda x: {"x": torch.zeros(9)[1:]},  # a pointer 4 bytes past 16-byte alignment
        lambda x: {"x": x, "n_cols": 9},  # another integer (Triton specializes on % 16 and == 1)
        lambda x: {"x": x, "flag": False},  # another constexpr
    ],
    ids=["dtype", "alignment", "integer", "constexpr"],
)
def test_what_triton_specializes_on_makes_a_new_key(change):
    kernel, x = FakeKernel(), torch.zeros(8)
    bound = _bound(kernel)
    _go(bound, x)
    _go(bound, **change(x))
    assert len(kernel.slow) == 2 and kernel.fast == []


def test_a_key_blind_to_alignment_would_launch_a_misaligned_pointer_on_the_aligned_kernel(monkeypatch):
    # The broken build: keyed by dtype alone, the misaligned view reuses the aligned specialization.
    def dtype_only(args, options):
        return tuple(getattr(a, "dtype", a) for a in args), tuple(options.items())

    monkeypatch.setattr(launcher, "key", dtype_only)
    kernel, x = FakeKernel(), torch.zeros(8)
    bound = _bound(kernel)
    _go(bound, x)
    _go(bound, torch.zeros(9)[1:])
    assert len(kernel.slow) == 1 and len(kernel.fast) == 1  # what the test above rules out


def test_installed_launch_hooks_take_tritons_path_every_time():
    kernel, x = FakeKernel(), torch.zeros(8)
    bound = _bound(kernel, hooks=True)
    for _ in range(3):
        _go(bound, x)
    assert len(kernel.slow) == 3 and kernel.fast == []


def test_hooks_installed_on_tritons_knobs_are_seen_at_every_launch():
    # The knobs are looked up once and kept: a hook set (and removed) afterwards must still be seen.
    knobs = pytest.importorskip("triton.knobs", reason="Triton before 3.4 has no knobs")

    before = knobs.runtime.launch_enter_hook
    assert not launcher._hooks_installed()
    try:
        knobs.runtime.launch_enter_hook = lambda metadata: None
        assert launcher._hooks_installed()
    finally:
        knobs.runtime.launch_enter_hook = before
    assert not launcher._hooks_installed()


def test_a_compiled_kernel_without_the_launch_attributes_stays_on_tritons_path():
    class Other:  # another Triton's compiled object: no packed_metadata
        def __init__(self, calls: list[tuple[Any, ...]]) -> None:
            self.function, self.run = "fn", lambda *a: calls.append(a)

    kernel, x = FakeKernel(Other), torch.zeros(8)
    bound = _bound(kernel)
    for _ in range(3):
        _go(bound, x)
    assert len(kernel.slow) == 3 and kernel.fast == []
    assert bound.unbound == "the compiled kernel has no packed_metadata: launches take Triton's path"


def test_a_parameter_left_to_its_default_stays_on_tritons_path():
    kernel, x = FakeKernel(), torch.zeros(8)
    bound = _bound(kernel)
    for _ in range(2):
        bound.launch(4, (x, x, 8), {"FLAG": True})  # BLOCK not passed
    assert len(kernel.slow) == 2 and kernel.fast == []
    assert bound.unbound == "parameters ['BLOCK'] were not passed by name"


def test_the_key_cache_starts_afresh_past_its_bound(monkeypatch):
    monkeypatch.setattr(launcher, "MAX_KEYS", 2)
    kernel, x = FakeKernel(), torch.zeros(8)
    bound = _bound(kernel)
    for n_cols in (1, 2, 3):
        _go(bound, x, n_cols)
    assert len(bound.compiled) == 1  # cleared at the third key, which then went in


def test_recording_records_and_runs_nothing():
    kernel, x = FakeKernel(), torch.zeros(8, dtype=torch.bfloat16)
    with launcher.recording() as outer:
        launcher.launch(kernel, 3, x, 7, FLAG=True)
        with launcher.recording() as inner:
            launcher.launch(kernel, 5, x, 8, FLAG=False)
        launcher.launch(kernel, 6, x, 9, FLAG=True)
    assert kernel.slow == [] and kernel.fast == []
    assert [(r.kernel, r.programs, r.tensors, dict(r.options)) for r in outer] == [
        ("fake_kernel", 3, ("torch.bfloat16", None), {"FLAG": True}),
        ("fake_kernel", 6, ("torch.bfloat16", None), {"FLAG": True}),
    ]
    assert [r.programs for r in inner] == [5]


def test_launches_here_take_tritons_path():
    # This machine has no GPU: interpreted (or compile-only) launches are never bound.
    kernel = FakeKernel()
    launcher.launch(kernel, 2, torch.zeros(4), 4, FLAG=True, BLOCK=4)
    launcher.launch(kernel, 2, torch.zeros(4), 4, FLAG=True, BLOCK=4)
    assert [grid for grid, _, _ in kernel.slow] == [(2,), (2,)] and kernel.fast == []
    assert launcher.unbound() == {}


def _all_or_none_aligned(args, options):
    # The broken build: one flag for "every pointer aligned", blind to which ones are not.
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    aligned = all(not t.data_ptr() & 15 for t in tensors)
    return tuple(getattr(a, "dtype", a) for a in args), aligned, tuple(options.items())


@pytest.mark.parametrize("build", ["real", "broken"])
def test_keys_differ_in_which_pointers_are_misaligned(monkeypatch, build):
    if build == "broken":
        monkeypatch.setattr(launcher, "key", _all_or_none_aligned)
    aligned, off = torch.zeros(8), torch.zeros(9)[1:]
    pairs = ((aligned, aligned), (aligned, off), (off, aligned), (off, off))
    keys = {launcher.key((p, q, 8), {"FLAG": True}) for p, q in pairs}
    assert (len(keys) == 4) is (build == "real")


def test_kept_options_launch_as_the_same_options_passed_by_name():
    kernel, x = FakeKernel(), torch.zeros(8)
    bound = _bound(kernel)
    kept = launcher.Options({"FLAG": True, "BLOCK": 16, "num_warps": 4})
    assert dict(kept) == {"FLAG": True, "BLOCK": 16, "num_warps": 4}
    assert kept == launcher.Options(dict(kept)) and hash(kept) == hash(launcher.Options(dict(kept)))
    assert kept != launcher.Options({**kept, "FLAG": False})
    for _ in range(2):
        bound.launch(4, (x, x, 8), kept)
    # One trip through Triton's path with the options by name, then the bound launch with their values.
    assert [options for _, _, options in kernel.slow] == [dict(kept)]
    assert kernel.fast == [(4, 1, 1, "stream-0", "fn-handle", "packed", None, None, None, x, x, 8, True, 16)]
