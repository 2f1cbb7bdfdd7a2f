"""torch-compile: the torch.nn modules' computations through torch.compile (inductor), forward and backward.

torch.nn.LayerNorm / RMSNorm / BatchNorm / GroupNorm / InstanceNorm call F.layer_norm / F.rms_norm /
F.batch_norm / F.group_norm / F.instance_norm with their parameters; here those calls are compiled
with ``dynamic=True`` (sizes symbolic, the normalized shape read from x) and ``fullgraph=True`` (a
graph break is an error, never a silent eager fallback). One
compiled function per (op, dtype, parameter signature, grad) serves every shape of that key; eps (an
aten constant) and size-1 dims still specialize, each a guarded recompile inside the key. Compilation
happens in prepare() (its first call, never timed) and is reported by info().

Inductor picks a graph's kernels with the sizes of the call that compiled it as hints, and its on-disk
FX graph cache then serves those kernels to every later shape and run: a float16 LayerNorm backward
compiled on an 8 x 7 case computes dx ~70x more accurately on offset rows than one compiled on
12 x 100. So that a case's result depends on the case alone, every graph is compiled on a canonical
shape first (the case's rank and size-1 dims, fixed other sizes; see _canonical), and the adapter
keeps its own cache directory, written only by such compiles (see _cache_dir).

The add ops compile x + residual with the norm as one graph, the sum formed as the case's convention
asks (as ``_torch_common.Residual`` forms it eagerly). Inductor may fuse the add into the norm and keep
the sum in float32 registers where the composition stores and rereads it in half precision: each
forward result's ``sum_normalized`` says which sum the graph normalized on the case's own rows
(conformance.fingerprint.sums, asked of every backend).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from backends.common import device_timing
from backends.common import torch_support as common
from backends.common.translate import offset_scale
from conformance.adapter import cache
from conformance.adapter.backend import (
    FEATURES,
    BackendUnavailable,
    Capabilities,
    Inputs,
    Outputs,
    Prepared,
    Unsupported,
)
from conformance.model.case import (
    ADD_LAYER_NORM,
    ADD_OPS,
    ADD_RMS_NORM,
    BATCH_NORM,
    GROUP_NORM,
    GROUP_OPS,
    INSTANCE_NORM,
    LAYER_NORM,
    RMS_NORM,
    Case,
)
from conformance.model.inputs import make_inputs

# BatchNorm's ci grid alone is ~136 separate inductor graphs (layouts x train/eval x momentum and eps
# constants x dtypes x grad), minutes of C++ compilation on a small machine; GroupNorm/InstanceNorm's
# is ~280 (num_groups, memory layouts, InstanceNorm's modes and momenta, affine variants, dtypes, eps
# constants, grad), about two graphs per case, each seconds of C++ compilation: declared only on request.
OPS_VARIABLE = "NORMCONF_TORCH_COMPILE_OPS"
DEFAULT_OPS = frozenset({"layer_norm", "rms_norm", "add_rms_norm", "add_layer_norm"})
# Recompiles one key may take (eps values x size-1 specializations); past it dynamo raises instead of
# silently running eager, so a case is compiled or it is an error.
RECOMPILE_LIMIT = 64
# How long a prepare waits for a graph another process is compiling (seconds; one takes 2-10 here).
CLAIM_WAIT_S = 120.0


def _recompile_limits() -> dict[str, Any]:
    """The recompile limit, failing when hit, under the names of the installed torch (torch 2.6 calls
    them cache_size_limit and fail_on_cache_limit_hit; later releases renamed them)."""
    config = torch._dynamo.config
    if hasattr(config, "recompile_limit"):
        return {"recompile_limit": RECOMPILE_LIMIT, "fail_on_recompile_limit_hit": True}
    return {"cache_size_limit": RECOMPILE_LIMIT, "fail_on_cache_limit_hit": True}


NOTES = {
    "compile": "torch.compile(backend='inductor', dynamic=True, fullgraph=True); one compiled function"
    " per (op, dtype, parameter signature, grad) shared by every shape; eps and size-1 dims recompile",
    "info": "compile_s (canonical compile + first call of a prepare that compiled; 0 when cached),"
    " graphs_compiled, compile_key, compiled_on (the canonical shape the graph was compiled on)",
    "ops": f"{OPS_VARIABLE} (default layer_norm,rms_norm,add_rms_norm,add_layer_norm; 'all' adds"
    " batch_norm, group_norm and instance_norm, whose ci grids are ~136 and ~280 more inductor graphs)",
}


def _layer_norm(x: torch.Tensor, weight: Any, bias: Any, eps: float, ndim: int) -> torch.Tensor:
    return F.layer_norm(x, x.shape[x.dim() - ndim :], weight, bias, eps)


def _rms_norm(x: torch.Tensor, weight: Any, eps: float, ndim: int) -> torch.Tensor:
    return F.rms_norm(x, x.shape[x.dim() - ndim :], weight, eps)


def _residual_sum(
    x: torch.Tensor, residual: torch.Tensor, stream: torch.dtype, wide: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(what the norm reads, residual_out): the stored sum for both, or with ``wide`` the sum formed
    in that dtype, rounded to the stream dtype only for residual_out (see _torch_common.Residual)."""
    if wide is None:
        stored = (x + residual).to(stream)
        return stored, stored
    total = x.to(wide) + residual.to(wide)
    return total, total.to(stream)


