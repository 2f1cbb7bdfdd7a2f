"""The onnx-export-optimized adapter: which fusions ORT's transformer optimizer applies to the exported
add ops, the graphs it cannot optimize, and what the fused kernels compute."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from conformance import oracle
from conformance.adapter.backend import Unsupported
from conformance.model.case import Case
from conformance.model.dtypes import unit_roundoff
from conformance.model.inputs import make_inputs

ort_state = pytest.importorskip("onnxruntime.capi.onnxruntime_pybind11_state")
pytest.importorskip("onnxruntime.transformers")
pytest.importorskip("onnxscript")
optimized = pytest.importorskip("backends.onnx.optimized")
export = pytest.importorskip("backends.onnx.export")
_ort = pytest.importorskip("backends.common.ort_support")

CPU = _ort.provider() == "CPUExecutionProvider"


@pytest.fixture(scope="module")
def backend():
    # One backend for the module: its cache holds one export per signature.
    return optimized.OnnxExportOptimized()


def _run(backend, case):
    inputs = make_inputs(case, grad=False)
    prepared = backend.prepare(case, inputs, grad=False)
    prepared()
    return prepared, inputs


def _within(case, actual, expected, ulps):
    """Whether ``actual`` is within ``ulps`` units of y's dtype of ``expected``, relative to max(1, |y|)."""
    err = np.max(np.abs(actual.astype(np.float64) - expected))
    return err <= ulps * unit_roundoff(case.dtype) * max(1.0, np.max(np.abs(expected)))


@pytest.mark.parametrize(
    ("op", "fused", "fusions"),
    [
        ("add_layer_norm", "com.microsoft.SkipLayerNormalization", "SkipLayerNormalization=1"),
        # RMSNorm's Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul first becomes SimplifiedLayerNormalization,
        # which the Add in front of it then joins.
        (
            "add_rms_norm",
            "com.microsoft.SkipSimplifiedLayerNormalization",
            "SimplifiedLayerNormalization=1,SkipSimplifiedLayerNormalization=1",
        ),
    ],
)
def test_the_residual_add_and_the_norm_fuse_into_one_node(backend, op, fused, fusions):
    case = Case(op, (6, 40), "float32", 1e-5)
    prepared, inputs = _run(backend, case)
    info = prepared.info()
    assert info["graph"].startswith("Add+") and info["fused_graph"] == fused
    assert info["fusions"] == fusions and "optimizer_warnings" not in info
    outputs = prepared.outputs()
    # The fused node's fourth output is the sum: residual_out, in the case's shape again.
    assert np.array_equal(outputs["residual_out"], inputs["x"] + inputs["residual"])
    assert _within(case, outputs["y"], oracle.evaluate(case, inputs, grad=False)["y"], 8)


@pytest.mark.parametrize(
    ("shape", "norm_ndim", "graph_shape"),
    [
        ((6, 40), 1, (1, 6, 40)),
        ((2, 3, 5, 8), 1, (1, 30, 8)),
        ((2, 3, 16), 1, (2, 3, 16)),
        ((4, 6, 33), 2, None),
    ],
)
def test_rows_run_as_one_batch_of_one_sequence(backend, shape, norm_ndim, graph_shape):
    case = Case("add_layer_norm", shape, "float32", 1e-5, norm_ndim=norm_ndim)
    assert backend.graph_shape(case) == (graph_shape or shape)


def test_without_the_3d_view_nothing_fuses(monkeypatch):
    # The optimizer's shape check takes (batch, sequence, hidden) only: the case's own 2-D graph
    # keeps its Add and LayerNormalization.
    monkeypatch.setattr(optimized.OnnxExportOptimized, "graph_shape", export.OnnxExport.graph_shape)
    prepared, _ = _run(optimized.OnnxExportOptimized(), Case("add_layer_norm", (6, 40), "float32", 1e-5))
    assert prepared.info()["fused_graph"] == "Add+LayerNormalization"
    assert prepared.info()["fusions"].startswith("none")


def test_a_cast_between_the_add_and_rms_norm_keeps_them_apart(backend):
    # torch's RMSNorm computes a float16 input in float32: Add (float16), Cast, then the norm, which
    # fuses on its own; the Add stays outside.
    prepared, _ = _run(backend, Case("add_rms_norm", (6, 40), "float16", 1e-5))
    info = prepared.info()
    assert info["fused_graph"] == "Add+Cast+SimplifiedLayerNormalization"
    assert info["fusions"] == "SimplifiedLayerNormalization=1"


