"""Keras on its JAX backend: the layer's ``stateless_call`` under jax.jit (as Keras' own JAX trainer
runs it), gradients by jax.vjp over it (the add ops: wrt x, residual and the variables, with the
cotangents dy and dresidual_out), BatchNorm's updated statistics from its returned state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from backends.common import jax_support as jc
from backends.keras import run
from backends.keras.plan import Plan
from conformance.adapter.backend import Outputs

# Compiled steps by the plan's structure: the step takes every value (variables, statistics, x, dy) as
# an argument, so cases that differ only in values (distribution, seed) or in the check that prepares
# them (forward, determinism, inputs_unchanged) reuse one executable instead of compiling again.
CACHE_SIZE = 256
_COMPILED = jc.Executables(CACHE_SIZE)


def _structure(plan: Plan) -> str:
    """Everything the compiled step depends on besides values: the layer as built, shapes, dtypes."""
    fields = (plan.layer, sorted(plan.kwargs.items()), plan.policy, plan.shape, plan.dtype)
    residual = (plan.residual, plan.stream_dtype, plan.sum_dtype, sorted(plan.casts.items()))
    return repr((*fields, sorted(plan.variables), sorted(plan.grads.items()), plan.training, residual))


class Runner:
    """One case on Keras' JAX backend, compiled in prepare(); each call is the compiled step only."""

    def __init__(self, plan: Plan, arrays: Mapping[str, np.ndarray], grad: bool) -> None:
        start = time.perf_counter()
        # Before any variable or input is made: without x64 a float64 case would silently run in
        # float32 (JAX canonicalizes float64 to float32), Keras' float64 variables included.
        jc.enable_x64()
        self._plan = plan
        layer = run.build_layer(plan)
        trainable = [v.value for v in layer.trainable_variables]
        # Every call passes the loaded statistics in: the stateless call never changes them, so each
        # call starts from the prepared state by construction.
        state = [v.value for v in layer.non_trainable_variables]
        # x, and as the case has them residual, dy, dresidual_out (absent ones are None in the step).
        self._inputs = {name: jc.to_jax(arrays[name]) for name in run.ARRAYS if name in arrays}
        self._args = (trainable, state, *(self._inputs.get(name) for name in run.ARRAYS))
        # The contract's parameter inputs, as the variable values the layer reads (for buffers()).
        positions = {v.name: i for i, v in enumerate(layer.trainable_variables)}
        self._inputs.update({run.PARAMS[out]: trainable[positions[name]] for out, name in plan.grads.items()})
        self._build_s = time.perf_counter() - start
        compiled, self._cached = _COMPILED.get(
            (_structure(plan), grad), lambda: jax.jit(_step(layer, plan)).lower(*self._args).compile()
        )
        self._compiled = compiled.executable
        # What this prepare() spent compiling: 0 when the structure's executable was cached.
        self._compile_s = 0.0 if self._cached else compiled.compile_s
        self._results: dict[str, Any] = {}
        start = time.perf_counter()
        self()  # warm-up: the first run of the executable, never timed
        self.synchronize()
        self._warmup_s = time.perf_counter() - start

    def __call__(self) -> None:
        self._results = self._compiled(*self._args)

    def synchronize(self) -> None:
        jax.block_until_ready(self._results)  # type: ignore[no-untyped-call]

    def outputs(self) -> Outputs:
        if not self._results:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        return run.returned(self._plan, {name: jc.to_numpy(value) for name, value in self._results.items()})

    def buffers(self) -> dict[str, tuple[int, int]]:
        """The device buffers the executable reads and (after a call) writes, for the aliasing check."""
        return jc.buffers(self._inputs, self._results)

    def info(self) -> run.Info:
        return {
            **run.info(self._plan),
            **jc.versions(),
            "jit": True,
            "compile_cache": "hit" if self._cached else "miss",
            "build_s": round(self._build_s, 4),
            "compile_s": round(self._compile_s, 4),
            "warmup_s": round(self._warmup_s, 4),
        }


def _step(layer: Any, plan: Plan) -> Any:
    """The function jit compiles: (trainable, state, x, residual, dy, dresidual_out) -> the outputs."""
    trainable_names = [v.name for v in layer.trainable_variables]
    state_names = [v.name for v in layer.non_trainable_variables]
    grads = {out: trainable_names.index(name) for out, name in plan.grads.items()}
    kwargs = run.call_kwargs(plan)

    def forward(trainable: Any, state: Any, x: Any, residual: Any) -> tuple[tuple[Any, ...], Any]:
        """((y,) or (y, residual_out), the layer's new state)."""
        if residual is None:
            y, new_state = layer.stateless_call(trainable, state, x, **kwargs)
            return (y,), new_state
        stored, read = run.residual_sum(plan, x, residual)
        y, new_state = layer.stateless_call(trainable, state, read, **kwargs)
        return (run.activation(plan, y), stored), new_state

    def step(
        trainable: Any, state: Any, x: Any, residual: Any, dy: Any, dresidual_out: Any
    ) -> dict[str, Any]:
        if dy is None:
            primal, new_state = forward(trainable, state, x, residual)
            out = dict(zip(("y", "residual_out"), primal, strict=False))
        else:
            # residual None (no add) is an empty pytree: its cotangent comes back None.
            primal, vjp, new_state = jax.vjp(
                lambda x_, t_, r_: forward(t_, state, x_, r_), x, trainable, residual, has_aux=True
            )
            dx, dtrainable, dresidual = vjp((dy,) if residual is None else (dy, dresidual_out))
            out = {
                **dict(zip(("y", "residual_out"), primal, strict=False)),
                "dx": dx,
                **({} if dresidual is None else {"dresidual": dresidual}),
                **{name: dtrainable[i] for name, i in grads.items()},
            }
        if plan.training:
            out.update({o: new_state[state_names.index(name)] for o, name in run.STATS.items()})
        return out

    return step