def _add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Any,
    eps: float,
    ndim: int,
    stream: torch.dtype,
    wide: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # One graph: inductor fuses the residual add into the normalization (the fused variant). y in the
    # activation dtype: a float32 stream or sum (or float32 parameters) makes the norm's result float32.
    h, stored = _residual_sum(x, residual, stream, wide)
    return F.rms_norm(h, h.shape[h.dim() - ndim :], weight, eps).to(x.dtype), stored


def _add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Any,
    bias: Any,
    eps: float,
    ndim: int,
    stream: torch.dtype,
    wide: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # As _add_rms_norm, with nn.LayerNorm's F.layer_norm.
    h, stored = _residual_sum(x, residual, stream, wide)
    return F.layer_norm(h, h.shape[h.dim() - ndim :], weight, bias, eps).to(x.dtype), stored


def _batch_norm(
    x: torch.Tensor, mean: Any, var: Any, weight: Any, bias: Any, training: bool, momentum: float, eps: float
) -> torch.Tensor:
    return F.batch_norm(x, mean, var, weight, bias, training, momentum, eps)


def _group_norm(x: torch.Tensor, weight: Any, bias: Any, eps: float, num_groups: int) -> torch.Tensor:
    # dynamo specializes num_groups (a guard on its value), so it is part of the compile key.
    return F.group_norm(x, num_groups, weight, bias, eps)


def _instance_norm(
    x: torch.Tensor,
    mean: Any,
    var: Any,
    weight: Any,
    bias: Any,
    use_input_stats: bool,
    momentum: float,
    eps: float,
) -> torch.Tensor:
    return F.instance_norm(x, mean, var, weight, bias, use_input_stats, momentum, eps)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    LAYER_NORM: _layer_norm,
    RMS_NORM: _rms_norm,
    ADD_RMS_NORM: _add_rms_norm,
    ADD_LAYER_NORM: _add_layer_norm,
    BATCH_NORM: _batch_norm,
    GROUP_NORM: _group_norm,
    INSTANCE_NORM: _instance_norm,
}


# Sizes a canonical case gives the dims that are not 1: the normalized dims (BatchNorm's channel dim)
# take the first, the others the second. Distinct within a tuple, so dynamo's duck sizing assumes no
# two dims equal; multiples of every CPU vector width, as LLM hidden sizes are.
CANONICAL_FEATURES = (64, 80, 96)
CANONICAL_ROWS = (8, 12, 20, 28, 36)
CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
# Bumped whenever the canonical shapes change, so no kernel compiled under other hints is served.
CACHE_SUBDIR = "normconf-torch-compile-1"


def _canonical(case: Case) -> Case:
    """The case on which its graph is compiled: same fields, rank and size-1 dims, canonical sizes."""
    if case.op in GROUP_OPS:
        return _canonical_groups(case)
    fixed = {1} if case.op == BATCH_NORM else set(range(len(case.shape) - case.norm_ndim, len(case.shape)))
    features, rows = iter(CANONICAL_FEATURES), iter(CANONICAL_ROWS)
    shape = tuple(
        1 if size == 1 else next(features) if i in fixed else next(rows) for i, size in enumerate(case.shape)
    )
    return dataclasses.replace(case, shape=shape, dist="normal", seed=0)


def _canonical_groups(case: Case) -> Case:
    """GroupNorm/InstanceNorm: the batch and spatial dims take the canonical row sizes; InstanceNorm's
    channels the first feature size. GroupNorm keeps num_groups (dynamo specializes it, so it is in
    the key) and C = G where the case has one channel per group (then C // G = 1 is specialized too),
    else the smallest multiple 2G.. of G that no other canonical dim has (duck sizing would otherwise
    tie the two)."""
    rows = iter(CANONICAL_ROWS)
    shape = [1 if size == 1 else next(rows) for size in (case.shape[0], *case.shape[2:])]
    channels = case.shape[1]
    if case.op == INSTANCE_NORM:
        channels = 1 if channels == 1 else CANONICAL_FEATURES[0]
    elif channels != case.groups:
        channels = next(k * case.groups for k in itertools.count(2) if k * case.groups not in CANONICAL_ROWS)
    return dataclasses.replace(case, shape=(shape[0], channels, *shape[1:]), dist="normal", seed=0)


