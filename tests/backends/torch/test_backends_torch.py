"""The built-in torch adapters: output keys, shapes and dtypes, repeatability, untouched inputs, and
agreement with a float64 torch autograd reference written here, independently of the adapters; the add
ops' residual conventions and two-output backward against the oracle, and the memory they report."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from conformance import oracle
from conformance.adapter.backend import FEATURES, Backend, Unsupported
from conformance.judging import tolerances
from conformance.model import residual
from conformance.model.case import Case
from conformance.model.dtypes import numpy_dtype, unit_roundoff
from conformance.model.inputs import make_inputs
from conformance.model.outputs import grad_outputs, output_dtype
from conformance.running import checks
from conformance.running.settings import load_ledger

torch = pytest.importorskip("torch")
common = pytest.importorskip("backends.common.torch_support")
torch_eager = pytest.importorskip("backends.torch.eager")
torch_nn = pytest.importorskip("backends.torch.modules")

BACKENDS: dict[str, Backend] = {
    "torch-eager": torch_eager.TorchEager(),
    "torch-nn": torch_nn.TorchNN(),
    "torch-functional": torch_nn.TorchFunctional(),
}

CASES = [
    Case("layer_norm", (4, 32), "float32", 1e-5),
    Case("layer_norm", (3, 4, 16), "float64", 1e-6, norm_ndim=2),
    Case("layer_norm", (4, 64), "bfloat16", 1e-5),
    Case("layer_norm", (4, 64), "bfloat16", 1e-5, param_dtype="float32"),
    Case("layer_norm", (4, 32), "float16", 1e-5),
    Case("layer_norm", (4, 32), "float32", 1e-5, weight=False),
    Case("layer_norm", (4, 32), "float32", 1e-5, bias=False),
    Case("layer_norm", (4, 32), "float32", 1e-5, weight=False, bias=False),
    Case("rms_norm", (4, 32), "float32", 1e-6),
    Case("rms_norm", (4, 64), "bfloat16", 1e-6, weight_offset=1.0),
    Case("rms_norm", (4, 64), "bfloat16", 1e-6, param_dtype="float32", weight_offset=1.0),
    Case("rms_norm", (4, 32), "float32", 1e-6, weight_offset=1.0),
    Case("rms_norm", (4, 32), "float64", 1e-6, weight_offset=1.0),
    Case("rms_norm", (2, 4, 8), "float32", 1e-6, norm_ndim=2, weight=False),
    Case("rms_norm", (4, 32), "float32", 1e-6, param_dtype="bfloat16"),
    Case("batch_norm", (8, 6), "float32", 1e-5),
    Case("batch_norm", (4, 6, 5), "float32", 1e-5, training=True),
    Case("batch_norm", (4, 3, 2, 3), "float64", 1e-5, training=True, momentum=None),
    Case("batch_norm", (4, 6, 5), "bfloat16", 1e-5, training=True, param_dtype="float32"),
    Case("batch_norm", (4, 6, 5), "bfloat16", 1e-5),
    Case("batch_norm", (4, 6, 5), "float32", 1e-5, training=True, weight=False),
    Case("batch_norm", (4, 6, 5), "float32", 1e-5, training=True, bias=False),
    Case("batch_norm", (2, 3, 2, 2, 2), "float16", 1e-5, training=True, momentum=0.3),
    Case("batch_norm", (2, 3, 2, 1, 2, 2), "float32", 1e-5, training=True),
]
# torch.nn has BatchNorm classes for 2-D to 5-D input only (see test_nn_batch_norm_over_5d_is_unsupported).
RUNS = [
    (name, case)
    for name in BACKENDS
    for case in CASES
    if not (name == "torch-nn" and case.op == "batch_norm" and len(case.shape) > 5)
]

# Test-local bound: |actual - expected| <= BOUND_ULPS * u * max(1, max|expected|), u the unit roundoff
# of the coarser of the activation and parameter dtypes. The adapters
# round a few times per element and reduce over at most 64 values: the worst seen is under 4 units
# of roundoff, and a wrong formula (biased/unbiased swap, eps outside the root, a dropped offset or
# momentum) is off by far more. The suite's real tolerances live in tolerances.toml.
BOUND_ULPS = 16.0


def _t64(values: np.ndarray, *, grad: bool = False) -> Any:
    return torch.tensor(np.asarray(values, dtype=np.float64), requires_grad=grad)


def _affine(y: Any, t: dict[str, Any], shape: tuple[int, ...]) -> Any:
    if "weight" in t:
        y = y * t["weight"].reshape(shape)
    if "bias" in t:
        y = y + t["bias"].reshape(shape)
    return y


def _reference(case: Case, inputs: dict[str, np.ndarray], grad: bool) -> dict[str, np.ndarray]:
    """float64 autograd of the reference semantics, straight from their definitions."""
    t = {k: _t64(v, grad=k in ("x", "weight", "bias")) for k, v in inputs.items() if k != "dy"}
    x, out = t["x"], {}
    if case.op == "batch_norm":
        dims, shape = (0, *range(2, x.ndim)), (1, x.shape[1]) + (1,) * (x.ndim - 2)
        if case.training:
            mean, var = x.mean(dims), ((x - x.mean(dims, keepdim=True)) ** 2).mean(dims)
            m = 1.0 if case.momentum is None else case.momentum
            count = x.numel() // x.shape[1]
            out["running_mean"] = (1 - m) * t["running_mean"] + m * mean.detach()
            out["running_var"] = (1 - m) * t["running_var"] + m * var.detach() * count / (count - 1)
        else:
            mean, var = t["running_mean"], t["running_var"]
        y = _affine((x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + case.eps), t, shape)
    elif case.op == "layer_norm":
        dims = tuple(range(-case.norm_ndim, 0))
        centred = x - x.mean(dims, keepdim=True)
        y = _affine(
            centred / torch.sqrt((centred**2).mean(dims, keepdim=True) + case.eps), t, case.param_shape
        )
    else:
        dims = tuple(range(-case.norm_ndim, 0))
        y = x / torch.sqrt((x**2).mean(dims, keepdim=True) + case.eps)
        if case.weight:
            y = y * (case.weight_offset + t["weight"])
    out["y"] = y
    if grad:
        names = [n for n in ("x", "weight", "bias") if n in t]
        grads = torch.autograd.grad(y, [t[n] for n in names], _t64(inputs["dy"]))
        out.update({"d" + n: g for n, g in zip(names, grads, strict=True)})
    return {k: v.detach().numpy() for k, v in out.items()}


def _expected_keys(case: Case, grad: bool) -> set[str]:
    keys = {"y"} | ({"running_mean", "running_var"} if case.training else set())
    if grad:
        keys |= {"dx"} | ({"dweight"} if case.weight else set()) | ({"dbias"} if case.bias else set())
    return keys


def _expected_dtype(backend: str, case: Case, name: str) -> np.dtype[Any]:
    if name in ("y", "dx"):
        # The seed's LayerNorm/BatchNorm multiply by the weight with PyTorch's type promotion, so wider
        # parameters widen y; everything else returns activations in the activation dtype.
        widened = backend == "torch-eager" and case.op != "rms_norm" and name == "y"
        return (
            np.promote_types(numpy_dtype(case.dtype), numpy_dtype(case.weight_dtype))
            if widened
            else (numpy_dtype(case.dtype))
        )
    return numpy_dtype(case.weight_dtype)


def _bits(outputs: dict[str, np.ndarray]) -> dict[str, bytes]:
    return {k: v.tobytes() for k, v in outputs.items()}


def _prepare_or_skip(backend: Backend, case: Case, inputs: dict[str, np.ndarray], grad: bool) -> Any:
    """Prepare; Unsupported is a failure except for a dtype mix off the CPU (torch decides per device)."""
    try:
        return backend.prepare(case, inputs, grad=grad)
    except Unsupported as reason:
        if case.weight_dtype == case.dtype or common.device().type == "cpu":
            raise
        pytest.skip(str(reason))


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
@pytest.mark.parametrize(("name", "case"), RUNS, ids=[f"{n}-{c.id}" for n, c in RUNS])
def test_outputs(name: str, case: Case, grad: bool) -> None:
    backend = BACKENDS[name]
    inputs = make_inputs(case, grad=grad)
    pristine = _bits(inputs)
    prepared = _prepare_or_skip(backend, case, inputs, grad)
    prepared()
    prepared.synchronize()
    first = dict(prepared.outputs())
    first_bits = _bits(first)
    prepared()
    prepared.synchronize()
    second = dict(prepared.outputs())

    assert set(first) == _expected_keys(case, grad)
    for key, value in first.items():
        shape = case.shape if key in ("y", "dx") else case.param_shape
        assert value.shape == shape, key
        assert value.dtype == _expected_dtype(name, case, key), key
        assert value.flags.c_contiguous, key
    assert _bits(second) == first_bits, "a second call must reproduce the first bit for bit"
    assert _bits(first) == first_bits, "returned arrays must not alias the adapter's buffers"
    assert _bits(inputs) == pristine, "the adapter modified its inputs"

    expected = _reference(case, inputs, grad)
    for key, value in first.items():
        want = expected[key]
        err = np.max(np.abs(value.astype(np.float64) - want))
        # Rounding of the activations reaches every output, parameter gradients and stats included.
        u = max(unit_roundoff(case.dtype), unit_roundoff(case.weight_dtype))
        bound = BOUND_ULPS * u * max(1.0, float(np.max(np.abs(want))))
        assert err <= bound, f"{key}: max |error| {err:.3g} > test bound {bound:.3g}"


@pytest.mark.parametrize("name", list(BACKENDS))
def test_capabilities(name: str) -> None:
    caps = BACKENDS[name].capabilities()
    assert caps.ops == {
        "layer_norm",
        "rms_norm",
        "batch_norm",
        "add_rms_norm",
        "add_layer_norm",
        "group_norm",
        "instance_norm",
    }
    assert caps.dtypes == {"float64", "float32", "float16", "bfloat16"}
    assert caps.features <= set(FEATURES) and "backward" in caps.features
    # InstanceNorm's running statistics and the channels-last layout
    # (tests/backends/torch/test_backends_torch_groups.py), and the add ops' residual conventions (below).
    assert {"running_stats", "channels_last", "residual_dtype", "exact_sum"} <= caps.features
    assert caps.aliases == {"dresidual": "dx", "running_mean": "running_mean", "running_var": "running_var"}
    assert "AddBackward" in caps.notes["aliases"]
    assert caps.device in ("cpu", "cuda") and caps.device_name


@pytest.mark.parametrize("name", ["torch-nn", "torch-functional"])
@pytest.mark.parametrize("op", ["layer_norm", "batch_norm"])
def test_rejected_dtype_mix_is_unsupported(name: str, op: str) -> None:
    if common.device().type != "cpu":
        pytest.skip("which dtype mixes torch rejects is device-specific; this pins the CPU behaviour")
    case = Case(op, (4, 8), "float64", 1e-5, param_dtype="float32")
    with pytest.raises(Unsupported, match="param_dtype=float32"):
        BACKENDS[name].prepare(case, make_inputs(case, grad=True), grad=True)


def test_nn_batch_norm_over_5d_is_unsupported() -> None:
    case = Case("batch_norm", (2, 3, 2, 1, 2, 2), "float32", 1e-5)
    with pytest.raises(Unsupported, match="BatchNorm1d/2d/3d"):
        BACKENDS["torch-nn"].prepare(case, make_inputs(case, grad=False), grad=False)


def test_eager_runs_any_dtype_mix() -> None:
    case = Case("layer_norm", (4, 8), "float64", 1e-5, param_dtype="float32")
    prepared = BACKENDS["torch-eager"].prepare(case, make_inputs(case, grad=False), grad=False)
    prepared()
    assert prepared.outputs()["y"].dtype == np.float64


@pytest.mark.parametrize("name", list(BACKENDS))
def test_prepared_reports_the_thread_count_it_runs_with(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        case = CASES[0]
        prepared = BACKENDS[name].prepare(case, make_inputs(case, grad=False), grad=False)
        assert prepared.info() == {"threads": 1} and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_copy_kernel_copies_on_the_device(name: str) -> None:
    copy = BACKENDS[name].copy_kernel(4096)
    copy()
    copy.synchronize()
    assert copy.outputs() == {} and copy.info()["threads"] == torch.get_num_threads()


def test_outputs_before_call_is_an_error() -> None:
    case = CASES[0]
    prepared = BACKENDS["torch-nn"].prepare(case, make_inputs(case, grad=False), grad=False)
    with pytest.raises(RuntimeError, match="before the first call"):
        prepared.outputs()


def test_bfloat16_round_trip_is_bit_exact_and_copies() -> None:
    values = np.array([1.0, -0.0, 3.140625, 1e-40, np.inf, np.nan], dtype=ml_dtypes.bfloat16)
    pristine = values.tobytes()
    tensor = common.to_torch(values, torch.device("cpu"))
    back = common.to_numpy(tensor)
    assert tensor.dtype == torch.bfloat16 and back.dtype == ml_dtypes.bfloat16
    assert back.tobytes() == pristine
    tensor.zero_()  # neither the caller's array nor the returned copy may share its storage
    assert values.tobytes() == pristine and back.tobytes() == pristine


@pytest.mark.parametrize(
    ("param_dtype", "held"), [("bfloat16", np.float32), ("float16", np.float32), ("float32", np.float64)]
)
def test_offset_scale_is_exact(param_dtype: str, held: type) -> None:
    weight = np.array([0.3, -1e-3, 0.0, 2.5], dtype=numpy_dtype(param_dtype))
    scale = common.offset_scale(weight, 1.0, param_dtype)
    assert scale.dtype == held
    np.testing.assert_array_equal(scale.astype(np.float64), 1.0 + weight.astype(np.float64))


def test_torch_keeps_its_saved_statistics_in_the_activation_dtype():
    """The reason of the ledger's rounding entries for torch (docs/tolerances.md): the backward of a
    bfloat16 LayerNorm is reproduced bit for bit with the mean and rstd rounded to bfloat16, and not
    with float32 ones."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 512, generator=gen).to(torch.bfloat16).requires_grad_()
    w = torch.randn(512, generator=gen).to(torch.bfloat16)
    dy = torch.randn(2, 512, generator=gen).to(torch.bfloat16)
    _, mean, rstd = torch.native_layer_norm(x.detach(), (512,), w, None, 1e-5)
    assert mean.dtype == rstd.dtype == torch.bfloat16
    torch.nn.functional.layer_norm(x, (512,), w, None, 1e-5).backward(dy)
    xd = x.detach().double()
    exact_mean = xd.mean(1, keepdim=True)
    exact_rstd = 1 / torch.sqrt(xd.var(1, unbiased=False, keepdim=True) + 1e-5)

    def dx(m, r):
        xhat, g = (xd - m) * r, dy.double() * w.double()
        return (r * (g - g.mean(1, keepdim=True) - xhat * (g * xhat).mean(1, keepdim=True))).to(
            torch.bfloat16
        )

    rounded = dx(exact_mean.to(torch.bfloat16).double(), exact_rstd.to(torch.bfloat16).double())
    assert torch.equal(rounded, x.grad)
    assert not torch.equal(dx(exact_mean, exact_rstd), x.grad)


