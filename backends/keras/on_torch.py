"""Keras on its torch backend: the layer called eagerly, gradients by torch autograd through the call."""

from __future__ import annotations

import time
from collections.abc import Mapping

import keras
import numpy as np
import torch

from backends.common import torch_support as tc
from backends.keras import run
from backends.keras.plan import Plan
from conformance.adapter.backend import Outputs


class Runner:
    """One case on Keras' torch backend; every call starts from the loaded moving statistics."""

    def __init__(self, plan: Plan, arrays: Mapping[str, np.ndarray], grad: bool) -> None:
        start = time.perf_counter()
        tc.threads()
        self._plan = plan
        self._layer = run.build_layer(plan)
        variables = {v.name: v for v in self._layer.variables}
        # Keras' torch backend picks its device (CUDA when available); the inputs follow it.
        dev = keras.ops.zeros(()).device
        self._device = dev
        self._x = tc.to_torch(arrays["x"], dev).requires_grad_(grad)
        self._residual = tc.to_torch(arrays["residual"], dev).requires_grad_(grad) if plan.residual else None
        self._dy = tc.to_torch(arrays["dy"], dev) if grad else None
        # The add ops' second cotangent: the next layer reads residual_out too.
        self._dresidual_out = tc.to_torch(arrays["dresidual_out"], dev) if grad and plan.residual else None
        # The torch Parameters behind the Keras variables: autograd differentiates the call w.r.t. them.
        params = {out: variables[name].value for out, name in plan.grads.items()}
        self._params = {run.PARAMS[out]: value for out, value in params.items()}
        leaves = {"dx": self._x, "dresidual": self._residual}
        self._wrt = {**{k: v for k, v in leaves.items() if v is not None}, **params}
        self._stats = {out: variables[name] for out, name in run.STATS.items() if plan.training}
        self._initial = {out: v.value.detach().clone() for out, v in self._stats.items()}
        self._results: dict[str, torch.Tensor] = {}
        self._build_s = time.perf_counter() - start
        start = time.perf_counter()
        self()  # warm-up: the first call pays torch's and Keras' lazy initialisation, never timed
        self.synchronize()
        self._warmup_s = time.perf_counter() - start

    def _forward(self) -> dict[str, torch.Tensor]:
        """y, and residual_out for the add ops: the outputs the cotangents dy, dresidual_out belong to."""
        kwargs = run.call_kwargs(self._plan)
        if self._residual is None:
            return {"y": self._layer(self._x, **kwargs)}
        stored, read = run.residual_sum(self._plan, self._x, self._residual)
        return {"y": run.activation(self._plan, self._layer(read, **kwargs)), "residual_out": stored}

    def __call__(self) -> None:
        for out, variable in self._stats.items():
            # Every call starts from the prepared statistics, so repeated calls give the same update.
            variable.assign(self._initial[out])
        if self._dy is None:
            with torch.no_grad():
                self._results = self._forward()
            return
        with torch.enable_grad():
            primal = self._forward()
            cotangents = {"y": self._dy, "residual_out": self._dresidual_out}
            # autograd.grad returns fresh tensors: nothing accumulates in .grad across calls. For the add
            # ops dx and dresidual come back as ONE tensor where h = x + residual adds in one dtype
            # (AddBackward passes dL/dh to both): Capabilities.aliases declares it.
            grads = torch.autograd.grad(
                list(primal.values()),
                list(self._wrt.values()),
                grad_outputs=[cotangents[name] for name in primal],
            )
        self._results = {
            **{name: value.detach() for name, value in primal.items()},
            **dict(zip(self._wrt, grads, strict=True)),
        }

    def synchronize(self) -> None:
        tc.synchronize(self._device)

    def outputs(self) -> Outputs:
        if not self._results:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        out = {k: tc.to_numpy(v) for k, v in self._results.items()}
        out.update({k: tc.to_numpy(v.value) for k, v in self._stats.items()})
        return run.returned(self._plan, out)

    def buffers(self) -> dict[str, torch.Tensor]:
        """The tensors the layer reads and (after a call) returns, for the aliasing check. BatchNorm's
        moving statistics are left out: Keras updates them in place by design (its layer state, reset
        from a prepared copy at every call), and they are both an input and an output name."""
        inputs = {
            "x": self._x,
            "residual": self._residual,
            "dy": self._dy,
            "dresidual_out": self._dresidual_out,
        }
        found = {**{k: v for k, v in inputs.items() if v is not None}, **self._params}
        return {**found, **self._results}

    def info(self) -> run.Info:
        return {
            **run.info(self._plan),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "build_s": round(self._build_s, 4),
            "warmup_s": round(self._warmup_s, 4),
        }