def _cache_dir() -> str:
    """Point inductor's caches (its FX graph, AOTAutograd and kernel caches) at a folder only canonical
    compiles write: kernels compiled elsewhere under other size hints would otherwise be served for the
    same graph. That folder is in normconf's graph cache (``--graph-cache``, conformance.adapter.cache)
    under the torch version, so a second run loads what the first compiled; with the graph cache off,
    a subfolder of inductor's usual one (``TORCHINDUCTOR_CACHE_DIR`` or inductor's default)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    own = cache.folder(f"torch-compile/torch-{torch.__version__}")
    base = str(own) if own is not None else os.environ.get(CACHE_VARIABLE) or default_cache_dir()
    if os.path.basename(os.path.normpath(base)) != CACHE_SUBDIR:
        os.environ[CACHE_VARIABLE] = os.path.join(base, CACHE_SUBDIR)
    return os.environ[CACHE_VARIABLE]


def _signature(t: common.Tensors) -> str:
    """dtype (or '-') of every tensor argument, plus the rank of x."""
    parts = [f"rank{t.x.dim()}"]
    tensors = t.given()
    for name in ("x", "residual", "weight", "bias", "running_mean", "running_var"):
        value = tensors.get(name)
        parts.append(f"{name}:{'-' if value is None else str(value.dtype).removeprefix('torch.')}")
    return ",".join(parts)


def _fresh(fn: Callable[..., Any], tag: int) -> Callable[..., Any]:
    """A copy of ``fn`` with its own code object: dynamo keeps its cache (and recompile count) per
    code object, so each key gets its own instead of every key piling onto one list of guards."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}", co_qualname=f"{fn.__qualname__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _row_forward(case: Case, t: common.Tensors, fn: Callable[..., Any]) -> common.Forward:
    """The forward call of a LayerNorm / RMSNorm / add+RMSNorm case on ``fn``."""
    if case.op == LAYER_NORM:
        return lambda: fn(t.x, t.weight, t.bias, case.eps, case.norm_ndim)
    if case.op == RMS_NORM:
        return lambda: fn(t.x, t.weight, case.eps, case.norm_ndim)
    residual = t.residual
    assert residual is not None, f"{case.op} inputs lack the residual"
    wide = common.norm_dtype(t.x.dtype, residual.stream, exact=True) if residual.exact else None
    params = (t.weight,) if case.op == ADD_RMS_NORM else (t.weight, t.bias)
    args = (t.x, residual.residual, *params, case.eps, case.norm_ndim, residual.stream, wide)

    def add_forward() -> torch.Tensor:
        y, residual.last = fn(*args)
        return y  # type: ignore[no-any-return]

    return add_forward


def _batch_norm_forward(
    case: Case, t: common.Tensors, fn: Callable[..., Any], count: torch.Tensor
) -> common.Forward:
    def forward() -> torch.Tensor:
        # torch.nn's momentum rule, outside the graph (a Python float the graph takes as a constant).
        factor = common.momentum_factor(case.momentum, count) if case.training else case.momentum or 0.0
        args = (t.x, t.running_mean, t.running_var, t.weight, t.bias, case.training, factor, case.eps)
        return fn(*args)  # type: ignore[no-any-return]

    return forward


def _group_norm_forward(case: Case, t: common.Tensors, fn: Callable[..., Any]) -> common.Forward:
    return lambda: fn(t.x, t.weight, t.bias, case.eps, case.groups)


def _instance_norm_forward(case: Case, t: common.Tensors, fn: Callable[..., Any]) -> common.Forward:
    # momentum None -> 1.0: exact for the one step of a call (common.first_step_momentum); a constant
    # of the graph, as eps is.
    momentum = common.first_step_momentum(case.momentum)
    args = (t.x, t.running_mean, t.running_var, t.weight, t.bias, case.uses_batch_stats, momentum, case.eps)
    return lambda: fn(*args)


def _instance_norm_stats(case: Case, t: common.Tensors) -> common.RunningStats | None:
    """The running statistics a training call updates in place (F.instance_norm keeps no batch count)."""
    if not case.training:
        return None
    assert t.running_mean is not None and t.running_var is not None, "training needs tracking"
    return common.RunningStats(t.running_mean, t.running_var, torch.zeros((), dtype=torch.long))