# ------------------------------------------------------------------ the add ops' residual stream
# The residual conventions (the stream's dtype, the sum the norm reads) on small rows, both add ops.
CONVENTIONS: list[dict[str, Any]] = [{}, {"residual_dtype": "float32"}, {"norm_input": "exact"}]
CONVENTIONS.append({"residual_dtype": "float32", "norm_input": "exact"})
ADD_CASES = [
    Case(op, (4, 48), "bfloat16", 1e-5, **convention)
    for op in ("add_layer_norm", "add_rms_norm")
    for convention in CONVENTIONS
] + [
    Case("add_layer_norm", (4, 32), "float32", 1e-5, norm_input="exact"),
    Case("add_layer_norm", (4, 32), "float16", 1e-5, residual_dtype="float32", param_dtype="float32"),
    Case("add_layer_norm", (3, 4, 8), "float64", 1e-6, norm_ndim=2, bias=False),
    Case("add_rms_norm", (4, 32), "float16", 1e-6, weight_offset=1.0, norm_input="exact"),
]
ADD_RUNS = [(name, case) for name in BACKENDS for case in ADD_CASES]


def _run(backend: Backend, case: Case, inputs: dict[str, np.ndarray], grad: bool) -> Any:
    prepared = backend.prepare(case, inputs, grad=grad)
    prepared()
    prepared.synchronize()
    return prepared


