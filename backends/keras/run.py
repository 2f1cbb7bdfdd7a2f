"""Run a Plan with the Keras of this process: build the layer under its dtype policy, load its
variables, and hand it to the runner of Keras' backend (torch autograd, or jax.vjp over a stateless
call). Imported only once this process's Keras backend is settled (KERAS_BACKEND): importing keras
fixes it for the life of the process.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol

import keras
import numpy as np

from backends.keras.plan import Plan
from conformance.adapter.backend import Outputs, Unsupported
from conformance.model.dtypes import numpy_dtype

Info = dict[str, str | int | float | bool]
# Contract outputs of BatchNormalization's training update <- the Keras variables they are.
STATS: dict[str, str] = {"running_mean": "moving_mean", "running_var": "moving_variance"}
# The arrays a runner gets besides the plan's variables, in the order its step takes them (those a case
# lacks are None): x, the add ops' residual, and with gradients dy and the add ops' dresidual_out.
ARRAYS = ("x", "residual", "dy", "dresidual_out")
# The contract's input name of each differentiated variable, by the output that is its gradient.
PARAMS: dict[str, str] = {"dweight": "weight", "dbias": "bias"}
# The module that runs a built layer on each Keras backend.
RUNNERS: dict[str, str] = {"torch": "backends.keras.on_torch", "jax": "backends.keras.on_jax"}


class Runner(Protocol):
    """A prepared case in the Keras process (the Prepared protocol plus ``info``)."""

    def __call__(self) -> None: ...

    def synchronize(self) -> None: ...

    def outputs(self) -> Outputs: ...

    def info(self) -> Info: ...


def backend() -> str:
    """This process's Keras backend ("torch", "jax", ...)."""
    return str(keras.config.backend())


def runner(plan: Plan, arrays: Mapping[str, np.ndarray], grad: bool) -> Runner:
    """Build and warm up ``plan`` on this process's Keras backend; ``arrays``: x, residual, dy."""
    name = RUNNERS.get(backend())
    if name is None:
        raise Unsupported(f"no runner for Keras backend {backend()!r} (runners: {', '.join(RUNNERS)})")
    module = importlib.import_module(name)
    built: Runner = module.Runner(plan, arrays, grad)
    return built


def build_layer(plan: Plan) -> Any:
    """The plan's layer, built for x's shape under its dtype policy, its variables loaded."""
    cls = getattr(keras.layers, plan.layer, None)
    if cls is None:
        # RMSNormalization arrived in Keras 3.9.
        raise Unsupported(f"keras {keras.__version__} has no keras.layers.{plan.layer}")
    layer = cls(**plan.kwargs, dtype=keras.DTypePolicy(plan.policy))
    layer.build(plan.shape)
    names = {v.name for v in layer.variables}
    if names != set(plan.variables):
        raise RuntimeError(
            f"{plan.layer} has variables {sorted(names)}; the plan sets {sorted(plan.variables)}"
        )
    for variable in layer.variables:
        variable.assign(plan.variables[variable.name])
    return layer


def describe(plan: Plan) -> str:
    """The layer as a call, for info(): ``BatchNormalization(axis=1, epsilon=1e-05, ...)``."""
    args = ", ".join(f"{k}={v!r}" for k, v in plan.kwargs.items())
    return f"keras.layers.{plan.layer}({args}, dtype={plan.policy!r})"


def info(plan: Plan) -> Info:
    """What every runner reports: Keras' version and backend, the policy and the layer built."""
    return {
        "keras": keras.__version__,
        "keras_backend": backend(),
        "dtype_policy": plan.policy,
        "variable_dtype": plan.variable_dtype,
        "layer": describe(plan),
    }


def residual_sum(plan: Plan, x: Any, residual: Any) -> tuple[Any, Any]:
    """(residual_out, what the layer reads) of the add ops' h = x + residual, written with keras.ops as
    a pre-norm block is: the sum in the plan's sum dtype (x cast up first under a float32 stream; both
    cast up for an exact sum), stored in the stream's dtype (a no-op unless the sum is exact)."""
    total = keras.ops.add(keras.ops.cast(x, plan.sum_dtype), keras.ops.cast(residual, plan.sum_dtype))
    return keras.ops.cast(total, plan.stream_dtype), total


def activation(plan: Plan, y: Any) -> Any:
    """y in the activation dtype: a norm layer under a float32 policy (Plan.casts) returns float32."""
    return keras.ops.cast(y, plan.casts["y"]) if "y" in plan.casts else y


def returned(plan: Plan, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Host outputs in the dtypes the case asks for where the layer's policy computes others
    (Plan.casts: the gradients of parameters held in float32 variables, rounded once)."""
    return {k: v.astype(numpy_dtype(plan.casts[k])) if k in plan.casts else v for k, v in outputs.items()}


def call_kwargs(plan: Plan) -> dict[str, bool]:
    """BatchNormalization's ``training`` flag; the other layers' call() takes none."""
    return {} if plan.training is None else {"training": plan.training}
