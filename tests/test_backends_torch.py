"""The built-in torch adapters: output keys, shapes and dtypes, repeatability, untouched inputs, and
agreement with a float64 torch autograd reference written here, independently of the adapters."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from conformance.adapter.backend import FEATURES, Backend, Unsupported
from conformance.model.case import Case
from conformance.model.dtypes import numpy_dtype, unit_roundoff
from conformance.model.inputs import make_inputs

torch = pytest.importorskip("torch")
common = pytest.importorskip("backends._torch_common")
torch_eager = pytest.importorskip("backends.torch_eager")
torch_nn = pytest.importorskip("backends.torch_nn")

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
    assert caps.ops == {"layer_norm", "rms_norm", "batch_norm", "add_rms_norm", "group_norm", "instance_norm"}
    assert caps.dtypes == {"float64", "float32", "float16", "bfloat16"}
    assert caps.features <= set(FEATURES) and "backward" in caps.features
    # InstanceNorm's running statistics and the channels-last layout (tests/test_backends_torch_groups.py).
    assert {"running_stats", "channels_last"} <= caps.features
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
