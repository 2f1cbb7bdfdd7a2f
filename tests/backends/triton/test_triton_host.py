"""The host side of the triton backend's calls (backends/triton/kernels/host.py): what one call launches,
copies and allocates, pinned for the benchmark's cases (counts, not times: those are benchmarks), the
broken host paths of tests/fakes/triton_host.py caught, and the pieces that make the path short: dweight
partial buffers left uninitialized, the scalars kept, autograd skipped where nothing needs a gradient."""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable

import pytest

from backends.triton.kernels import host, mode

mode.select()

import torch  # noqa: E402

from backends.triton.kernels import blocks, launch, launcher  # noqa: E402
from backends.triton.kernels import functions as F  # noqa: E402
from conformance.model.case import ADD_OPS  # noqa: E402

from fakes import triton_host  # noqa: E402

KERNELS = {
    "layer_norm": ("layer_norm_fwd", "layer_norm_bwd"),
    "rms_norm": ("rms_norm_fwd", "rms_norm_bwd"),
    "add_rms_norm": ("rms_norm_fwd", "rms_norm_bwd"),
    "add_layer_norm": ("layer_norm_fwd", "layer_norm_bwd"),
}
# Per op: activation-shaped outputs of the forward (y, and residual_out for the add ops), statistics
# saved for the backward (mean and rstd, or rstd), and parameters with a gradient.
OUTPUTS = {
    "layer_norm": (1, 2, 2),
    "rms_norm": (1, 1, 1),
    "add_rms_norm": (2, 1, 1),
    "add_layer_norm": (2, 2, 2),
}


def _kinds(allocations: tuple[str, ...], shape: tuple[int, int]) -> dict[str, int]:
    """Each allocation named by its shape: activation [rows, cols], statistics [rows] float32, parameter
    gradient [cols], partial buffer [programs, cols] float32 (anything else is 'other: ...')."""
    rows, cols = shape
    programs = blocks.backward(rows, cols, host.GPU_POLICY).programs
    names = {
        f"[{rows}, {cols}] bfloat16": "activation",
        f"[{rows}] float32": "statistics",
        f"[{cols}] bfloat16": "parameter",
        f"[{programs}, {cols}] float32": "partial",
    }
    kinds: dict[str, int] = {}
    for allocation in allocations:
        described = allocation.split(" ", 1)[1]
        kind = names.get(described, f"other: {allocation}")
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("op", host.OPS)
@pytest.mark.parametrize("shape", list(host.SHAPES))
def test_a_call_launches_its_kernels_and_allocates_only_outputs_and_partials(shape, op, grad):
    seen = host.census(host.prepared(host.case(op, shape), grad=grad))
    forward, backward = KERNELS[op]
    # The forward in one launch; the backward in two: the row kernel, then dweight and dbias together.
    assert seen.launches == ((forward, backward, "column_sum") if grad else (forward,))
    assert seen.h2d_copies == ()
    assert seen.torch_kernels == ()
    activations, statistics, params = OUTPUTS[op]
    want = {"activation": activations}
    if grad:  # + dx, the statistics the backward reads, the parameters' gradients and partial sums
        want |= {
            "activation": activations + 1,
            "statistics": statistics,
            "parameter": params,
            "partial": params,
        }
    assert _kinds(seen.allocations, host.SHAPES[shape]) == want


@pytest.mark.parametrize(
    ("name", "broken", "op", "grad", "caught"),
    [
        ("scalars", triton_host.uncached_scalars, "rms_norm", True, lambda c: c.h2d_copies == ("tensor",)),
        (
            "partial",
            triton_host.zeroed_partial,
            "layer_norm",
            True,
            lambda c: c.torch_kernels == ("zeros",) * 2,
        ),
        ("reduce", triton_host.reduction_per_buffer, "layer_norm", True, lambda c: len(c.launches) == 4),
        # A forward alone that allocates mean and rstd anyway.
        (
            "layer_norm_forward",
            triton_host.statistics_always,
            "add_layer_norm",
            False,
            lambda c: c.allocations.count("new_empty [32] float32") == 2,
        ),
    ],
    ids=["uncached-scalars", "zeroed-partials", "reduction-per-buffer", "statistics-unread"],
)
def test_the_census_catches_broken_host_paths(monkeypatch, name, broken, op, grad, caught):
    call = host.prepared(host.case(op, "32x4096"), grad=grad)
    assert not caught(host.census(call))
    monkeypatch.setattr(launch, name, broken)
    assert caught(host.census(call))


