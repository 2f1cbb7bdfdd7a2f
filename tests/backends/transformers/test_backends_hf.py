"""The hf-* adapters (transformers model-family norm classes): translations, agreement with the oracle,
and the recomputations that verify each hf-* ledger reason (float64 computed in float32, rsqrt's
backward underflow, Llama's cast-before-weight), plus broken variants the suite catches."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from conformance import oracle
from conformance.adapter.backend import Unsupported
from conformance.model.case import Case
from conformance.model.dtypes import round_to
from conformance.model.inputs import make_inputs

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
hf = pytest.importorskip("backends.transformers.hf_norms")

RMS = ["hf-llama", "hf-gemma", "hf-t5", "hf-olmo2"]


def _run(name: str, case: Case, *, grad: bool = False, inputs: dict[str, Any] | None = None) -> Any:
    backend = hf.HFNorm(hf.BY_NAME[name])
    inputs = inputs if inputs is not None else make_inputs(case, grad=grad)
    prepared = backend.prepare(case, inputs, grad=grad)
    prepared()
    return inputs, prepared.outputs(), prepared


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def test_every_family_is_registered_and_names_its_class() -> None:
    from conformance.adapter.registry import entries

    names = set(entries())
    assert {f.name for f in hf.FAMILIES} <= names
    for family in hf.FAMILIES:
        caps = hf.HFNorm(family).capabilities()
        assert caps.notes["class"].endswith(family.cls)
        assert "transformers" in caps.notes


@pytest.mark.parametrize("name", [f.name for f in hf.FAMILIES])
def test_eps_is_passed_and_the_default_is_the_classes_own(name: str) -> None:
    family = hf.BY_NAME[name]
    case = Case(family.op, (2, 8), "float32", 0.0123, bias=False)
    module = hf._module(family, case, torch.float32, torch.device("cpu"), False)
    default = hf._module(family, case, torch.float32, torch.device("cpu"), True)
    read = [getattr(m, a) for m in (module, default) for a in ("eps", "variance_epsilon") if hasattr(m, a)]
    assert read == [0.0123, family.default_eps]


@pytest.mark.parametrize("name", ["hf-llama", "hf-olmo2", "hf-t5", "hf-gemma", "hf-nemotron", "hf-cohere"])
def test_float32_agrees_with_the_oracle(name: str) -> None:
    family = hf.BY_NAME[name]
    offset = 1.0 if name == "hf-gemma" else 0.0  # Gemma's own convention, run as given
    case = Case(family.op, (6, 48), "float32", 1e-5, bias=name == "hf-nemotron", weight_offset=offset)
    inputs = make_inputs(case, grad=True)
    if name == "hf-nemotron":
        # w in [0.5, 2]: w - 1 is exact in float32 (Sterbenz), so the class's w - 1 + 1 gives w back.
        inputs["weight"] = np.clip(inputs["weight"], 0.5, 2.0)
    inputs, out, _ = _run(name, case, grad=True, inputs=inputs)
    expected = oracle.evaluate(case, inputs, grad=True)
    for output in ("y", "dx", "dweight"):
        np.testing.assert_allclose(_f64(out[output]), expected[output], rtol=2e-5, atol=2e-5, err_msg=output)


def test_gemma_translates_an_offset_free_weight_exactly() -> None:
    case = Case("rms_norm", (4, 64), "bfloat16", 1e-6)
    weight = make_inputs(case)["weight"]
    held, how = hf._translated(hf.BY_NAME["hf-gemma"], case, weight)
    # Held in float32 (w - 1 is not exact in bfloat16 for w < 0.5), and 1 + p gives w back exactly.
    assert held.dtype == np.float32 and "float32" in how
    assert np.array_equal((np.float32(1.0) + held).astype(np.float64), weight.astype(np.float64))
    offset = Case("rms_norm", (4, 64), "bfloat16", 1e-6, weight_offset=1.0)
    w = make_inputs(offset)["weight"]
    assert hf._translated(hf.BY_NAME["hf-gemma"], offset, w) == (w, "as given")


def test_nemotron_holds_w_minus_one_so_its_own_addition_is_exact() -> None:
    case = Case("layer_norm", (4, 32), "float32", 1e-5)
    weight = np.clip(make_inputs(case)["weight"], 0.5, 2.0)
    held, how = hf._translated(hf.BY_NAME["hf-nemotron"], case, weight)
    # NemotronLayerNorm1P adds 1.0 in the parameter's own dtype.
    assert held.dtype == np.float32 and "float32" in how
    assert np.array_equal(held + np.float32(1.0), weight)
    # Below 0.5, w - 1 needs more bits than float32 has: no exact parameter, so the case is unsupported.
    with pytest.raises(Unsupported, match="no dtype holds"):
        hf._translated(hf.BY_NAME["hf-nemotron"], case, np.array([0.3 + 2.0**-25], dtype=np.float32))


def test_what_a_class_cannot_express_is_unsupported() -> None:
    with pytest.raises(Unsupported, match="no bias"):
        _run("hf-cohere", Case("layer_norm", (2, 8), "float32", 1e-5))
    caps = hf.HFNorm(hf.BY_NAME["hf-llama"]).capabilities()
    assert "weight_offset" not in caps.features and "multi_axis" not in caps.features
    assert caps.why_not(Case("rms_norm", (2, 8), "float32", 1e-6, weight_offset=1.0)) is not None
    assert (
        hf.HFNorm(hf.BY_NAME["hf-gemma"])
        .capabilities()
        .why_not(Case("rms_norm", (2, 8), "float32", 1e-6, weight_offset=1.0), grad=True)
        is None
    )


def _xhat32(x: np.ndarray, eps: float) -> np.ndarray:
    """The classes' float32 statistics: x.to(float32), mean(x^2), rsqrt(var + eps), x * rstd."""
    x32 = x.astype(np.float32)
    var = np.mean(x32 * x32, axis=-1, keepdims=True, dtype=np.float32)
    rstd = (np.float32(1.0) / np.sqrt(var + np.float32(eps))).astype(np.float32)
    return (x32 * rstd).astype(np.float32)