def _bound(case: Case, expected: np.ndarray) -> float:
    """BOUND_ULPS of the coarsest dtype the case computes in (activations, parameters, stream)."""
    u = max(unit_roundoff(d) for d in (case.dtype, case.weight_dtype, case.stream_dtype))
    return BOUND_ULPS * u * max(1.0, float(np.max(np.abs(expected))))


@pytest.mark.parametrize(("name", "case"), ADD_RUNS, ids=[f"{n}-{c.id}" for n, c in ADD_RUNS])
def test_add_ops_match_the_oracle_through_both_outputs(name: str, case: Case) -> None:
    inputs = make_inputs(case, grad=True)
    out = _run(BACKENDS[name], case, inputs, grad=True).outputs()
    expected = oracle.evaluate(case, inputs, grad=True)
    assert set(out) == {"y", "residual_out", *grad_outputs(case)}
    for key, value in out.items():
        # y and dx in the activation dtype, residual_out and dresidual in the stream's, the rest the params'.
        assert value.dtype == numpy_dtype(output_dtype(case, key)), key
        err = np.max(np.abs(value.astype(np.float64) - expected[key]))
        assert err <= _bound(case, expected[key]), f"{key}: max |error| {err:.3g}"


def _sum_probe(norm_input: str) -> tuple[Case, dict[str, np.ndarray]]:
    """Row 0: x = 1, residual = +-2^-10: stored in bfloat16 the sum is the constant 1 (y = bias); the
    unrounded sum is 1 +- 2^-10, normalized to +-1 (y = bias +- weight). Row 1: ordinary values."""
    case = Case("add_layer_norm", (2, 16), "bfloat16", 1e-12, norm_input=norm_input)
    inputs = make_inputs(case, grad=False)
    inputs["x"][0] = 1.0
    inputs["residual"][0] = np.resize([2.0**-10, -(2.0**-10)], 16)
    return case, inputs


