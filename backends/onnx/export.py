"""onnx-export: the torch-nn modules exported by torch.onnx.export(dynamo=True), run by ONNX Runtime.

Users see what their exported models compute: the exporter picks the graph (RMSNorm decomposes into
Pow/ReduceMean/Sqrt/... below opset 23 and becomes RMSNormalization at 23; GroupNorm is Reshape +
InstanceNormalization + Reshape + Mul/Add below opset 21 and GroupNormalization-21 from 21; InstanceNorm
is InstanceNormalization, and with running statistics in eval BatchNormalization over tiled
statistics; the add ops are x + residual then nn.RMSNorm / nn.LayerNorm, or AddNormWide for the
residual conventions of "residual in fp32" models and fused kernels). The opset comes from NORMCONF_ONNX_OPSET
(default 18; 21 or later for GroupNormalization): one variable for every op, so one run measures one
opset and results record it (info: opset, graph).
One export and one session serve every case of a signature: the batch and spatial dimensions are
dynamic and the module's parameters and buffers are lifted to graph inputs. See docs/onnx.md.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxscript
import torch
from onnx import helper
from torch import nn

from backends.common import ort_support as _ort
from backends.common import torch_support as common
from backends.common.translate import offset_scale
from backends.torch import modules as torch_modules
from backends.torch.modules import MODULES
from conformance.adapter import cache
from conformance.adapter.backend import (
    FEATURES,
    BackendUnavailable,
    Capabilities,
    Inputs,
    Prepared,
    Unsupported,
)
from conformance.model.case import (
    ADD_OPS,
    ADD_RMS_NORM,
    BATCH_NORM,
    CHANNEL_OPS,
    GROUP_NORM,
    INSTANCE_NORM,
    Case,
)
from conformance.model.dtypes import numpy_dtype
from conformance.model.inputs import make_inputs

OPSET_VARIABLE = "NORMCONF_ONNX_OPSET"
DEFAULT_OPSET = 18
# 18 is the dynamo exporter's base opset (lower ones go through a version converter); 23 is the newest
# torch 2.13's exporter targets, and the first with RMSNormalization.
OPSETS = range(18, 24)
# Example sizes for the dynamic dimensions at export: distinct, and never 0 or 1, which torch.export
# would specialize into constants.
_EXAMPLE_SIZES = (2, 3, 5, 7, 11, 13)


def opset() -> int:
    """The opset exports target: NORMCONF_ONNX_OPSET, else 18."""
    raw = os.environ.get(OPSET_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_OPSET
    value = int(raw) if raw.isdigit() else None
    if value is None or value not in OPSETS:
        raise BackendUnavailable(
            f"{OPSET_VARIABLE}={raw!r} is not allowed; allowed: an integer {OPSETS.start}..{OPSETS.stop - 1}"
            f" (default {DEFAULT_OPSET})"
        )
    return value


# The torch.nn op whose module normalizes each add op's sum.
ADD_NORMS = {ADD_RMS_NORM: "rms_norm", "add_layer_norm": "layer_norm"}


class AddNorm(nn.Module):
    """An add op as torch-nn composes it: x + residual in the activation dtype, then the norm module."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = x + residual
        y: torch.Tensor = self.norm(total)
        return y, total


@dataclass(frozen=True)
class Stream:
    """An add op's residual conventions in torch dtypes: the sum's dtype, the stored residual_out's
    (the stream's), and whether the norm reads the sum before it is stored (norm_input "exact")."""

    total: torch.dtype
    stored: torch.dtype
    exact: bool


def stream(case: Case) -> Stream | None:
    """The conventions of an add case beyond torch-nn's composition, or None (x + residual in the
    activation dtype, the norm reading that stored sum): the sum in float32, or wider where x or the
    stream is (float64)."""
    if case.residual_dtype is None and case.norm_input == "rounded":
        return None
    activation, stored = common.torch_dtype(case.dtype), common.torch_dtype(case.stream_dtype)
    total = torch.promote_types(torch.promote_types(activation, stored), torch.float32)
    return Stream(total, stored, case.norm_input == "exact")


