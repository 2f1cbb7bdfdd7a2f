"""onnx-export-optimized: the onnx-export graph after ONNX Runtime's transformer optimizer, as deployed.

``onnxruntime.transformers.optimizer.optimize_model`` rewrites x + residual and the norm after it into
one com.microsoft SkipLayerNormalization (LayerNormalization) or SkipSimplifiedLayerNormalization
(RMSNorm's Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul, first fused into SimplifiedLayerNormalization),
whose fourth output is the sum, residual_out. Its fusions match (batch, sequence, hidden) activations
only, so a row case runs as a (1, rows, hidden) view. Results record the fused graph and the fusions
the optimizer reports; a case it fuses nothing in runs the export as it is, and says so. See
docs/onnx.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort  # type: ignore[import-untyped]  # ships no type information
from onnxruntime.transformers import optimizer  # type: ignore[import-untyped]  # ships no type information

from backends.common.ort_support import OrtPrepared
from backends.onnx.export import Info, OnnxExport, node_list
from conformance.adapter.backend import Capabilities, Inputs, Prepared, Unsupported
from conformance.model.case import ADD_OPS, Case

# "bert" and "gpt2" run the same layer-norm fusions (Gpt2OnnxModel subclasses BertOnnxModel and adds
# attention fusions only); "bert" needs no num_heads / hidden_size, which these graphs do not have.
MODEL_TYPE = "bert"
# optimize_model(opt_level=0): the Python fusions only, which is optimize_by_fusion (called directly:
# optimize_model also makes a temporary folder it leaves behind, a ResourceWarning, when a fusion
# raises). Level 1 first runs an ORT session on the CPU provider and fuses what it saves: there,
# float16 nodes without a CPU kernel come back between Casts (InsertCastTransformer) and Add +
# LayerNormalization no longer match, so a float16 model is left unfused; it also fails on a
# ModelProto whose constants feed shape inference (extract_raw_data_from_model moves ReduceMean's
# axes out of the model). ORT's own graph optimizations still run when the session loads the fused
# model (ORT_ENABLE_ALL). only_onnxruntime=True would skip the fusions this backend is for: ORT's
# C++ optimizer leaves Add + LayerNormalization apart when the sum is a graph output.
OPT_LEVEL = 0
# The fused ops, each with the op type of the norm it consumes.
FUSED = {"SkipLayerNormalization": "LayerNormalization", "SkipSimplifiedLayerNormalization": "RMSNorm"}
# Fusion.apply() reports each fusion it applied at INFO on this logger: "Fused <op>: <count>". The
# optimizer imports its modules by bare name (it puts its folder on sys.path), hence the bare name.
_FUSION_LOGGER = "fusion_base"
_FUSED = re.compile(r"Fused (?P<op>.+): (?P<count>\d+)$")
_OPTIMIZER_FOLDER = str(Path(optimizer.__file__).parent)


class _Report(logging.Handler):
    """The fusions the optimizer applies, in order, and the warnings its modules log meanwhile."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.fusions: dict[str, int] = {}
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        fused = _FUSED.match(message) if record.name == _FUSION_LOGGER else None
        if fused:
            self.fusions[fused["op"]] = self.fusions.get(fused["op"], 0) + int(fused["count"])
        elif record.levelno >= logging.WARNING and record.pathname.startswith(_OPTIMIZER_FOLDER):
            self.warnings.append(message)


@contextmanager
def _reporting() -> Iterator[_Report]:
    """Collect the optimizer's fusion counts (INFO, kept from other handlers) and its warnings."""
    report, root, fusion = _Report(), logging.getLogger(), logging.getLogger(_FUSION_LOGGER)
    level, propagate = fusion.level, fusion.propagate
    fusion.setLevel(logging.INFO)
    fusion.propagate = False
    fusion.addHandler(report)
    root.addHandler(report)
    try:
        yield report
    finally:
        root.removeHandler(report)
        fusion.removeHandler(report)
        fusion.setLevel(level)
        fusion.propagate = propagate