def test_a_large_eps_is_left_unfused_and_the_optimizer_says_why(backend):
    prepared, _ = _run(backend, Case("add_rms_norm", (16, 96), "float32", 0.01))
    info = prepared.info()
    assert info["fused_graph"] == info["graph"] and info["fusions"].startswith("none")
    assert "epsilon value is not expected" in info["optimizer_warnings"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_fused_layer_norm_normalizes_the_unrounded_sum(backend, dtype):
    # offset rows: the rounding of h to the activation dtype moves y by far more than a few ulps.
    # SkipLayerNormalization adds in float32 and normalizes that sum; only residual_out is rounded.
    case = Case("add_layer_norm", (4, 24), dtype, 1e-5, dist="offset")
    prepared, inputs = _run(backend, case)
    assert prepared.info()["fused_graph"] == "com.microsoft.SkipLayerNormalization"
    outputs = prepared.outputs()
    total = inputs["x"].astype(np.float64) + inputs["residual"].astype(np.float64)
    assert np.array_equal(outputs["residual_out"], total.astype(outputs["residual_out"].dtype))
    rounded = oracle.evaluate(case, inputs, grad=False)["y"]
    exact = oracle.evaluate(dataclasses.replace(case, norm_input="exact"), inputs, grad=False)["y"]
    assert _within(case, outputs["y"], exact, 2)
    assert not _within(case, outputs["y"], rounded, 2)


@pytest.mark.parametrize(
    ("norm_input", "residual_dtype", "fused"),
    [
        ("exact", None, "Cast+com.microsoft.SkipLayerNormalization"),
        ("rounded", "float32", "Cast+com.microsoft.SkipLayerNormalization"),
    ],
)
def test_the_residual_conventions_fuse_in_float32(backend, norm_input, residual_dtype, fused):
    case = Case(
        "add_layer_norm", (6, 40), "bfloat16", 1e-5, norm_input=norm_input, residual_dtype=residual_dtype
    )
    prepared, inputs = _run(backend, case)
    assert prepared.info()["fused_graph"] == fused
    outputs = prepared.outputs()
    assert str(outputs["residual_out"].dtype) == case.stream_dtype
    assert _within(case, outputs["y"], oracle.evaluate(case, inputs, grad=False)["y"], 2)


def test_a_layer_norm_over_two_axes_is_unsupported_because_the_fusion_drops_the_axis(backend):
    case = Case("add_layer_norm", (4, 6, 33), "float32", 1e-5, norm_ndim=2)
    with pytest.raises(
        Unsupported, match=r"LayerNormalization\(axis=-2\) over 2 axes into SkipLayerNormalization"
    ):
        _run(backend, case)


def test_the_fused_graph_of_two_axes_is_rejected_by_ort(backend):
    # The reason above, verified: the optimizer's graph fails in ORT's kernel.
    case = Case("add_layer_norm", (4, 6, 33), "float32", 1e-5, norm_ndim=2)
    inputs = make_inputs(case, grad=False)
    values = export._values(case, inputs)
    fused, report = optimized.optimize(export._export(case, torch.float32, values, 18))
    assert report.fusions == {"SkipLayerNormalization": 1}
    session = _ort.session(fused, "the fused graph")
    feeds = {
        "x": inputs["x"],
        "residual": inputs["residual"],
        "weight": values["weight"],
        "bias": values["bias"],
    }
    with pytest.raises(ort_state.InvalidArgument, match="gamma is expected to have 1 dimension, got 2"):
        session.run(None, feeds)


@pytest.mark.parametrize(
    ("case", "where"),
    [
        (
            Case("add_layer_norm", (8, 48), "float32", 1e-5, bias=False),
            r"IndexError in fusion_skiplayernorm\.py",
        ),
        (
            Case("add_rms_norm", (4, 6, 33), "float32", 1e-5, norm_ndim=2),
            r"ValueError in fusion_simplified_layernorm\.py",
        ),
    ],
)
def test_a_graph_the_optimizer_raises_on_is_unsupported_naming_where(backend, case, where):
    with pytest.raises(Unsupported, match=rf"transformer optimizer raises {where}"):
        _run(backend, case)


def test_optimize_leaves_its_argument_and_the_loggers_as_they_were():
    case = Case("add_rms_norm", (2, 3, 16), "float32", 1e-5)
    inputs = make_inputs(case, grad=False)
    model = export._export(case, torch.float32, export._values(case, inputs), 18)
    before = model.SerializeToString()
    fusion_logger = logging.getLogger("fusion_base")
    state = (fusion_logger.level, fusion_logger.propagate, list(fusion_logger.handlers))
    fused, report = optimized.optimize(model)
    assert model.SerializeToString() == before
    assert (fusion_logger.level, fusion_logger.propagate, list(fusion_logger.handlers)) == state
    assert report not in logging.getLogger().handlers
    assert export.node_list(fused) == "com.microsoft.SkipSimplifiedLayerNormalization"


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
def test_bfloat16_runs_fused_where_the_plain_export_has_no_add_kernel(backend):
    case = Case("add_layer_norm", (6, 40), "bfloat16", 1e-5)
    prepared, inputs = _run(backend, case)
    assert prepared.info()["fused_graph"] == "com.microsoft.SkipLayerNormalization"
    exact = oracle.evaluate(dataclasses.replace(case, norm_input="exact"), inputs, grad=False)["y"]
    assert _within(case, prepared.outputs()["y"], exact, 2)
    with pytest.raises(Unsupported, match=r"Add\(14\)"):
        _run(export.OnnxExport(), case)


def test_capabilities_are_the_add_ops_without_float64():
    caps = optimized.OnnxExportOptimized().capabilities()
    assert caps.ops == {"add_rms_norm", "add_layer_norm"}
    assert "float64" not in caps.dtypes and {"float32", "float16", "bfloat16"} <= caps.dtypes
    assert {"residual_dtype", "exact_sum"} <= caps.features and "backward" not in caps.features