class AddNormWide(nn.Module):
    """An add op with the residual conventions of "residual in fp32" models and fused kernels:
    h = x.float() + residual.float(); residual_out = h stored in the stream's dtype; the norm, in its
    module's dtype (the parameters', widened to the sum's), reads the stored value ("rounded") or h
    itself ("exact"); y is rounded once to x's dtype."""

    def __init__(self, norm: nn.Module, conventions: Stream, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm, self.conventions, self.dtype = norm, conventions, dtype

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        wide = self.conventions
        total = x.to(wide.total) + residual.to(wide.total)
        stored = total.to(wide.stored)
        y: torch.Tensor = self.norm((total if wide.exact else stored).to(self.dtype))
        return y.to(x.dtype), stored


def module_dtype(case: Case, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the case's module: the parameters' ``dtype``, widened to the sum's for AddNormWide
    (its weights then hold the parameters exactly)."""
    conventions = stream(case) if case.op in ADD_OPS else None
    return dtype if conventions is None else torch.promote_types(dtype, conventions.total)


Info = dict[str, str | int | float | bool]


@dataclass(frozen=True)
class Exported:
    """One export's session, its graph outputs, and what its results record."""

    session: object
    outputs: tuple[str, ...]  # graph output names, in the order of forward's results
    info: Info


# Exports done in this process and the seconds each took (the closing note's count and time).
EXPORT_SECONDS: list[float] = []
# The cache subfolder of exports, and the version of its entries' layout (bumped when it changes).
EXPORT_CACHE = "onnx-export"
# How long a prepare waits for an export another process is making (seconds; one takes ~1 here).
CLAIM_WAIT_S = 120.0
EXPORT_CACHE_FORMAT = 1


def _module(case: Case, dtype: torch.dtype) -> nn.Module:
    # torch-nn's modules (GroupNorm and InstanceNorm included), every argument explicit.
    module = MODULES[ADD_NORMS.get(case.op, case.op)](case, dtype, torch.device("cpu"))
    if case.op not in ADD_OPS:
        return module
    conventions = stream(case)
    return AddNorm(module) if conventions is None else AddNormWide(module, conventions, dtype)


def _state_names(case: Case) -> dict[str, str]:
    """Case input name -> the module's state name, for the parameters and buffers the export reads."""
    prefix = "norm." if case.op in ADD_OPS else ""
    names = {}
    if case.weight or case.bias:
        names["weight"] = prefix + "weight"  # torch.nn's one affine switch: a bias-only case has ones
    if case.bias:
        names["bias"] = prefix + "bias"
    if case.track_running_stats:
        names.update(running_mean="running_mean", running_var="running_var")
    return names


def _examples(
    case: Case, shape: tuple[int, ...]
) -> tuple[tuple[torch.Tensor, ...], tuple[dict[int, Any], ...]]:
    """Example activations (x, and residual in the stream's dtype) of the graph's ``shape``, every
    dimension the parameters do not fix dynamic, and their dynamic_shapes."""
    fixed = {1} if case.op in CHANNEL_OPS else set(range(len(shape) - case.norm_ndim, len(shape)))
    dims = {i: torch.export.Dim(f"d{i}") for i in range(len(shape)) if i not in fixed}
    sizes = iter(_EXAMPLE_SIZES)
    example = [shape[i] if i in fixed else next(sizes) for i in range(len(shape))]
    dtypes = (case.dtype, case.stream_dtype) if case.op in ADD_OPS else (case.dtype,)
    # Distinct tensors: torch.export merges an input passed twice into one graph input.
    examples = tuple(torch.randn(example, dtype=torch.float64).to(common.torch_dtype(d)) for d in dtypes)
    return examples, (dims,) * len(dtypes)


class Functional(nn.Module):
    """The module with its parameters and buffers as forward arguments (torch.func.functional_call).

    The export then keeps them as graph inputs: one session serves every case of a signature, and
    the exporter's optimizer cannot fold them into constants (it folds weight.float() of a constant
    weight, for one). The ops are the module's own.
    """

    def __init__(self, module: nn.Module, state: tuple[str, ...], activations: int) -> None:
        super().__init__()
        self.module, self.state, self.activations = module, state, activations

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        values = dict(zip(self.state, args[self.activations :], strict=True))
        result: torch.Tensor | tuple[torch.Tensor, ...] = torch.func.functional_call(
            self.module, values, args[: self.activations]
        )
        return result


# torch.onnx.export(dynamo=True) builds its registry of torchlib functions on every call, reading the
# source of ~500 onnxscript functions: 60 % of an export of one norm module (0.55 of 0.9 s here). The
# registry depends on the opset and the library versions only, and an export without a
# custom_translation_table does not change it, so normconf's exports share one per opset; the
# models are byte for byte the ones a fresh registry gives (tests/backends/onnx/test_onnx_export.py).
# Where torch's internals differ (another torch), exports build their own as before.
@functools.cache
def _torchlib_registry(build: Callable[..., object], cls: type, *opset: int) -> object:
    return build(cls, *opset)


@contextmanager
def shared_registry() -> Iterator[None]:
    """While normconf exports, ``ONNXRegistry.from_torchlib`` returns one registry per opset."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        yield
        return
    registry: Any = getattr(_registration, "ONNXRegistry", None)
    original = vars(registry).get("from_torchlib") if isinstance(registry, type) else None
    if not isinstance(original, classmethod):
        yield
        return
    build = original.__func__

    def shared(cls: type, *args: Any, **kwargs: Any) -> object:
        opset = (*args, *kwargs.values())
        if cls is not registry or len(opset) > 1 or set(kwargs) - {"opset_version"}:
            return build(cls, *args, **kwargs)
        return _torchlib_registry(build, cls, *opset)

    registry.from_torchlib = classmethod(shared)
    try:
        yield
    finally:
        registry.from_torchlib = original


def _export(
    case: Case,
    dtype: torch.dtype,
    values: dict[str, np.ndarray],
    target: int,
    shape: tuple[int, ...] | None = None,
) -> onnx.ModelProto:
    """The case's module exported, its activations of ``shape`` (the case's unless given)."""
    names = _state_names(case)
    activations, dynamic = _examples(case, shape or case.shape)
    state = tuple(common.to_torch(values[name], torch.device("cpu")).to(dtype) for name in names)
    module = Functional(_module(case, dtype), tuple(names.values()), len(activations)).train(case.training)
    inputs = ["x", "residual"][: len(activations)] + list(names)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), shared_registry():
            # torch's exporter warns about its own internals (FutureWarnings of torch.utils._pytree)
            # and about exporting a module in training mode, which is the case's mode on purpose:
            # neither says anything about the case, which is judged from the graph produced.
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                (*activations, *state),
                dynamo=True,
                opset_version=target,
                input_names=inputs,
                # forward(*args) takes one structured argument: its shapes are one tuple.
                dynamic_shapes=((*dynamic, *(None for _ in state)),),
                verbose=False,
            )
    except torch.onnx.OnnxExporterError as error:
        if isinstance(_innermost(error), torch._dynamo.exc.UserError):
            raise  # the adapter called torch.export wrongly: its error, never the case's
        raise Unsupported(f"torch.onnx.export cannot express the case: {_summary(error)}") from error
    finally:
        EXPORT_SECONDS.append(time.perf_counter() - start)
    assert program is not None, "torch.onnx.export(dynamo=True) returns an ONNXProgram"
    model: onnx.ModelProto = program.model_proto
    return model


def node_list(model: onnx.ModelProto) -> str:
    """The graph's distinct node types in order, "+"-joined; a non-ONNX domain prefixes its ops."""
    names = (f"{node.domain}.{node.op_type}" if node.domain else node.op_type for node in model.graph.node)
    return "+".join(dict.fromkeys(names))


def _innermost(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def _summary(error: BaseException) -> str:
    """The first line of the innermost cause: what the exporter could not do, without its advice."""
    cause = _innermost(error)
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"


def _source() -> str:
    """The code an export's module comes from (this module's wrappers and export call, torch-nn's
    modules): part of a cached export's key, so that a new normconf, or an edit of either, exports again."""
    return cache.sources(sys.modules[__name__], torch_modules)


def _export_key(case: Case, dtype: torch.dtype, target: int) -> tuple[object, ...]:
    """What an export depends on besides the graph's rank: leading dimensions and parameter values
    are run-time inputs."""
    key: tuple[object, ...] = (case.op, case.dtype, str(dtype), case.param_shape)
    key += (case.norm_ndim, case.weight, case.bias, case.eps, case.training, case.momentum, target)
    return (*key, case.num_groups, case.track_running_stats, case.residual_dtype, case.norm_input)


def _checked(case: Case, model: onnx.ModelProto) -> onnx.ModelProto:
    """The export, or Unsupported where it cannot show the case's results or ONNX's checker rejects it."""
    _check_outputs(case, model)
    _check_valid(model)
    return model


def _check_outputs(case: Case, model: onnx.ModelProto) -> tuple[str, ...]:
    """The graph outputs, or Unsupported when the export cannot show the case's results."""
    outputs = tuple(o.name for o in model.graph.output)
    wanted = 2 if case.op in ADD_OPS else 3 if case.training else 1
    if len(outputs) == wanted:
        return outputs
    modes = [
        helper.get_attribute_value(a)
        for node in model.graph.node
        if node.op_type == "BatchNormalization"
        for a in node.attribute
        if a.name == "training_mode"
    ]
    computes = {
        BATCH_NORM: f"BatchNormalization with training_mode={modes[0] if modes else 0}, which normalizes"
        " with the running statistics and updates none",
        INSTANCE_NORM: f"{'+'.join(dict.fromkeys(n.op_type for n in model.graph.node))}, which normalizes"
        " with the instance statistics and updates none",
    }
    raise Unsupported(
        f"the export of a training-mode torch.nn {_CLASSES[case.op]} has graph outputs {list(outputs)}, not"
        f" y and the updated running statistics: torch.onnx (onnxscript {onnxscript.__version__}) exports"
        f" it as {computes[case.op]}"
    )


_CLASSES = {BATCH_NORM: "BatchNorm", "instance_norm": "InstanceNorm with track_running_stats"}


def _check_valid(model: onnx.ModelProto) -> None:
    """Unsupported when the exporter emits a model ONNX's own checker rejects (ORT would refuse it too)."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise Unsupported(
            f"torch.onnx.export emits a model that fails the ONNX checker: {_summary(error)}"
        ) from error


class OnnxExport:
    """torch.nn modules exported with torch.onnx.export(dynamo=True) and run by ONNX Runtime; forward only."""

    name = "onnx-export"
    graph_kind = "exported"  # what the session runs, for its messages

    def __init__(self) -> None:
        self._cache = _ort.Cache()

    def target_opset(self) -> int:
        """The opset exports target: NORMCONF_ONNX_OPSET, else 18."""
        return opset()

    def capabilities(self) -> Capabilities:
        target = self.target_opset()
        return _ort.capabilities(
            # ONNX tensors have no memory format: a channels_last case would export the contiguous graph.
            frozenset(FEATURES) - {"backward", "channels_last"},
            {
                "opset": f"{target} ({OPSET_VARIABLE}, default {DEFAULT_OPSET}, allowed {OPSETS.start}.."
                f"{OPSETS.stop - 1})",
                "exporter": f"torch.onnx.export(dynamo=True), torch {torch.__version__}, onnxscript"
                f" {onnxscript.__version__}",
                "training": "BatchNorm and InstanceNorm (track_running_stats) in training mode are"
                " Unsupported where the export has no running-statistics outputs (torch 2.13 exports"
                " BatchNorm in inference form, InstanceNorm as InstanceNormalization)",
                GROUP_NORM: "Reshape+InstanceNormalization+Reshape+Mul+Add below opset 21,"
                " GroupNormalization-21 from 21 (NORMCONF_ONNX_OPSET); results record the graph",
                "channels_last": "not declared: ONNX tensors have no memory format",
                "residual": "add ops: x + residual in the activation dtype, then the torch.nn norm; with"
                " residual_dtype or norm_input 'exact' the module sums in float32, stores residual_out in"
                " the stream's dtype, normalizes the stored or the unrounded sum in float32 (parameters"
                " widened exactly) and rounds y once to x's dtype",
            },
            ops=_ort.OPS | ADD_OPS,
        )

    def graph_shape(self, case: Case) -> tuple[int, ...]:
        """The shape the graph takes the case's activations in: the case's own."""
        return case.shape

    def transform(self, case: Case, model: onnx.ModelProto) -> tuple[onnx.ModelProto, Info]:
        """The model the session runs, and what results record of the step: the export, unchanged."""
        return model, {}

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        return self.bind(case, inputs)

    def _module_values(self, case: Case, inputs: Inputs) -> tuple[torch.dtype, dict[str, np.ndarray]]:
        """The module's dtype, and its state as fed: in that dtype (widening is exact), as the
        graph's inputs are typed."""
        values = _values(case, inputs)
        weights = str(values["weight"].dtype) if "weight" in values else case.weight_dtype
        dtype = module_dtype(case, common.torch_dtype(weights))
        values = {
            name: value.astype(numpy_dtype(str(dtype).removeprefix("torch.")))
            for name, value in values.items()
        }
        return dtype, values

    def bind(self, case: Case, inputs: Inputs) -> _ort.OrtPrepared:
        """The case's session (exported once per signature) with its inputs and outputs bound."""
        target = self.target_opset()
        dtype, values = self._module_values(case, inputs)
        key = (*_export_key(case, dtype, target), len(case.shape))
        exported, hit = self._cache.get(key, lambda: self._build(case, dtype, values, target))
        assert isinstance(exported, Exported), "the cache holds Exported entries"
        shape = self.graph_shape(case)
        # Graph inputs carry the case's names (input_names at export): x, residual, then the state.
        feeds = {name: inputs[name].reshape(shape) for name in ("x", "residual") if name in inputs}
        feeds |= {name: values[name] for name in _state_names(case)}
        names = ("y", "residual_out") if case.op in ADD_OPS else ("y", "running_mean", "running_var")
        dtypes = _ort.output_dtypes(exported.session)
        # Outputs in the order of the module's results (y, residual_out); a training export, were it
        # ever to keep its running statistics, would be read as (y, running_mean, running_var) and
        # fail its checks, never pass, if the exporter ordered them otherwise.
        bound = tuple(
            _ort.Bound(
                name, graph, shape if name in ("y", "residual_out") else case.param_shape, dtypes[graph]
            )
            for name, graph in zip(names, exported.outputs, strict=False)
        )
        # compile_s: what this prepare() spent exporting and building the session, 0 when cached.
        info = {**exported.info, "cached": hit, **({"compile_s": 0.0} if hit else {})}
        return _ort.OrtPrepared(exported.session, feeds, bound, info)

    def _build(self, case: Case, dtype: torch.dtype, values: dict[str, np.ndarray], target: int) -> Exported:
        start = time.perf_counter()
        model, source, waited = self._exported(case, dtype, values, target)
        start += waited  # waiting for another process's export (and building while waiting) is not its own
        export_s = EXPORT_SECONDS[-1] if source == "exported" else 0.0
        outputs = _check_outputs(case, model)
        ops = node_list(model)
        model, steps = self.transform(case, model)
        what = f"the {self.graph_kind} graph ({node_list(model)}, opset {target}) with x {case.dtype}"
        sess = _ort.session(model, what)
        info = {**_ort.session_info(sess), "opset": target, "graph": ops, "export_s": round(export_s, 3)}
        info |= {"torch": str(torch.__version__), "onnxscript": str(onnxscript.__version__), **steps}
        info |= {"export": source, "compile_s": round(time.perf_counter() - start, 4)}
        return Exported(sess, outputs, info)

    def _exported(
        self, case: Case, dtype: torch.dtype, values: dict[str, np.ndarray], target: int
    ) -> tuple[onnx.ModelProto, str, float]:
        """The case's export, checked, and where it came from: "exported" in this process, or
        "disk cache" where an earlier run or another worker exported the same graph (conformance's
        cache folder, keyed by what the export depends on and the library versions). Every export
        backend with the same key (onnx-export, onnx-export-optimized at one rank) shares the entry:
        the graph is the exporter's, whichever backend asked for it; and the seconds it waited for
        another process exporting it."""
        shape = self.graph_shape(case)
        entry = self._entry(case, dtype, target)
        if entry is None:
            return _checked(case, _export(case, dtype, values, target, shape)), "exported", 0.0
        cached = _load(entry)
        if cached is not None:
            return cached, "disk cache", 0.0
        # Waits while a precompiling process exports this graph, then reads its entry; a stuck one
        # costs an export here, never the case.
        start = time.perf_counter()
        with cache.claim(entry.with_suffix(".lock"), wait=CLAIM_WAIT_S):
            waited = time.perf_counter() - start
            cached = _load(entry)
            if cached is not None:
                return cached, "disk cache", waited
            model = _store(entry, lambda: _checked(case, _export(case, dtype, values, target, shape)))
            return model, "exported", waited

    def _entry(self, case: Case, dtype: torch.dtype, target: int) -> Path | None:
        """The graph cache's name of this export, without suffix (None without a cache)."""
        where = cache.folder(EXPORT_CACHE)
        if where is None:
            return None
        versions = (torch.__version__, onnxscript.__version__, onnx.__version__)
        shape = self.graph_shape(case)
        return where / cache.digest(
            EXPORT_CACHE_FORMAT, versions, _source(), _export_key(case, dtype, target), len(shape)
        )

    def precompile(self, case: Case, *, grad: bool) -> str:
        """Export ``case``'s graph into the graph cache ahead of the run (in the process ahead, or in
        the run while it waits: conformance/running/precompile.py), as prepare() would export it.
        'built', or why not: 'cached' (exported before, or refused), 'claimed' (a process is exporting
        it), 'skipped' (no graph cache, or the exporter refuses it)."""
        dtype, values = self._module_values(case, make_inputs(case))
        target = self.target_opset()
        entry = self._entry(case, dtype, target)
        if entry is None:
            return "skipped"
        with cache.claim(entry.with_suffix(".lock")) as held:
            if not held:
                return "claimed"
            if entry.with_suffix(".onnx").exists() or entry.with_suffix(".unsupported").exists():
                return "cached"
            shape = self.graph_shape(case)
            try:
                _store(entry, lambda: _checked(case, _export(case, dtype, values, target, shape)))
            except Unsupported:
                return "skipped"
            return "built"


def _load(entry: Path) -> onnx.ModelProto | None:
    """A cached export (raising Unsupported for a cached refusal), or None when there is none."""
    refused = cache.load(entry.with_suffix(".unsupported"))
    if refused is not None:
        raise Unsupported(refused.decode())
    data = cache.load(entry.with_suffix(".onnx"))
    if data is None:
        return None
    try:
        return onnx.load_model_from_string(data)
    except Exception:  # a damaged entry (protobuf's DecodeError, ...): export it again
        return None


def _store(entry: Path, export: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
    """``export()``'s model, stored whole under ``entry``; a refusal is stored too, then raised."""
    try:
        model = export()
    except Unsupported as exc:
        cache.store(entry.with_suffix(".unsupported"), str(exc).encode())
        raise
    cache.store(entry.with_suffix(".onnx"), model.SerializeToString())
    return model


def _values(case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
    """Parameter and buffer values as torch-nn loads them: Gemma's 1 + w held exactly (widening the
    module's dtype when needed), and ones for the weight torch.nn keeps when only a bias is asked."""
    values = {
        name: inputs[name] for name in ("weight", "bias", "running_mean", "running_var") if name in inputs
    }
    if case.weight_offset:
        values["weight"] = offset_scale(inputs["weight"], case.weight_offset, case.weight_dtype)
    elif "weight" in _state_names(case) and not case.weight:
        values["weight"] = np.ones(case.param_shape, numpy_dtype(case.weight_dtype))
    return values


class OnnxExportOpset21(OnnxExport):
    """The export at opset 21, where GroupNorm becomes one GroupNormalization-21 node, run beside the
    default opset-18 export; only group_norm, the op whose exported graph differs between the two."""

    name = "onnx-export-opset21"

    def target_opset(self) -> int:
        return 21

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), ops=frozenset({"group_norm"}))