@pytest.mark.parametrize("name", list(BACKENDS))
def test_the_norm_reads_the_sum_the_case_asks_for(name: str) -> None:
    rounded_case, inputs = _sum_probe("rounded")
    exact_case, _ = _sum_probe("exact")
    rounded = _run(BACKENDS[name], rounded_case, inputs, grad=False).outputs()
    exact = _run(BACKENDS[name], exact_case, inputs, grad=False).outputs()
    bias = inputs["bias"].astype(np.float64)
    assert np.array_equal(rounded["y"][0].astype(np.float64), bias)
    want = oracle.evaluate(exact_case, inputs, grad=False)["y"][0]
    assert np.min(np.abs(want - bias)) > 0.1  # the unrounded sum's y is far from the bias everywhere
    assert np.max(np.abs(exact["y"][0].astype(np.float64) - want)) <= _bound(exact_case, want)
    # Both store the same residual_out: the sum rounded to the stream dtype.
    for out in (rounded, exact):
        assert np.array_equal(out["residual_out"][0].astype(np.float64), np.ones(16))


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_float32_stream_stores_the_float32_sum(name: str) -> None:
    case = Case("add_rms_norm", (4, 32), "bfloat16", 1e-6, residual_dtype="float32")
    inputs = make_inputs(case, grad=True)
    assert inputs["residual"].dtype == np.float32
    out = _run(BACKENDS[name], case, inputs, grad=True).outputs()
    # One float32 addition of a bfloat16 and a float32 value is the correctly rounded sum.
    assert np.array_equal(out["residual_out"], residual.stored(case, inputs).astype(np.float32))
    assert out["dresidual"].dtype == np.float32 and out["dx"].dtype == out["y"].dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("residual_dtype", [None, "float32"])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_dresidual_out_reaches_both_gradients(name: str, residual_dtype: str | None) -> None:
    """With dy = 0 the norm's gradient is exactly 0: dx and dresidual are the cotangent of residual_out
    itself, each in its own dtype."""
    case = Case("add_layer_norm", (4, 32), "bfloat16", 1e-5, residual_dtype=residual_dtype)
    inputs = make_inputs(case, grad=True)
    inputs["dy"] = np.zeros_like(inputs["dy"])
    out = _run(BACKENDS[name], case, inputs, grad=True).outputs()
    cotangent = inputs["dresidual_out"]
    assert np.array_equal(out["dresidual"], cotangent)
    assert np.array_equal(out["dx"], cotangent.astype(ml_dtypes.bfloat16))
    assert not np.any(out["dweight"].astype(np.float64)) and not np.any(out["dbias"].astype(np.float64))


