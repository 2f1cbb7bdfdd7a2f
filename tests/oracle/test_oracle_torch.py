"""The oracle agrees with torch float64 autograd on forward outputs, statistics and gradients."""

from __future__ import annotations

import math
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
    Case("group_norm", (2, 6, 5), "float64", 1e-5, num_groups=3),
    Case("group_norm", (3, 12), "float64", 1e-5, num_groups=2),
    Case("group_norm", (2, 4, 3, 5), "float64", 1e-5, num_groups=1, weight=False, bias=False),
    Case("group_norm", (2, 6, 4), "float64", 1e-5, num_groups=6, bias=False, dist="near_constant"),
    Case("group_norm", (2, 8, 3, 4), "float32", 1e-5, num_groups=2, layout="channels_last"),
    Case("group_norm", (2, 4, 2, 3, 2), "bfloat16", 1e-5, num_groups=2, layout="channels_last"),
    Case("group_norm", (2, 8, 25), "float16", 1e-5, num_groups=4, param_dtype="float32", dist="outlier"),
    Case("instance_norm", (2, 3, 6), "float64", 1e-5),
    Case("instance_norm", (2, 3, 4, 5), "float64", 1e-5, weight=False, bias=False),
    Case("instance_norm", (2, 2, 3, 4, 5), "float32", 1e-5, layout="channels_last"),
    Case("instance_norm", (2, 3, 6), "float64", 1e-5, track_running_stats=True),
    Case("instance_norm", (2, 3, 4, 5), "bfloat16", 1e-5, track_running_stats=True, bias=False),
    Case("instance_norm", (4, 3, 10), "float64", 1e-5, training=True, track_running_stats=True),
    Case(
        "instance_norm", (2, 3, 4, 5), "float64", 1e-5, training=True, track_running_stats=True, momentum=0.5
    ),
    Case("instance_norm", (3, 2, 6), "float32", 1e-5, training=True, track_running_stats=True, momentum=None),
    Case("add_layer_norm", (3, 5), "float64", 1e-5),
    Case("add_layer_norm", (4, 16), "bfloat16", 1e-5, dist="offset"),
    Case("add_layer_norm", (4, 16), "bfloat16", 1e-5, norm_input="exact", dist="near_constant"),
    Case("add_rms_norm", (3, 5), "float64", 1e-6, weight_offset=1.0),
    Case("add_rms_norm", (4, 16), "float16", 1e-6, residual_dtype="float32"),
]