def test_partial_buffers_full_of_nan_give_the_right_gradients(monkeypatch):
    # The backward never reads a partial row before writing it: buffers of NaN (what uninitialized
    # memory may hold) change nothing. Rows of 200 in chunks of 64, 3 programs over 37 rows: several
    # tiles a program and several chunks a row, the path that adds into the row.
    def nan_partial(want, b, n_cols, acc, dummy):
        return torch.full((b.programs, n_cols), math.nan, dtype=acc) if want else dummy

    monkeypatch.setattr(launch, "partial", nan_partial)
    pol = blocks.Policy(max_block_n=64, tile=128, max_programs=3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 200, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(200, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(200, dtype=torch.float64, generator=gen, requires_grad=True)
    dy = torch.randn(37, 200, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad(F.layer_norm(x, (200,), w, b, eps=1e-5, pol=pol), (x, w, b), dy)
    want = torch.autograd.grad(torch.nn.functional.layer_norm(x, (200,), w, b, 1e-5), (x, w, b), dy)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(F.rms_norm(x, (200,), w, eps=1e-5, pol=pol), (x, w), dy)
    want = torch.autograd.grad(torch.nn.functional.rms_norm(x, (200,), w, 1e-5), (x, w), dy)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_the_scalars_are_made_once_per_value():
    cpu = torch.device("cpu")
    first = launch.scalars(1e-5, 0.0, torch.float64, cpu)
    assert launch.scalars(1e-5, 0.0, torch.float64, cpu) is first
    assert first.tolist() == [1e-5, 0.0]
    # Bits, not equality: -0.0 keeps its sign, NaN finds its own tensor again.
    negative = launch.scalars(1e-5, -0.0, torch.float64, cpu)
    assert negative is not first and math.copysign(1.0, negative[1].item()) == -1.0
    nan = launch.scalars(math.nan, 1.0, torch.float32, cpu)
    assert launch.scalars(math.nan, 1.0, torch.float32, cpu) is nan
    assert launch.scalars(1e-5, 0.0, torch.float32, cpu).dtype == torch.float32


def test_autograd_is_skipped_only_where_nothing_needs_a_gradient():
    x, w = torch.randn(4, 16), torch.randn(16)
    pol = blocks.Policy(max_block_n=16, tile=64, max_programs=2)
    plain = F.rms_norm(x, (16,), w, eps=1e-6, pol=pol)
    assert plain.grad_fn is None
    w.requires_grad_(True)
    tracked = F.rms_norm(x, (16,), w, eps=1e-6, pol=pol)
    assert tracked.grad_fn is not None and type(tracked.grad_fn).__name__.startswith("_RMSNorm")
    torch.testing.assert_close(tracked.detach(), plain, rtol=0, atol=0)
    with torch.no_grad():
        assert F.rms_norm(x, (16,), w, eps=1e-6, pol=pol).grad_fn is None


def test_a_gradient_already_in_rows_is_used_as_given_and_any_other_is_made_rows():
    x = torch.randn(6, 16)
    dy = torch.randn(6, 16)
    assert launch.like_rows(dy, x) is dy
    # What y.sum().backward() hands a backward: an expanded (stride 0) gradient; and a [2, 3, 16] one.
    for other in (torch.ones(()).expand(6, 16), torch.randn(2, 3, 16), torch.randn(16, 6).t()):
        rows = launch.like_rows(other, x)
        assert rows.shape == x.shape and rows.is_contiguous()
        torch.testing.assert_close(rows, other.reshape(6, 16), rtol=0, atol=0)
    # Through the kernels: a non-contiguous cotangent gives the gradients of its contiguous copy.
    xs, w = torch.randn(6, 16, requires_grad=True), torch.randn(16, requires_grad=True)
    pol = blocks.Policy(max_block_n=16, tile=64, max_programs=2)
    y = F.rms_norm(xs, (16,), w, eps=1e-6, pol=pol)
    cotangent = torch.randn(16, 6).t()
    got = torch.autograd.grad(y, (xs, w), cotangent)
    y = F.rms_norm(xs, (16,), w, eps=1e-6, pol=pol)
    want = torch.autograd.grad(y, (xs, w), cotangent.contiguous())
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("op", host.OPS)
def test_the_floor_is_the_same_call_without_the_backends_host_path(op, grad):
    # What the host table subtracts: the same harness, outputs and gradients, no launch and no saved
    # statistics; under no_grad no autograd node at all, as the backend's own forward.
    c = host.case(op, "32x4096")
    ours, floor = host.prepared(c, grad=grad), host.prepared(c, grad=grad, floor=True)
    seen = host.census(floor)
    assert seen.launches == () and seen.h2d_copies == () and seen.torch_kernels == ()
    real = host.census(ours)
    activations, _, params = OUTPUTS[op]
    # The outputs; with gradients, dx (and dresidual) and each parameter's gradient besides.
    inputs = 2 if op in ADD_OPS else 1
    assert len(seen.allocations) == activations + (inputs + params if grad else 0)
    assert set(seen.allocations) <= set(real.allocations)
    with launcher.recording():
        ours(), floor()
    assert {k: (v.shape, v.dtype) for k, v in floor.results.items()} == {
        k: (v.shape, v.dtype) for k, v in ours.results.items()
    }
    assert all(not v.requires_grad for v in floor.results.values())


def test_host_times_are_the_fastest_of_interleaved_rounds():
    calls: list[str] = []
    slow = lambda: calls.append("slow") or sum(range(2000))  # noqa: E731
    fast = lambda: calls.append("fast")  # noqa: E731
    a, b = host.seconds_per_call(slow, fast, budget_s=0.05, rounds=3)
    assert 0 < b < a
    # Round by round: each call's rounds alternate with the other's, not one call's rounds first.
    runs = [name for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]
    assert runs[:6] == ["slow", "fast"] * 3


def _kernel() -> None:
    """Stands for a Triton kernel in a recorded launch (never run)."""


@pytest.mark.parametrize("timer", ["real", "nested_seconds_per_call"])
def test_a_timed_calls_launches_do_not_outlive_it(timer):
    """Interleaved rounds must not time one call with another's launches piling up: a recorded launch
    holds its tensors, and a call whose outputs stay alive allocates fresh memory on every call."""
    seconds_per_call = host.seconds_per_call if timer == "real" else triton_host.nested_seconds_per_call
    outlived: list[bool] = []
    order: list[str] = []
    last: dict[str, weakref.ref[torch.Tensor]] = {}

    def timed(name: str) -> Callable[[], None]:
        def call() -> None:
            order.append(name)
            previous = last.get(name)
            outlived.append(previous is not None and previous() is not None)
            out = torch.empty(4)
            launcher.launch_with(_kernel, 1, (out,), {})
            last[name] = weakref.ref(out)

        return call

    seconds_per_call(timed("a"), timed("b"), budget_s=0.02, rounds=2)
    # Past the 20 warm-up calls each: every round ran its call more than once (a pile-up can show).
    rounds = [list(run) for _, run in itertools.groupby(order[40:])]
    assert len(rounds) >= 4 and all(len(run) > 1 for run in rounds), [len(run) for run in rounds]
    assert any(outlived) == (timer != "real")


@pytest.mark.parametrize("build", ["real", "rebuilt_options"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("op", host.OPS)
def test_a_steady_call_launches_with_options_made_once(monkeypatch, op, grad, build):
    # The launch options are kept per launch shape and flags (launch.kept): a second call passes the
    # very objects of the first, so no launch builds or hashes them again.
    if build != "real":
        monkeypatch.setattr(launch, "kept", getattr(triton_host, build))
    call = host.prepared(host.case(op, "32x4096"), grad=grad)
    with launcher.recording() as first:
        call()
    with launcher.recording() as second:
        call()
    assert [r.kernel for r in first] == [r.kernel for r in second]
    assert all(isinstance(r.options, launcher.Options) for r in first)
    kept = [a.options is b.options for a, b in zip(first, second, strict=True)]
    # The broken build rebuilds every launch's options.
    assert all(kept) is (build == "real")


@pytest.mark.parametrize("op", host.OPS)
def test_a_forward_without_autograd_keeps_nothing_for_a_backward(monkeypatch, op):
    # Nothing needs a gradient: the forward runs without autograd (launch.apply) and skips what only a
    # backward reads (saved tensors, shapes and dtypes kept on ctx), host time on every call.
    def kept(self, *args):
        raise AssertionError(f"an untracked forward of {op} kept {len(args)} values for a backward")

    monkeypatch.setattr(launch._Untracked, "save_for_backward", kept)
    monkeypatch.setattr(launch._Untracked, "__setattr__", kept)
    call = host.prepared(host.case(op, "32x4096"), grad=False)
    with launcher.recording() as launches:
        call()
    assert len(launches) == 1
    # With a gradient wanted, autograd's ctx keeps them and the backward runs.
    call = host.prepared(host.case(op, "32x4096"), grad=True)
    with launcher.recording() as launches:
        call()
    assert len(launches) == 3