@pytest.mark.parametrize("name", RMS)
def test_float64_rows_are_normalized_in_float32(name: str) -> None:
    """Ledger reason 'f64': the classes upcast to float32 even for float64 input."""
    case = Case("rms_norm", (8, 64), "float64", 1e-6, weight_offset=1.0 if name == "hf-gemma" else 0.0)
    inputs, out, _ = _run(name, case)
    expected = oracle.evaluate(case, inputs, grad=False)["y"]
    scale = case.weight_offset + inputs["weight"].astype(np.float32).astype(np.float64)
    float32_model = _xhat32(inputs["x"], case.eps).astype(np.float64) * scale
    y = _f64(out["y"])
    off_reference = np.max(np.abs(y - expected)) / np.max(np.abs(expected))
    off_float32 = np.max(np.abs(y - float32_model)) / np.max(np.abs(expected))
    assert off_reference > 1e-9  # far beyond float64's tolerance
    assert off_float32 < 4 * float(np.finfo(np.float32).eps)


def test_rsqrt_backward_underflow_drops_the_projection_term() -> None:
    """Ledger reason 'rstd3': on |x| ~ 5e17 rows the class's dx is rstd * w * dy."""
    case = Case("rms_norm", (4, 64), "float32", 1e-5, dist="large")
    inputs, out, _ = _run("hf-llama", case, grad=True)
    x = inputs["x"].astype(np.float64)
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + case.eps)
    assert np.all(rstd < 1e-12)  # rstd**3 < 1e-36 underflows in float32 (smallest subnormal 1.4e-45)
    no_mean_term = rstd * inputs["weight"].astype(np.float64) * inputs["dy"].astype(np.float64)
    full = oracle.evaluate(case, inputs, grad=True)["dx"]
    dx = _f64(out["dx"])
    assert np.max(np.abs(dx - no_mean_term)) <= 1e-6 * np.max(np.abs(no_mean_term))
    assert np.max(np.abs(dx - full)) > 1e-3 * np.max(np.abs(full))