def optimize(model: onnx.ModelProto) -> tuple[onnx.ModelProto, _Report]:
    """The model after the optimizer's fusions (on a copy: they rewrite their argument), and what it
    reported."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with _reporting() as report:
        try:
            optimized = optimizer.optimize_by_fusion(copy, model_type=MODEL_TYPE)
        except (IndexError, ValueError) as error:
            # Fusions that assume the graphs they were written for: a LayerNormalization with a bias
            # (FusionSkipLayerNormalization reads node.input[2]), a ReduceMean over one axis
            # (FusionSimplifiedLayerNormalization tests `not axes` on a NumPy array). Raised there,
            # the optimizer cannot optimize the model; raised anywhere else, it is this adapter's bug.
            frame = traceback.extract_tb(error.__traceback__)[-1]
            if not frame.filename.startswith(_OPTIMIZER_FOLDER):
                raise
            raise Unsupported(
                f"onnxruntime {ort.__version__}'s transformer optimizer raises {type(error).__name__} in"
                f" {Path(frame.filename).name} ({frame.name}) on the exported graph ({node_list(model)}):"
                f" {error}"
            ) from error
    result: onnx.ModelProto = optimized.model
    return result, report


def _check_axes(case: Case, exported: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    """Unsupported where the optimizer fused a norm over several axes: its Skip*LayerNormalization
    normalizes the last axis only, and ORT rejects the graph when it runs."""
    skips = [node.op_type for node in fused.graph.node if node.op_type in FUSED]
    if case.norm_ndim == 1 or not skips:
        return
    axes = [
        onnx.helper.get_attribute_value(attribute)
        for node in exported.graph.node
        if node.op_type == "LayerNormalization"
        for attribute in node.attribute
        if attribute.name == "axis"
    ]
    raise Unsupported(
        f"onnxruntime {ort.__version__}'s transformer optimizer fused Add + LayerNormalization(axis="
        f"{axes[0] if axes else '?'}) over {case.norm_ndim} axes into {skips[0]}, dropping the axis;"
        " the kernel normalizes the last axis only and rejects the graph at run time ('gamma is"
        " expected to have 1 dimension')"
    )


class Reshaped:
    """A prepared case whose graph takes the activations in another shape (a view of the same rows):
    its outputs are read back in the case's shape."""

    def __init__(self, inner: OrtPrepared, shape: tuple[int, ...]) -> None:
        self._inner, self._shape = inner, shape

    def __call__(self) -> None:
        self._inner()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def outputs(self) -> dict[str, np.ndarray]:
        return {name: value.reshape(self._shape) for name, value in self._inner.outputs().items()}

    def info(self) -> Info:
        return self._inner.info()

    def __getattr__(self, name: str) -> object:
        # buffers(), where the session's Prepared reports them (the aliasing check): a view's bytes
        # are the same whatever its shape. Nothing else is forwarded.
        if name != "buffers":
            raise AttributeError(name)
        return getattr(self._inner, name)


class OnnxExportOptimized(OnnxExport):
    """The onnx-export graphs of the add ops after ORT's transformer optimizer; forward only."""

    name = "onnx-export-optimized"
    graph_kind = "optimized"

    def capabilities(self) -> Capabilities:
        caps = super().capabilities()
        notes = {
            **caps.notes,
            "optimizer": f"onnxruntime.transformers.optimizer.optimize_model(model_type={MODEL_TYPE!r},"
            f" opt_level={OPT_LEVEL}) (its optimize_by_fusion), then a session at"
            f" {caps.notes['graph_optimization_level']}",
            "shape": "row cases over one axis run as a (1, rows, hidden) view: the Skip*LayerNormalization"
            " fusions match (batch, sequence, hidden) activations only",
            "fusions": "results record the fused graph (info fused_graph), the fusions the optimizer"
            " reported (info fusions; 'none' where it fused nothing and the export runs as it is) and its"
            " warnings (info optimizer_warnings)",
            "ops": "the add ops: the fused residual add + norm is what this backend is for",
            "float64": "not declared: the com.microsoft Skip*LayerNormalization schemas take float32,"
            " float16 and bfloat16, and ORT rejects a fused float64 graph as INVALID_GRAPH (though the CPU"
            " provider registers double kernels for them)",
        }
        return dataclasses.replace(caps, ops=ADD_OPS, dtypes=caps.dtypes - {"float64"}, notes=notes)

    def graph_shape(self, case: Case) -> tuple[int, ...]:
        """Rows over one axis as (1, rows, hidden): a transformer's (batch, sequence, hidden), the only
        rank the fusions match; 3-D cases and norms over several axes keep the case's shape."""
        if case.norm_ndim != 1 or len(case.shape) == 3:
            return case.shape
        return (1, math.prod(case.shape[:-1]), case.shape[-1])

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        prepared = self.bind(case, inputs)
        return prepared if self.graph_shape(case) == case.shape else Reshaped(prepared, case.shape)

    def transform(self, case: Case, model: onnx.ModelProto) -> tuple[onnx.ModelProto, Info]:
        fused, report = optimize(model)
        _check_axes(case, model, fused)
        fusions = ",".join(f"{op}={count}" for op, count in report.fusions.items())
        info: Info = {
            "optimizer": f"optimize_model(model_type={MODEL_TYPE}, opt_level={OPT_LEVEL})",
            "fused_graph": node_list(fused),
            "fusions": fusions or "none: the optimizer fused nothing; the export runs as it is",
        }
        if report.warnings:
            info["optimizer_warnings"] = "; ".join(dict.fromkeys(report.warnings))
        return fused, info
