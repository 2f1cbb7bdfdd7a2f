"""The onnx-export adapter: opset selection, the export cache, what the exporter cannot express,
dtypes ORT has no kernel for, the graphs GroupNorm and InstanceNorm export to, and the add ops'
residual conventions."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest

from conformance import oracle
from conformance.adapter import cache
from conformance.adapter.backend import BackendUnavailable, Unsupported
from conformance.model.case import Case
from conformance.model.dtypes import unit_roundoff
from conformance.model.inputs import make_inputs

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
export = pytest.importorskip("backends.onnx.export")
_ort = pytest.importorskip("backends.common.ort_support")

CPU = _ort.provider() == "CPUExecutionProvider"


def _prepare(backend, case):
    prepared = backend.prepare(case, make_inputs(case, grad=False), grad=False)
    prepared()
    return prepared


def test_opset_defaults_to_18(monkeypatch):
    monkeypatch.delenv(export.OPSET_VARIABLE, raising=False)
    assert export.opset() == 18
    monkeypatch.setenv(export.OPSET_VARIABLE, " 23 ")
    assert export.opset() == 23


@pytest.mark.parametrize("value", ["17", "24", "eighteen", "18.0", "-18"])
def test_a_bad_opset_makes_the_backend_unavailable_with_the_allowed_values(monkeypatch, value):
    monkeypatch.setenv(export.OPSET_VARIABLE, value)
    with pytest.raises(
        BackendUnavailable, match=rf"NORMCONF_ONNX_OPSET='{value}' is not allowed; allowed: .*18\.\.23"
    ):
        export.OnnxExport().capabilities()


def test_a_bad_opset_asked_for_by_name_is_a_usage_error(suite):
    run = suite("--backend", "onnx-export", env={export.OPSET_VARIABLE: "99"})
    assert run.returncode == 4
    assert "NORMCONF_ONNX_OPSET='99' is not allowed" in run.output


def test_one_export_serves_every_case_of_a_signature(monkeypatch):
    monkeypatch.delenv(export.OPSET_VARIABLE, raising=False)
    backend = export.OnnxExport()
    before = len(export.EXPORT_SECONDS)
    a = Case("layer_norm", (4, 32), "float32", 1e-5)
    b = Case("layer_norm", (9, 32), "float32", 1e-5, dist="offset", seed=2)
    infos = [_prepare(backend, case).info() for case in (a, b)]
    assert len(export.EXPORT_SECONDS) == before + 1
    assert [info["cached"] for info in infos] == [False, True]
    assert infos[0]["opset"] == 18 and infos[0]["graph"] == "LayerNormalization"
    assert infos[0]["export_s"] > 0 and infos[0]["execution_provider"]


def _raw_export(case: Case, opset: int = 18) -> bytes:
    import torch

    values = export._values(case, make_inputs(case, grad=False))
    return export._export(case, torch.float32, values, opset).SerializeToString()  # type: ignore[no-any-return]


def test_exports_sharing_one_registry_are_byte_for_byte_the_fresh_ones(monkeypatch):
    from torch.onnx._internal.exporter import _registration

    original = vars(_registration.ONNXRegistry)["from_torchlib"]
    cases = [
        Case("add_rms_norm", (4, 32), "float32", 1e-5),
        Case("group_norm", (2, 4, 3), "float32", 1e-5, num_groups=2),
    ]
    shared = [_raw_export(case, opset) for case in cases for opset in (18, 21)]
    assert vars(_registration.ONNXRegistry)["from_torchlib"] is original  # restored after each export
    assert export._torchlib_registry.cache_info().currsize >= 2  # one registry per opset was kept
    monkeypatch.setattr(export, "shared_registry", contextlib.nullcontext)
    fresh = [_raw_export(case, opset) for case in cases for opset in (18, 21)]
    assert shared == fresh


def test_a_second_run_loads_the_export_from_the_graph_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(export.OPSET_VARIABLE, raising=False)
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path))
    case = Case("rms_norm", (4, 32), "float32", 1e-5)
    first = _prepare(export.OnnxExport(), case)
    assert first.info()["export"] == "exported" and first.info()["compile_s"] > 0
    before = len(export.EXPORT_SECONDS)
    second = _prepare(export.OnnxExport(), case)  # a new process's backend: nothing in memory
    assert second.info()["export"] == "disk cache" and len(export.EXPORT_SECONDS) == before
    assert second.info()["graph"] == first.info()["graph"]
    np.testing.assert_array_equal(second.outputs()["y"], first.outputs()["y"])
    # onnx-export-optimized asks for a 3-D graph of the same rows: an export of its own, then shared.
    optimized = pytest.importorskip("backends.onnx.optimized")
    add = Case("add_rms_norm", (1, 4, 32), "float32", 1e-5)
    _prepare(export.OnnxExport(), add)
    before = len(export.EXPORT_SECONDS)
    assert _prepare(optimized.OnnxExportOptimized(), add).info()["export"] == "disk cache"
    assert len(export.EXPORT_SECONDS) == before


def test_an_export_cached_by_other_code_is_not_served(monkeypatch, tmp_path):
    # A kept .normconf/cache outlives an upgrade of normconf (or an edit of the export's code): the
    # code's digest is part of the key, so the old entry is not what the new code's run loads.
    monkeypatch.delenv(export.OPSET_VARIABLE, raising=False)
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path))
    case = Case("rms_norm", (4, 32), "float32", 1e-5)
    assert _prepare(export.OnnxExport(), case).info()["export"] == "exported"
    assert _prepare(export.OnnxExport(), case).info()["export"] == "disk cache"
    monkeypatch.setattr(export, "_source", lambda: "other code")
    assert _prepare(export.OnnxExport(), case).info()["export"] == "exported"
    assert len(list((tmp_path / export.EXPORT_CACHE).glob("*.onnx"))) == 2


def test_an_export_made_ahead_is_the_one_prepare_loads(monkeypatch, tmp_path):
    # conformance/running/precompile.py: the hook exports into the graph cache what prepare() would.
    monkeypatch.delenv(export.OPSET_VARIABLE, raising=False)
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path / "ahead"))
    case = Case("layer_norm", (4, 32), "float16", 1e-5)
    refused = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True)
    backend = export.OnnxExport()
    assert [backend.precompile(case, grad=False), backend.precompile(case, grad=False)] == ["built", "cached"]
    assert backend.precompile(refused, grad=False) == "skipped"
    before = len(export.EXPORT_SECONDS)
    loaded = _prepare(export.OnnxExport(), case)
    assert loaded.info()["export"] == "disk cache" and len(export.EXPORT_SECONDS) == before
    with pytest.raises(Unsupported):  # the refusal was kept too
        _prepare(export.OnnxExport(), refused)
    assert len(export.EXPORT_SECONDS) == before
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path / "alone"))
    alone = _prepare(export.OnnxExport(), case)
    assert alone.info()["export"] == "exported"
    ahead_model, alone_model = (
        next((tmp_path / k / export.EXPORT_CACHE).glob("*.onnx")) for k in ("ahead", "alone")
    )
    assert ahead_model.read_bytes() == alone_model.read_bytes()
    np.testing.assert_array_equal(loaded.outputs()["y"], alone.outputs()["y"])


def test_the_graph_cache_keeps_what_the_exporter_refused_and_rebuilds_a_damaged_entry(monkeypatch, tmp_path):
    monkeypatch.delenv(export.OPSET_VARIABLE, raising=False)
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path))
    refused = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True)
    with pytest.raises(Unsupported) as first:
        _prepare(export.OnnxExport(), refused)
    before = len(export.EXPORT_SECONDS)
    with pytest.raises(Unsupported) as again:
        _prepare(export.OnnxExport(), refused)
    assert str(again.value) == str(first.value) and len(export.EXPORT_SECONDS) == before
    case = Case("layer_norm", (4, 32), "float32", 1e-5)
    _prepare(export.OnnxExport(), case)
    for entry in (tmp_path / export.EXPORT_CACHE).glob("*.onnx"):
        entry.write_bytes(b"not a model")
    assert _prepare(export.OnnxExport(), case).info()["export"] == "exported"
    # Another eps is another graph (a constant of it): never served from the first one's entry.
    other = _prepare(export.OnnxExport(), dataclasses.replace(case, eps=1e-3))
    assert other.info()["export"] == "exported"


@pytest.mark.parametrize(("opset", "decomposed"), [(18, True), (23, False)])
def test_rms_norm_decomposes_below_opset_23(monkeypatch, opset, decomposed):
    monkeypatch.setenv(export.OPSET_VARIABLE, str(opset))
    info = _prepare(export.OnnxExport(), Case("rms_norm", (4, 16), "float32", 1e-6)).info()
    assert info["opset"] == opset
    assert ("RMSNormalization" not in info["graph"]) is decomposed


def test_add_rms_norm_feeds_x_and_residual_to_their_own_inputs():
    case = Case("add_rms_norm", (4, 16), "float32", 1e-6)
    inputs = make_inputs(case, grad=False)
    prepared = export.OnnxExport().prepare(case, inputs, grad=False)
    prepared()
    total = inputs["x"] + inputs["residual"]
    assert np.array_equal(prepared.outputs()["residual_out"], total)


def test_training_mode_batch_norm_is_unsupported_with_what_the_export_computes():
    case = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True)
    with pytest.raises(Unsupported, match="training_mode=0, which normalizes with the running statistics"):
        _prepare(export.OnnxExport(), case)


def test_a_cumulative_average_cannot_be_exported():
    case = Case("batch_norm", (4, 3, 5), "float32", 1e-5, training=True, momentum=None)
    with pytest.raises(Unsupported, match=r"torch\.onnx\.export cannot express the case"):
        _prepare(export.OnnxExport(), case)


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
def test_a_dtype_without_a_cpu_kernel_is_unsupported_and_cached():
    backend = export.OnnxExport()
    # The exported add+RMSNorm adds in bfloat16: ORT's CPU provider has no bfloat16 Add.
    case = Case("add_rms_norm", (4, 16), "bfloat16", 1e-6)
    for _ in range(2):
        with pytest.raises(Unsupported, match=r"has no kernel for the exported graph.*NOT_IMPLEMENTED"):
            _prepare(backend, case)
    assert len(backend._cache) == 1


def test_an_export_the_onnx_checker_rejects_is_unsupported_with_its_message():
    # torch.onnx emits LayerNormalization with a float32 Scale for float16 x: an invalid model.
    case = Case("layer_norm", (4, 16), "float16", 1e-5, param_dtype="float32")
    with pytest.raises(Unsupported, match=r"fails the ONNX checker.*Scale has inconsistent type"):
        _prepare(export.OnnxExport(), case)


def _agrees(case, prepared, inputs):
    """y within a test-local 8 float32 ulps of the float64 oracle, relative to max(1, |y|)."""
    expected = oracle.evaluate(case, inputs, grad=False)["y"]
    err = np.max(np.abs(prepared.outputs()["y"].astype(np.float64) - expected))
    assert err <= 8 * unit_roundoff("float32") * max(1.0, np.max(np.abs(expected)))


@pytest.mark.parametrize(
    ("opset", "graph"),
    [
        # Below 21 the exporter normalizes (N, G, -1) with InstanceNormalization (scale 1, bias 0),
        # then applies the per-channel affine; from 21 it emits GroupNormalization-21.
        (18, "Reshape+InstanceNormalization+Shape+Unsqueeze+Mul+Add"),
        (21, "GroupNormalization"),
    ],
)
def test_group_norm_exports_by_opset(monkeypatch, opset, graph):
    monkeypatch.setenv(export.OPSET_VARIABLE, str(opset))
    case = Case("group_norm", (2, 8, 5), "float32", 1e-5, num_groups=4)
    inputs = make_inputs(case, grad=False)
    prepared = export.OnnxExport().prepare(case, inputs, grad=False)
    prepared()
    info = prepared.info()
    assert info["opset"] == opset and info["graph"] == graph
    _agrees(case, prepared, inputs)


def test_instance_norm_with_running_statistics_exports_batch_normalization_in_eval(monkeypatch):
    monkeypatch.delenv(export.OPSET_VARIABLE, raising=False)
    case = Case("instance_norm", (4, 3, 10), "float32", 1e-5, track_running_stats=True)
    inputs = make_inputs(case, grad=False)
    prepared = export.OnnxExport().prepare(case, inputs, grad=False)
    prepared()
    graph = prepared.info()["graph"].split("+")
    assert "BatchNormalization" in graph and "Tile" in graph and "InstanceNormalization" not in graph
    _agrees(case, prepared, inputs)


def test_training_instance_norm_with_running_statistics_is_unsupported_with_what_the_export_computes():
    case = Case("instance_norm", (4, 3, 10), "float32", 1e-5, track_running_stats=True, training=True)
    with pytest.raises(
        Unsupported, match=r"InstanceNorm with track_running_stats has graph outputs .*InstanceNormalization"
    ):
        _prepare(export.OnnxExport(), case)


def test_channels_last_is_not_declared():
    caps = export.OnnxExport().capabilities()
    assert "channels_last" not in caps.features and {"group_norm", "instance_norm"} <= caps.ops


def _within(case, actual, expected, ulps):
    """Whether ``actual`` is within ``ulps`` units of y's dtype of ``expected``, relative to max(1, |y|)."""
    err = np.max(np.abs(actual.astype(np.float64) - expected))
    return err <= ulps * unit_roundoff(case.dtype) * max(1.0, np.max(np.abs(expected)))