# ------------------------------------------------------------------ memory: buffers() and aliasing
ALIASING_CASES = [
    Case("add_layer_norm", (4, 32), "bfloat16", 1e-5),
    Case("add_layer_norm", (4, 32), "bfloat16", 1e-5, residual_dtype="float32", norm_input="exact"),
    Case("add_rms_norm", (4, 32), "float32", 1e-6, weight_offset=1.0),
    Case("layer_norm", (4, 32), "float32", 1e-5, weight=False),
    Case("batch_norm", (4, 6, 5), "float32", 1e-5, training=True),
    Case("batch_norm", (8, 6), "bfloat16", 1e-5, param_dtype="float32"),
]
ALIASING_RUNS = [(name, case) for name in BACKENDS for case in ALIASING_CASES]


def _context() -> Any:
    return checks.CheckContext(tolerances.read_tolerances(), load_ledger(), timeout=300)


@pytest.mark.parametrize(("name", "case"), ALIASING_RUNS, ids=[f"{n}-{c.id}" for n, c in ALIASING_RUNS])
def test_the_aliasing_check_passes_on_the_reported_buffers(name: str, case: Case) -> None:
    backend = BACKENDS[name]
    result = checks.run_check("aliasing", backend, backend.capabilities(), case, _context())
    assert result.outcome == "passed", result.reason
    assert result.extra["info"]["memory_evidence"] == "buffers()"


