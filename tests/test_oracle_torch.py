"""The oracle agrees with torch float64 autograd on forward outputs, statistics and gradients."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conformance.model.case import Case
from conformance.model.inputs import make_inputs
from conformance.oracle import evaluate

torch = pytest.importorskip("torch")
F = torch.nn.functional

# Norm-wise relative difference between two float64 implementations that sum in different orders
# (torch's cascaded row moments vs NumPy's pairwise sums): a few dozen roundings of ~1e-16. Cases stay
# well conditioned: where rounding in x is amplified by rstd (constant rows, huge offsets) torch's
# plain mean drifts past this while the oracle stays exact; the closed-form tests cover those.
TORCH_TOLERANCE = 1e-13

CASES = [
    Case("layer_norm", (3, 5), "float64", 1e-5),
    Case("layer_norm", (2, 3, 4), "float64", 1e-5, norm_ndim=2),
    Case("layer_norm", (3, 5), "float64", 1e-5, weight=False, bias=False),
    Case("layer_norm", (3, 5), "float64", 1e-5, bias=False, dist="near_constant"),
    Case("layer_norm", (4, 16), "bfloat16", 1e-5, param_dtype="float32", dist="outlier"),
    Case("rms_norm", (3, 5), "float64", 1e-6),
    Case("rms_norm", (2, 3, 4), "float64", 1e-6, norm_ndim=2, weight_offset=1.0),
    Case("rms_norm", (3, 5), "float64", 1e-6, weight=False),
    Case("rms_norm", (4, 16), "float16", 1e-5, dist="zeros"),
    Case("batch_norm", (4, 3), "float64", 1e-5, training=True),
    Case("batch_norm", (2, 3, 4), "float64", 1e-5, training=True, momentum=0.25, dist="near_constant"),
    Case("batch_norm", (2, 3, 4), "float64", 1e-5, training=True, weight=False, bias=False),
    Case("batch_norm", (3, 2, 2, 2), "float32", 1e-5, training=True),
    Case("batch_norm", (4, 3), "float64", 1e-5),
    Case("batch_norm", (2, 3, 2, 2), "bfloat16", 1e-3, bias=False),
]


def tensors(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """float64 leaf tensors of the rounded inputs; x and parameters track gradients."""
    return {
        name: torch.tensor(values.astype(np.float64), requires_grad=name in ("x", "weight", "bias"))
        for name, values in inputs.items()
    }


def layer_norm(case: Case, t: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    normalized = case.param_shape
    args = (t["x"], normalized, t.get("weight"), t.get("bias"), case.eps)
    _, mean, rstd = torch.ops.aten.native_layer_norm(*args)
    return F.layer_norm(*args), {"mean": mean, "rstd": rstd}


def rms_norm(case: Case, t: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    scale = case.weight_offset + t["weight"] if case.weight else None
    _, rstd = torch.ops.aten._fused_rms_norm(t["x"], list(case.param_shape), scale, case.eps)
    return F.rms_norm(t["x"], case.param_shape, scale, case.eps), {"rstd": rstd}


def batch_norm(case: Case, t: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    # F.batch_norm updates the running tensors in place; the first cumulative-average step
    # (momentum None, num_batches_tracked 0 -> 1) uses factor 1.
    momentum = 1.0 if case.momentum is None else case.momentum
    running = {name: t[name].detach().clone() for name in ("running_mean", "running_var")}
    args = (t["x"], running["running_mean"], running["running_var"], t.get("weight"), t.get("bias"))
    y = F.batch_norm(*args, case.training, momentum, case.eps)
    if not case.training:
        return y, {}
    detached = [None if a is None else a.detach().clone() for a in args]
    _, mean, rstd = torch.ops.aten.native_batch_norm(*detached, True, momentum, case.eps)
    return y, {**running, "mean": mean, "rstd": rstd}


TORCH_OPS = {"layer_norm": layer_norm, "rms_norm": rms_norm, "batch_norm": batch_norm}
GRADIENT_OF = {"x": "dx", "weight": "dweight", "bias": "dbias"}


def torch_outputs(case: Case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    t = tensors(inputs)
    y, extra = TORCH_OPS[case.op](case, t)
    (y * t["dy"]).sum().backward()
    out = {"y": y, **extra}
    out.update({GRADIENT_OF[name]: t[name].grad for name in GRADIENT_OF if name in t})
    return {name: value.detach().numpy() for name, value in out.items()}


def assert_close(name: str, actual: np.ndarray, expected: np.ndarray) -> None:
    error = np.max(np.abs(actual - expected))
    scale = max(np.max(np.abs(expected)), np.finfo(np.float64).tiny)
    assert error <= TORCH_TOLERANCE * scale, f"{name}: norm-wise error {error / scale:.3g}"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_matches_torch_float64_autograd(case: Case) -> None:
    inputs = make_inputs(case)
    actual = evaluate(case, inputs, grad=True)
    expected = torch_outputs(case, inputs)
    assert set(actual) == set(expected)
    for name, values in expected.items():
        # torch keeps reduced dims as size 1 (LN/RMS mean, rstd); the contract drops them.
        assert_close(name, actual[name], values.reshape(actual[name].shape))


def test_momentum_none_matches_torch_module() -> None:
    """The cumulative average as torch.nn.BatchNorm1d runs it, not as the oracle assumes it."""
    case = Case("batch_norm", (4, 3, 5), "float64", 1e-5, training=True, momentum=None)
    inputs = make_inputs(case, grad=False)
    module = torch.nn.BatchNorm1d(3, eps=case.eps, momentum=None, dtype=torch.float64)
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(module, name).copy_(torch.from_numpy(inputs[name]))
        y = module.train()(torch.from_numpy(inputs["x"]))
    actual = evaluate(case, inputs, grad=False)
    assert_close("y", actual["y"], y.numpy())
    for name in ("running_mean", "running_var"):
        assert_close(name, actual[name], getattr(module, name).numpy())