def _prepare_with(backend, case, inputs):
    prepared = backend.prepare(case, inputs, grad=False)
    prepared()
    return prepared


def test_add_layer_norm_exports_add_then_layer_normalization_and_agrees_with_the_oracle():
    case = Case("add_layer_norm", (6, 40), "float32", 1e-5)
    inputs = make_inputs(case, grad=False)
    prepared = _prepare_with(export.OnnxExport(), case, inputs)
    assert prepared.info()["graph"] == "Add+LayerNormalization"
    outputs = prepared.outputs()
    assert np.array_equal(outputs["residual_out"], inputs["x"] + inputs["residual"])
    _agrees(case, prepared, inputs)


def test_the_residual_conventions_are_declared_with_add_layer_norm():
    caps = export.OnnxExport().capabilities()
    assert {"residual_dtype", "exact_sum"} <= caps.features
    assert {"add_rms_norm", "add_layer_norm"} <= caps.ops


@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
def test_a_float32_residual_stream_sums_in_float32_and_keeps_residual_out_there(op):
    case = Case(op, (6, 40), "float16", 1e-5, residual_dtype="float32")
    inputs = make_inputs(case, grad=False)
    assert inputs["residual"].dtype == np.float32
    prepared = _prepare_with(export.OnnxExport(), case, inputs)
    # x.float() + residual, the norm on that float32 sum, y cast back to float16.
    assert prepared.info()["graph"].startswith("Cast+Add+")
    outputs = prepared.outputs()
    assert outputs["residual_out"].dtype == np.float32 and outputs["y"].dtype == np.float16
    assert np.array_equal(outputs["residual_out"], inputs["x"].astype(np.float32) + inputs["residual"])
    assert _within(case, outputs["y"], oracle.evaluate(case, inputs, grad=False)["y"], 2)