@pytest.mark.parametrize("name", list(BACKENDS))
def test_autograd_hands_one_tensor_to_dx_and_dresidual(name: str) -> None:
    """The reason of the declared alias: h = x + residual's AddBackward passes one gradient to both,
    unless a float32 stream makes torch cast x's copy to the activation dtype."""
    same, widened = (
        Case("add_layer_norm", (4, 32), "bfloat16", 1e-5, residual_dtype=r) for r in (None, "float32")
    )
    shared = _run(BACKENDS[name], same, make_inputs(same), grad=True).buffers()
    assert shared["dx"].data_ptr() == shared["dresidual"].data_ptr()
    apart = _run(BACKENDS[name], widened, make_inputs(widened), grad=True).buffers()
    assert apart["dx"].data_ptr() != apart["dresidual"].data_ptr()


class _Undeclared:
    """A torch adapter whose capabilities declare no aliases: the aliasing check must then see dx and
    dresidual share memory through buffers(), and the running statistics updated in place."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.name

    def capabilities(self) -> Any:
        return dataclasses.replace(self.backend.capabilities(), aliases={})

    def prepare(self, case: Case, inputs: Mapping[str, np.ndarray], *, grad: bool) -> Any:
        return self.backend.prepare(case, inputs, grad=grad)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_undeclared_sharing_is_seen_through_buffers(name: str) -> None:
    backend = _Undeclared(BACKENDS[name])
    add = Case("add_rms_norm", (4, 32), "bfloat16", 1e-6)
    result = checks.run_check("aliasing", backend, backend.capabilities(), add, _context())
    assert result.outcome == "failed" and "outputs 'dresidual' and 'dx' share memory" in result.reason
    bn = Case("batch_norm", (4, 6, 5), "float32", 1e-5, training=True)
    result = checks.run_check("aliasing", backend, backend.capabilities(), bn, _context())
    assert result.outcome == "failed" and "output 'running_mean' shares memory with input" in result.reason


@pytest.mark.parametrize("name", list(BACKENDS))
def test_buffers_are_the_tensors_computed_with(name: str) -> None:
    case = Case("batch_norm", (4, 6, 5), "float32", 1e-5, training=True)
    inputs = make_inputs(case, grad=True)
    prepared: Any = BACKENDS[name].prepare(case, inputs, grad=True)
    before = common.to_numpy(prepared.buffers()["running_mean"])
    assert np.array_equal(before, inputs["running_mean"])
    prepared()
    buffers, out = prepared.buffers(), prepared.outputs()
    # The live statistics buffer, updated in place by the call, holds the returned running_mean.
    assert np.array_equal(common.to_numpy(buffers["running_mean"]), out["running_mean"])
    assert not np.array_equal(out["running_mean"], inputs["running_mean"])
    assert {"x", "weight", "bias", "dy", "y", "dx", "dweight", "dbias"} <= set(buffers)
    assert np.array_equal(common.to_numpy(buffers["dx"]), out["dx"])
    assert np.array_equal(common.to_numpy(buffers["x"]), inputs["x"])


class _GroupNormWithoutBiasArgument(torch.nn.GroupNorm):
    """nn.GroupNorm as torch releases before the ``bias=`` argument build it (torch 2.11 and older)."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None):
        super().__init__(num_groups, num_channels, eps, affine, device=device, dtype=dtype)


@pytest.mark.parametrize("bias", [True, False])
def test_modules_without_a_bias_argument_compute_the_same(bias):
    """torch-nn passes ``bias=`` only where the installed torch's module takes it; elsewhere the bias
    parameter is removed, which gives the same module (the H200 image's torch 2.11 has no ``bias=``)."""
    from backends.torch.modules import with_bias

    case = Case("group_norm", (2, 6, 5), "float32", 1e-5, bias=bias, num_groups=3)
    new = with_bias(torch.nn.GroupNorm, case, 3, 6, eps=1e-5, affine=True)
    old = with_bias(_GroupNormWithoutBiasArgument, case, 3, 6, eps=1e-5, affine=True)
    assert (old.bias is None) == (new.bias is None) == (not bias)
    x = torch.randn(2, 6, 5)
    with torch.no_grad():
        old.weight.copy_(torch.linspace(0.5, 1.5, 6))
        new.weight.copy_(old.weight)
    assert torch.equal(old(x), new(x))