def tensors(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """float64 leaf tensors of the rounded inputs; x and parameters track gradients."""
    return {
        name: torch.tensor(
            values.astype(np.float64), requires_grad=name in ("x", "residual", "weight", "bias")
        )
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


def in_layout(case: Case, x: Any) -> Any:
    """x in the case's memory layout (the values, and so the oracle, do not depend on it)."""
    if case.layout != "channels_last":
        return x
    return x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)


def detached(t: dict[str, Any], name: str) -> Any:
    return t[name].detach() if name in t else None


def group_norm(case: Case, t: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    x = in_layout(case, t["x"])
    n, c, spatial = case.shape[0], case.shape[1], math.prod(case.shape[2:])
    plain = (x.detach(), detached(t, "weight"), detached(t, "bias"))
    _, mean, rstd = torch.ops.aten.native_group_norm(*plain, n, c, spatial, case.groups, case.eps)
    return F.group_norm(x, case.groups, t.get("weight"), t.get("bias"), case.eps), {
        "mean": mean,
        "rstd": rstd,
    }


def instance_norm(case: Case, t: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    # F.instance_norm updates the running tensors in place when it uses instance statistics; its
    # momentum is a number, and the first cumulative-average step (momentum None) has factor 1.
    x = in_layout(case, t["x"])
    momentum = 1.0 if case.momentum is None else case.momentum
    running: dict[str, Any] = {
        name: t[name].detach().clone() for name in ("running_mean", "running_var") if name in t
    }
    y = F.instance_norm(
        x,
        running.get("running_mean"),
        running.get("running_var"),
        t.get("weight"),
        t.get("bias"),
        use_input_stats=case.uses_batch_stats,
        momentum=momentum,
        eps=case.eps,
    )
    extra = dict(running) if case.training else {}
    if case.uses_batch_stats:
        # torch computes instance statistics as BatchNorm statistics of x seen as (1, N * C, spatial).
        flat = x.detach().reshape(1, case.shape[0] * case.shape[1], -1)
        _, mean, rstd = torch.ops.aten.native_batch_norm(flat, None, None, None, None, True, 0.0, case.eps)
        extra = {**extra, "mean": mean.reshape(case.shape[:2]), "rstd": rstd.reshape(case.shape[:2])}
    return y, extra


def add_norm(case: Case, t: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The sum stored in the stream's dtype, then the norm of the stored or the exact sum. The rounding
    is added as a constant, so it has derivative 1 and the gradient stays float64 (a cast round trip
    would round the gradient to the stream's dtype on its way back)."""
    exact = t["x"] + t["residual"]
    rounded = exact.detach().to(getattr(torch, case.stream_dtype)).to(torch.float64)
    stored = exact + (rounded - exact.detach())
    read = stored if case.norm_input == "rounded" else exact
    base = layer_norm if case.op == "add_layer_norm" else rms_norm
    y, extra = base(case, {**t, "x": read})
    return y, {**extra, "residual_out": stored}


TORCH_OPS = {
    "add_layer_norm": add_norm,
    "add_rms_norm": add_norm,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "batch_norm": batch_norm,
    "group_norm": group_norm,
    "instance_norm": instance_norm,
}
GRADIENT_OF = {"x": "dx", "residual": "dresidual", "weight": "dweight", "bias": "dbias"}


def torch_outputs(case: Case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    t = tensors(inputs)
    y, extra = TORCH_OPS[case.op](case, t)
    loss = (y * t["dy"]).sum()
    if "dresidual_out" in t:
        # The next layer reads residual_out too: its cotangent joins the loss.
        loss = loss + (extra["residual_out"] * t["dresidual_out"]).sum()
    loss.backward()
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


INSTANCE_MODULES = {3: "InstanceNorm1d", 4: "InstanceNorm2d", 5: "InstanceNorm3d"}


def instance_module(case: Case, inputs: dict[str, np.ndarray], momentum: float | None) -> Any:
    """torch.nn.InstanceNorm*d with running statistics and the case's affine form, loaded with its inputs."""
    module = getattr(torch.nn, INSTANCE_MODULES[len(case.shape)])(
        case.shape[1],
        eps=case.eps,
        momentum=momentum,
        affine=case.weight,
        track_running_stats=True,
        bias=case.bias,
        dtype=torch.float64,
    )
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            if name in inputs:
                getattr(module, name).copy_(torch.from_numpy(inputs[name].astype(np.float64)))
    return module.train(case.training)


@pytest.mark.parametrize(
    "case",
    [
        Case(
            "instance_norm",
            (4, 3, 5),
            "float64",
            1e-5,
            training=True,
            track_running_stats=True,
            momentum=0.25,
        ),
        Case(
            "instance_norm",
            (2, 3, 4, 5),
            "float64",
            1e-5,
            training=True,
            track_running_stats=True,
            bias=False,
        ),
        Case(
            "instance_norm",
            (2, 2, 3, 4, 5),
            "float32",
            1e-3,
            training=True,
            track_running_stats=True,
            momentum=1.0,
        ),
        Case("instance_norm", (4, 3, 5), "float64", 1e-5, track_running_stats=True),
        Case(
            "instance_norm",
            (2, 3, 4, 5),
            "bfloat16",
            1e-5,
            track_running_stats=True,
            weight=False,
            bias=False,
        ),
    ],
    ids=lambda case: case.id,
)
def test_matches_torch_instance_norm_module_with_running_stats(case: Case) -> None:
    """nn.InstanceNorm*d(track_running_stats=True) with a numeric momentum: train and eval steps."""
    inputs = make_inputs(case)
    module = instance_module(case, inputs, case.momentum)
    x = torch.tensor(inputs["x"].astype(np.float64), requires_grad=True)
    y = module(x)
    (y * torch.from_numpy(inputs["dy"].astype(np.float64))).sum().backward()
    expected = {"y": y.detach().numpy(), "dx": x.grad.numpy()}
    expected |= {
        f"d{name}": getattr(module, name).grad.numpy() for name in ("weight", "bias") if name in inputs
    }
    if case.training:
        expected |= {name: getattr(module, name).numpy() for name in ("running_mean", "running_var")}
    actual = evaluate(case, inputs, grad=True)
    assert set(expected) == set(actual) - {"mean", "rstd"}
    for name, values in expected.items():
        assert_close(name, actual[name], values)


def test_instance_norm_module_momentum_none_keeps_its_running_stats() -> None:
    """nn.InstanceNorm*d passes momentum None on as 0.0, so its running statistics never move; the
    reference's cumulative average (first step: factor 1) replaces them. A real deviation that adapters
    built on the module report; the functional form with momentum 1.0 is the reference's step."""
    case = Case(
        "instance_norm", (4, 3, 5), "float64", 1e-5, training=True, track_running_stats=True, momentum=None
    )
    inputs = make_inputs(case, grad=False)
    module = instance_module(case, inputs, None)
    with torch.no_grad():
        module(torch.from_numpy(inputs["x"]))
    actual = evaluate(case, inputs, grad=False)
    for name in ("running_mean", "running_var"):
        np.testing.assert_array_equal(getattr(module, name).numpy(), inputs[name])
        assert np.max(np.abs(actual[name] - inputs[name])) > 1e-3 * np.max(np.abs(inputs[name]))


@pytest.mark.parametrize(
    "case",
    [
        Case("group_norm", (2, 6, 5), "float64", 1e-5, num_groups=3),
        Case("group_norm", (2, 8, 3, 4), "float32", 1e-6, num_groups=8, layout="channels_last"),
        Case("group_norm", (3, 12), "float64", 1e-5, num_groups=3, weight=False, bias=False),
    ],
    ids=lambda case: case.id,
)
def test_matches_torch_group_norm_module(case: Case) -> None:
    inputs = make_inputs(case)
    module = torch.nn.GroupNorm(
        case.groups, case.shape[1], eps=case.eps, affine=case.weight, dtype=torch.float64
    )
    if case.weight:
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(inputs["weight"].astype(np.float64)))
            module.bias.copy_(torch.from_numpy(inputs["bias"].astype(np.float64)))
    x = torch.tensor(inputs["x"].astype(np.float64), requires_grad=True)
    y = module(in_layout(case, x))
    (y * torch.from_numpy(inputs["dy"].astype(np.float64))).sum().backward()
    expected = {"y": y.detach().numpy(), "dx": x.grad.numpy()}
    expected |= {f"d{name}": getattr(module, name).grad.numpy() for name in ("weight", "bias") if case.weight}
    actual = evaluate(case, inputs, grad=True)
    for name, values in expected.items():
        assert_close(name, actual[name], values)