def test_the_exact_sum_is_normalized_and_residual_out_rounded_once():
    # offset rows: the float16 rounding of h moves y far more than float16's tolerance, so the two
    # conventions are told apart.
    case = Case("add_layer_norm", (4, 24), "float16", 1e-5, dist="offset", norm_input="exact")
    inputs = make_inputs(case, grad=False)
    prepared = _prepare_with(export.OnnxExport(), case, inputs)
    assert prepared.info()["graph"] == "Cast+Add+LayerNormalization"
    outputs = prepared.outputs()
    total = inputs["x"].astype(np.float64) + inputs["residual"]
    assert np.array_equal(outputs["residual_out"], total.astype(np.float16))
    exact = oracle.evaluate(case, inputs, grad=False)["y"]
    rounded = oracle.evaluate(dataclasses.replace(case, norm_input="rounded"), inputs, grad=False)["y"]
    assert _within(case, outputs["y"], exact, 2)
    assert not _within(case, outputs["y"], rounded, 2)


@pytest.mark.skipif(not CPU, reason="kernel coverage is the CPU provider's")
def test_bfloat16_runs_where_the_module_widens_before_adding():
    # ORT's CPU provider has no bfloat16 Add: the default convention is Unsupported, the exact one
    # casts x and residual to float32 first and runs.
    for norm_input, runs in (("rounded", False), ("exact", True)):
        case = Case("add_layer_norm", (6, 40), "bfloat16", 1e-5, norm_input=norm_input)
        inputs = make_inputs(case, grad=False)
        if not runs:
            with pytest.raises(Unsupported, match=r"Add\(14\)"):
                _prepare_with(export.OnnxExport(), case, inputs)
            continue
        prepared = _prepare_with(export.OnnxExport(), case, inputs)
        assert _within(case, prepared.outputs()["y"], oracle.evaluate(case, inputs, grad=False)["y"], 2)
