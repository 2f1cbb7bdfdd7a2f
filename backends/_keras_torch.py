"""Keras on its torch backend: the layer called eagerly, gradients by torch autograd through the call."""

from __future__ import annotations

import time
from collections.abc import Mapping

import keras
import numpy as np
import torch

from backends import _keras_run as run
from backends import _torch_common as tc
from backends._keras_plan import Plan
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
        self._residual = tc.to_torch(arrays["residual"], dev) if plan.residual else None
        self._dy = tc.to_torch(arrays["dy"], dev) if grad else None
        # The torch Parameters behind the Keras variables: autograd differentiates the call w.r.t. them.
        self._wrt = {"dx": self._x, **{out: variables[name].value for out, name in plan.grads.items()}}
        self._stats = {out: variables[name] for out, name in run.STATS.items() if plan.training}
        self._initial = {out: v.value.detach().clone() for out, v in self._stats.items()}
        self._results: dict[str, torch.Tensor] = {}
        self._build_s = time.perf_counter() - start
        start = time.perf_counter()
        self()  # warm-up: the first call pays torch's and Keras' lazy initialisation, never timed
        self.synchronize()
        self._warmup_s = time.perf_counter() - start

    def _forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        h = self._x if self._residual is None else keras.ops.add(self._x, self._residual)
        y: torch.Tensor = self._layer(h, **run.call_kwargs(self._plan))
        return y, h

    def __call__(self) -> None:
        for out, variable in self._stats.items():
            # Every call starts from the prepared statistics, so repeated calls give the same update.
            variable.assign(self._initial[out])
        if self._dy is None:
            with torch.no_grad():
                y, h = self._forward()
            self._results = {"y": y, "residual_out": h}
            return
        with torch.enable_grad():
            y, h = self._forward()
            # autograd.grad returns fresh tensors: nothing accumulates in .grad across calls.
            grads = torch.autograd.grad(y, list(self._wrt.values()), grad_outputs=self._dy)
        self._results = {
            "y": y.detach(),
            "residual_out": h.detach(),
            **dict(zip(self._wrt, grads, strict=True)),
        }

    def synchronize(self) -> None:
        tc.synchronize(self._device)

    def outputs(self) -> Outputs:
        if not self._results:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        out = {
            k: tc.to_numpy(v) for k, v in self._results.items() if k != "residual_out" or self._plan.residual
        }
        out.update({k: tc.to_numpy(v.value) for k, v in self._stats.items()})
        return out

    def info(self) -> run.Info:
        return {
            **run.info(self._plan),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "build_s": round(self._build_s, 4),
            "warmup_s": round(self._warmup_s, 4),
        }
