"""The oracle's analytic gradients agree with central finite differences of sum(y * dy)."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.model.case import Case
from conformance.model.inputs import make_inputs
from conformance.oracle import evaluate

# Norm-wise relative error allowed between analytic and central-difference gradients: truncation
# (h / sqrt(var + eps))^2 ~ 1e-8 plus cancellation eps64 * |loss| / h ~ 1e-9, with margin.
FD_TOLERANCE = 1e-6
# Step for x relative to sqrt(eps), the smallest scale on which y can vary (near-constant rows).
X_STEP = 1e-4
# Step for weight and bias: the loss is linear in them, so only cancellation matters.
PARAM_STEP = 1e-4
GRADIENT_OF = {"x": "dx", "weight": "dweight", "bias": "dbias"}

CASES = [
    Case("layer_norm", (3, 5), "float64", 1e-5),
    Case("layer_norm", (2, 3, 4), "float64", 1e-5, norm_ndim=2),
    Case("layer_norm", (3, 5), "float64", 1e-5, weight=False, bias=False),
    Case("layer_norm", (3, 5), "float64", 1e-5, bias=False, dist="near_constant"),
    Case("layer_norm", (3, 5), "float64", 1e-5, dist="constant"),
    Case("layer_norm", (2, 6), "bfloat16", 1e-5, param_dtype="float32"),
    Case("rms_norm", (3, 5), "float64", 1e-6),
    Case("rms_norm", (2, 3, 4), "float64", 1e-6, norm_ndim=2, weight_offset=1.0),
    Case("rms_norm", (3, 5), "float64", 1e-6, weight=False),
    Case("rms_norm", (3, 5), "float32", 1e-6, weight_offset=1.0, dist="zeros"),
    Case("batch_norm", (4, 3), "float64", 1e-5, training=True),
    Case("batch_norm", (2, 3, 4), "float64", 1e-5, training=True, momentum=None),
    Case("batch_norm", (2, 3, 4), "float64", 1e-5, training=True, weight=False, bias=False),
    Case("batch_norm", (3, 2, 2, 2), "float64", 1e-5, training=True, dist="constant"),
    Case("batch_norm", (4, 3), "float64", 1e-5),
    Case("batch_norm", (2, 3, 4), "float16", 1e-3, bias=False),
    Case("group_norm", (2, 6, 5), "float64", 1e-5, num_groups=3),
    Case("group_norm", (2, 4, 3, 2), "float64", 1e-5, num_groups=1),
    Case("group_norm", (2, 4, 5), "float64", 1e-5, num_groups=4, weight=False, bias=False),
    Case("group_norm", (3, 6), "float64", 1e-5, num_groups=2, bias=False),
    Case("group_norm", (2, 4, 3), "float64", 1e-5, num_groups=2, dist="constant"),
    Case("group_norm", (2, 4, 6), "float64", 1e-5, num_groups=2, dist="near_constant"),
    Case("group_norm", (2, 4, 2, 3), "bfloat16", 1e-5, num_groups=2, param_dtype="float32"),
    Case("instance_norm", (2, 3, 5), "float64", 1e-5),
    Case("instance_norm", (2, 2, 3, 2), "float64", 1e-5, weight=False, bias=False),
    Case("instance_norm", (2, 2, 2, 2, 2), "float64", 1e-5, dist="constant"),
    Case("instance_norm", (2, 3, 5), "float64", 1e-5, track_running_stats=True),
    Case("instance_norm", (2, 3, 2, 2), "float32", 1e-5, track_running_stats=True, bias=False),
    Case("instance_norm", (2, 3, 5), "float64", 1e-5, training=True, track_running_stats=True, momentum=0.3),
    Case("instance_norm", (3, 2, 4), "float64", 1e-5, training=True, track_running_stats=True, momentum=None),
]


def loss(case: Case, inputs: dict[str, np.ndarray]) -> float:
    return float(np.sum(evaluate(case, inputs, grad=False)["y"] * inputs["dy"]))


def central_difference(case: Case, inputs: dict[str, np.ndarray], name: str, step: float) -> np.ndarray:
    values = inputs[name]
    grad = np.empty_like(values)
    for index in np.ndindex(values.shape):
        original = values[index]
        values[index] = original + step
        up = loss(case, inputs)
        values[index] = original - step
        down = loss(case, inputs)
        values[index] = original
        grad[index] = (up - down) / (2 * step)
    return grad


def assert_close(actual: np.ndarray, expected: np.ndarray, tolerance: float) -> None:
    error = np.max(np.abs(actual - expected))
    scale = max(np.max(np.abs(expected)), np.finfo(np.float64).tiny)
    assert error <= tolerance * scale, f"norm-wise error {error / scale:.3g} > {tolerance:g}"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_gradients_match_finite_differences(case: Case) -> None:
    inputs = {name: values.astype(np.float64) for name, values in make_inputs(case).items()}
    analytic = evaluate(case, inputs, grad=True)
    for name, output in GRADIENT_OF.items():
        if name not in inputs:
            assert output not in analytic
            continue
        step = X_STEP * np.sqrt(case.eps) if name == "x" else PARAM_STEP
        numeric = central_difference(case, inputs, name, step)
        assert analytic[output].shape == numeric.shape
        assert_close(analytic[output], numeric, FD_TOLERANCE)