def _build(case: Case, t: common.Tensors, fn: Callable[..., Any]) -> common.TorchPrepared:
    """The Prepared of ``case`` on ``fn`` (compiled, or the plain function for torch's dtype probe)."""
    if case.op == GROUP_NORM:
        return common.library_prepared(case, t, _group_norm_forward(case, t, fn), t.weight, t.bias)
    if case.op == INSTANCE_NORM:
        forward, stats = _instance_norm_forward(case, t, fn), _instance_norm_stats(case, t)
        return common.library_prepared(case, t, forward, t.weight, t.bias, stats=stats)
    if case.op != BATCH_NORM:
        return common.library_prepared(case, t, _row_forward(case, t, fn), t.weight, t.bias)
    count = torch.zeros((), dtype=torch.long, device=t.x.device)  # torch.nn's num_batches_tracked
    stats = None
    if case.training:
        assert t.running_mean is not None and t.running_var is not None, "BN inputs lack stats"
        stats = common.RunningStats(t.running_mean, t.running_var, count)
    forward = _batch_norm_forward(case, t, fn, count)
    return common.library_prepared(case, t, forward, t.weight, t.bias, stats=stats)


def _eager(case: Case, t: common.Tensors) -> common.TorchPrepared:
    return _build(case, t, FUNCTIONS[case.op])


class CompiledPrepared:
    """A prepared torch case on a compiled function, warmed up (compiled) once at prepare time."""

    def __init__(self, inner: common.TorchPrepared, key: str) -> None:
        self._inner = inner
        self._key = key
        self._compile: dict[str, str | int | float | bool] = {}

    def warm_up(self, canonical: common.TorchPrepared | None, compiled_on: str) -> None:
        """The canonical case's call (when its graph is not compiled yet), then this case's first."""
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        with torch._dynamo.config.patch(_recompile_limits()):
            start = time.perf_counter()
            if canonical is not None:
                canonical()
                canonical.synchronize()
            first = time.perf_counter()
            self._inner()
            self._inner.synchronize()
            end = time.perf_counter()
        graphs = counters["stats"]["unique_graphs"] - before
        self._compile = {
            "compile_s": end - start if graphs else 0.0,
            "first_call_s": end - first,
            "graphs_compiled": graphs,
            "compile_key": self._key,
            "compiled_on": compiled_on,
        }

    def __call__(self) -> None:
        self._inner()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def device_timing(self) -> dict[str, float | str] | None:
        """The compiled call's kernels apart from the host's time (backends/common/device_timing.py)."""
        return device_timing.info(self, self._inner._device)

    def outputs(self) -> Outputs:
        return self._inner.outputs()

    def buffers(self) -> dict[str, torch.Tensor]:
        return self._inner.buffers()

    def info(self) -> dict[str, str | int | float | bool]:
        return {**self._inner.info(), **self._compile, "dynamic": True, "fullgraph": True}


def _tensors(case: Case, inputs: Inputs, grad: bool) -> common.Tensors:
    """The case's tensors, with Gemma's 1 + w formed and an add op's parameters widened to what its norm
    reads, as torch-nn's adapter does."""
    weight = None
    if case.weight_offset:
        weight = offset_scale(inputs["weight"], case.weight_offset, case.weight_dtype)
    return common.norm_params(common.to_device(case, inputs, grad=grad, weight=weight))


def declared_ops() -> frozenset[str]:
    """The ops to declare: ``NORMCONF_TORCH_COMPILE_OPS`` (a comma list or ``all``), else the row ops."""
    value = os.environ.get(OPS_VARIABLE, "").strip()
    if not value:
        return DEFAULT_OPS
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    if names == {"all"}:
        return frozenset(FUNCTIONS)
    if not names or not names <= set(FUNCTIONS):
        allowed = "all or a comma list of " + ", ".join(sorted(FUNCTIONS))
        raise BackendUnavailable(f"{OPS_VARIABLE}={value!r} is not allowed; allowed: {allowed}")
    return names


def _require_compiler(dev: torch.device) -> None:
    """Inductor writes C++ on the CPU and Triton on CUDA; without its toolchain nothing compiles."""
    if dev.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            raise BackendUnavailable("inductor needs triton on CUDA devices (pip install triton)")
        return
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as exc:  # which compiler, and why not, is inductor's to say
        raise BackendUnavailable(f"inductor needs a C++ compiler on the CPU: {exc}") from exc