def test_llama_casts_before_the_weight_and_olmo2_after() -> None:
    """Ledger reason 'cast-first' and the fingerprint's rms_norm.weight_cast answers."""
    case = Case("rms_norm", (16, 256), "bfloat16", 1e-6)
    inputs = make_inputs(case)
    xhat = _xhat32(inputs["x"], case.eps)
    w = inputs["weight"].astype(np.float32)
    cast_first = round_to((w * round_to(xhat, "bfloat16").astype(np.float32)).astype(np.float64), "bfloat16")
    weight_first = round_to((w * xhat).astype(np.float64), "bfloat16")
    assert not np.array_equal(cast_first, weight_first)
    _, llama, _ = _run("hf-llama", case, inputs=inputs)
    _, olmo2, _ = _run("hf-olmo2", case, inputs=inputs)
    assert llama["y"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(_f64(llama["y"]), _f64(cast_first))
    assert np.array_equal(_f64(olmo2["y"]), _f64(weight_first))


def test_llama_dweight_is_formed_from_the_rounded_xhat() -> None:
    """Ledger reason 'llama-dweight': float32 weights, bfloat16 activations."""
    case = Case("rms_norm", (16, 200), "bfloat16", 1e-5, param_dtype="float32")
    inputs, out, _ = _run("hf-llama", case, grad=True)
    rounded = round_to(_xhat32(inputs["x"], case.eps), "bfloat16").astype(np.float64)
    from_rounded = np.sum(inputs["dy"].astype(np.float64) * rounded, axis=0)
    reference = oracle.evaluate(case, inputs, grad=True)["dweight"]
    dweight = _f64(out["dweight"])
    assert out["y"].dtype == np.float32  # weight (float32) * xhat (bfloat16) promotes
    assert np.max(np.abs(dweight - from_rounded)) <= 1e-5 * np.max(np.abs(from_rounded))
    assert np.max(np.abs(dweight - reference)) > 1e-3 * np.max(np.abs(reference))


def test_info_names_the_class_and_the_translation() -> None:
    case = Case("layer_norm", (2, 16), "bfloat16", 1e-5)
    _, _, prepared = _run("hf-nemotron", case)
    info = prepared.info()
    assert info["class"] == "NemotronLayerNorm1P" and "held in" in info["weight"]


def _failing(record: dict[str, Any]) -> set[str]:
    return {c["output"] for c in record["comparisons"] if c["worst_ratio"] == "inf" or c["worst_ratio"] > 1}


@pytest.mark.parametrize(
    ("fake", "real", "output"),
    [("fake-hf-gemma-untranslated", "hf-gemma", "y"), ("fake-hf-llama-default-eps", "hf-llama", "y")],
)
def test_a_broken_translation_is_caught(suite: Any, fake: str, real: str, output: str) -> None:
    run = suite("-p", "fakes.hf", "--backend", f"{real},{fake}", "--op", "rms_norm", "--dtype", "float32")
    assert run.returncode == 1, run.output[-3000:]
    forward = [r for r in run.records if r["check"] == "forward"]
    # The real adapter passes what it runs (Gemma: offset-free float32 weights below 0.5 have no exact
    # w - 1, so some cases are unsupported); the fake fails those very cases.
    passed = {r["case"]["id"] for r in forward if r["backend"] == real and r["outcome"] == "passed"}
    assert passed and {r["outcome"] for r in forward if r["backend"] == real} <= {"passed", "unsupported"}
    failed = {r["case"]["id"]: r for r in forward if r["backend"] == fake and r["outcome"] == "failed"}
    assert passed & set(failed), sorted(failed)
    assert all(output in _failing(r) for r in failed.values())


@pytest.mark.parametrize("name", RMS)
def test_add_rms_norm_differentiates_both_outputs(name: str) -> None:
    """dx = dresidual = d RMSNorm(h) / dh . dy + dresidual_out; the one tensor autograd hands to both is
    declared (Capabilities.aliases), so the aliasing check passes on the class's own tensors."""
    from conformance.judging import tolerances
    from conformance.running import checks
    from conformance.running.settings import load_ledger

    offset = 1.0 if name == "hf-gemma" else 0.0
    case = Case("add_rms_norm", (6, 48), "float32", 1e-5, weight_offset=offset)
    inputs, out, prepared = _run(name, case, grad=True)
    expected = oracle.evaluate(case, inputs, grad=True)
    assert set(out) == {"y", "residual_out", "dx", "dresidual", "dweight"}
    for output, value in out.items():
        np.testing.assert_allclose(_f64(value), expected[output], rtol=2e-5, atol=2e-5, err_msg=output)
    buffers = prepared.buffers()
    assert buffers["dx"].data_ptr() == buffers["dresidual"].data_ptr()
    backend = hf.HFNorm(hf.BY_NAME[name])
    caps = backend.capabilities()
    assert caps.aliases["dresidual"] == "dx"
    ctx = checks.CheckContext(tolerances.read_tolerances(), load_ledger(), timeout=300)
    result = checks.run_check("aliasing", backend, caps, case, ctx)
    assert result.outcome == "passed", result.reason
    # The model families keep the stream in the activation dtype and normalize the stored sum.
    conventions: tuple[dict[str, Any], ...] = ({"residual_dtype": "bfloat16"}, {"norm_input": "exact"})
    for convention in conventions:
        other = Case("add_rms_norm", (6, 48), "float32", 1e-5, weight_offset=offset, **convention)
        assert caps.why_not(other, grad=True) is not None


def test_nemotron_add_layer_norm_differentiates_both_outputs() -> None:
    """The LayerNorm families compose the fused add the same way: NemotronLayerNorm1P after x + residual,
    dx = dresidual = dL/dh through both outputs, the shared tensor declared. float16: the class holds
    its parameter p = w - 1 in float32, which a half w allows exactly (a float32 w does not)."""
    from conformance.judging import tolerances
    from conformance.running import checks
    from conformance.running.settings import load_ledger

    case = Case("add_layer_norm", (6, 48), "float16", 1e-5)
    _, out, prepared = _run("hf-nemotron", case, grad=True)
    assert set(out) == {"y", "residual_out", "dx", "dresidual", "dweight", "dbias"}
    buffers = prepared.buffers()
    assert buffers["dx"].data_ptr() == buffers["dresidual"].data_ptr()
    backend = hf.HFNorm(hf.BY_NAME["hf-nemotron"])
    caps = backend.capabilities()
    assert "add_layer_norm" in caps.ops and caps.aliases["dresidual"] == "dx"
    assert "add_rms_norm" not in caps.ops
    assert "add_layer_norm" in hf.HFNorm(hf.BY_NAME["hf-cohere"]).capabilities().ops
    ctx = checks.CheckContext(tolerances.read_tolerances(), load_ledger(), timeout=300)
    for check in ("forward", "backward", "aliasing"):
        result = checks.run_check(check, backend, caps, case, ctx)
        assert result.outcome == "passed", (check, result.reason)