class TorchCompile:
    """The torch.nn computations compiled by inductor, on CUDA when available, else on the CPU."""

    name = "torch-compile"

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str, bool, int, bool, str], Callable[..., Any]] = {}
        self._warmed: set[tuple[Case, bool]] = set()  # canonical cases already run, per grad
        self._cache = _cache_dir()  # before anything compiles

    def capabilities(self) -> Capabilities:
        _require_compiler(common.device())
        notes = {**common.LIBRARY_NOTES, **NOTES, "cache": self._cache}
        caps = common.capabilities(frozenset(FEATURES), notes)
        return dataclasses.replace(caps, ops=declared_ops())

    def _function(self, case: Case, t: common.Tensors, grad: bool) -> tuple[Callable[..., Any], str]:
        # dynamo guards on GroupNorm's num_groups (specialized) and on the strides a layout gives, so
        # each gets its own compiled function and canonical compile.
        extra = f"|layout={case.layout}" if case.op in GROUP_OPS else ""
        extra = f"|groups={case.groups}{extra}" if case.op == GROUP_NORM else extra
        extra = f"|sum={case.norm_input}" if case.op in ADD_OPS else extra
        key = (case.op, _signature(t), grad, case.norm_ndim, case.training, extra)
        if key not in self._compiled:
            fresh = _fresh(FUNCTIONS[case.op], len(self._compiled))
            self._compiled[key] = torch.compile(fresh, backend="inductor", dynamic=True, fullgraph=True)
        label = f"{case.op}|{key[1]}|grad={grad}|ndim={case.norm_ndim}|train={case.training}{extra}"
        return self._compiled[key], label

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        tensors = _tensors(case, inputs, grad)
        # torch's own (eager) verdict on a dtype mix: the compiled graph must not accept more than torch.nn.
        common.probe(_eager, case, tensors)
        fn, key = self._function(case, tensors, grad)
        canonical_case = _canonical(case)
        canonical = None
        if (canonical_case, grad) not in self._warmed:
            given = make_inputs(canonical_case, grad=grad)
            canonical = _build(canonical_case, _tensors(canonical_case, given, grad), fn)
            self._warmed.add((canonical_case, grad))
        prepared = CompiledPrepared(_build(case, tensors, fn), key)
        marker = self._marker(canonical_case, grad) if canonical is not None else None
        if marker is None:
            prepared.warm_up(canonical, "x".join(map(str, canonical_case.shape)))
            return prepared
        # Waits while a precompiling process builds this graph (its compile then loads from the cache),
        # but not forever: a stuck one costs a compile here, never the case.
        with cache.claim(marker, wait=CLAIM_WAIT_S):
            prepared.warm_up(canonical, "x".join(map(str, canonical_case.shape)))
            cache.store(marker.with_suffix(".done"), b"")
        return prepared

    def _marker(self, canonical_case: Case, grad: bool) -> Path | None:
        """The lock file of one canonical compile in the graph cache (None without a cache); a
        ``.done`` file beside it once the graph is in inductor's caches."""
        folder = cache.folder(f"torch-compile/torch-{torch.__version__}/claims")
        if folder is None:
            return None
        # Inductor's cache keys hold the device and the thread count too: a graph compiled under
        # others is another entry.
        where = (common.device().type, torch.get_num_threads())
        return folder / cache.digest(canonical_case.to_dict(), grad, where)

    def precompile(self, case: Case, *, grad: bool) -> str:
        """Compile ``case``'s canonical graph into the graph cache ahead of the run (in the process
        ahead, or in the run while it waits: conformance/running/precompile.py), exactly as
        prepare() would compile it, so the run's own compile loads it. 'built', or why not: 'cached'
        (compiled before), 'claimed' (a process is compiling it), 'skipped' (no graph cache, or
        torch rejects the dtype mix)."""
        canonical_case = _canonical(case)
        marker = self._marker(canonical_case, grad)
        if marker is None:
            return "skipped"
        if marker.with_suffix(".done").exists():
            return "cached"
        with cache.claim(marker) as held:
            if not held:
                return "claimed"
            if marker.with_suffix(".done").exists():
                return "cached"
            tensors = _tensors(canonical_case, make_inputs(canonical_case, grad=grad), grad)
            try:
                common.probe(_eager, canonical_case, tensors)
            except Unsupported:
                return "skipped"
            fn, _ = self._function(canonical_case, tensors, grad)
            built = _build(canonical_case, tensors, fn)
            with torch._dynamo.config.patch(_recompile_limits()):
                built()
                built.synchronize()
            cache.store(marker.with_suffix(".done"), b"")
            self._warmed.add((canonical_case, grad))
            return "built"

    def copy_kernel(self, nbytes: int) -> Prepared:
        return common.copy_kernel(nbytes)
