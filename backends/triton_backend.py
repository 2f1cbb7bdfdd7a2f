"""triton: normconf's own fused Triton kernels (backends/triton_kernels), gradients by autograd.

Runs natively on a CUDA device; without one, under the Triton interpreter on the CPU
(``TRITON_INTERPRET=1``, set by ``mode.select()`` before Triton is imported). The mode is declared
in the capabilities' notes and recorded in every result's ``extra.info``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from backends.triton_kernels import blocks, mode
from conformance.adapter.backend import BackendUnavailable, Capabilities, Inputs, Outputs
from conformance.model.case import Case

OPS = frozenset({"layer_norm", "rms_norm", "add_rms_norm"})
DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
# Trailing dims are flattened into one row, parameters of any dtype are upcast in the kernels.
FEATURES = frozenset({"backward", "weight_offset", "no_weight", "no_bias", "multi_axis", "param_dtype"})
NOTES = {
    "statistics": "float32 accumulation (float64 when an operand is float64); two-pass variance; "
    "rsqrt with eps inside the root; masked lanes excluded",
    "rows": f"any length: rows longer than {blocks.MAX_BLOCK_N} loop over column chunks",
    "dweight": "per-program partial rows + a second fixed-order reduction kernel: same bits every run",
}


def _mode() -> mode.Mode:
    try:
        return mode.select()
    except (mode.ModeUnavailable, ImportError) as exc:
        raise BackendUnavailable(str(exc)) from exc


class _Prepared:
    """One case on the device; each call runs the fused forward (and the backward through autograd)."""

    def __init__(self, case: Case, inputs: Inputs, grad: bool, run: mode.Mode) -> None:
        import torch

        from backends import _torch_common as common
        from backends.triton_kernels import functions

        self._torch, self._common, self._functions = torch, common, functions
        self.case, self.grad, self.mode = case, grad, run
        self.device = torch.device(run.device)
        self.policy = functions.policy()
        self.t = {name: common.to_torch(value, self.device) for name, value in inputs.items()}
        if grad:
            for name in ("x", "weight", "bias"):
                if name in self.t:
                    self.t[name].requires_grad_(True)
        self.results: dict[str, Any] = {}

    def _forward(self) -> dict[str, Any]:
        c, t, f = self.case, self.t, self._functions
        shape, w = c.param_shape, t.get("weight")
        if c.op == "layer_norm":
            return {"y": f.layer_norm(t["x"], shape, w, t.get("bias"), eps=c.eps, pol=self.policy)}
        if c.op == "rms_norm":
            y = f.rms_norm(t["x"], shape, w, eps=c.eps, weight_offset=c.weight_offset, pol=self.policy)
            return {"y": y}
        y, h = f.add_rms_norm(
            t["x"], t["residual"], shape, w, eps=c.eps, weight_offset=c.weight_offset, pol=self.policy
        )
        return {"y": y, "residual_out": h}

    def __call__(self) -> None:
        torch = self._torch
        if not self.grad:
            with torch.no_grad():
                self.results = self._forward()
            return
        wrt = {"dx": self.t["x"]}
        wrt.update({f"d{name}": self.t[name] for name in ("weight", "bias") if name in self.t})
        with torch.enable_grad():
            out = self._forward()
            # autograd.grad returns fresh gradients: nothing accumulates across calls.
            grads = torch.autograd.grad(out["y"], list(wrt.values()), grad_outputs=self.t["dy"])
        self.results = {k: v.detach() for k, v in out.items()} | dict(zip(wrt, grads, strict=True))

    def synchronize(self) -> None:
        self._common.synchronize(self.device)

    def outputs(self) -> Outputs:
        if not self.results:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        return {name: self._common.to_numpy(value) for name, value in self.results.items()}

    def info(self) -> Mapping[str, str | int | bool]:
        n_rows, n_cols = self.case.rows, math.prod(self.case.param_shape)
        details: dict[str, str | int | bool] = {"mode": self.mode.name, "triton": metadata.version("triton")}
        details.update(blocks.forward(n_rows, n_cols, self.policy).info("forward"))
        if self.grad:
            details.update(blocks.backward(n_rows, n_cols, self.policy).info("backward"))
        return details


class TritonBackend:
    """The fused Triton kernels, native on a GPU or interpreted on the CPU."""

    name = "triton"

    def capabilities(self) -> Capabilities:
        run = _mode()
        import torch

        from backends import _torch_common as common

        dev = torch.device(run.device)
        label = common.device_name(dev) + (" (Triton interpreter)" if run.interpreted else "")
        return Capabilities(
            ops=OPS,
            dtypes=DTYPES,
            features=FEATURES,
            device=run.device,
            device_name=label,
            notes={"triton": metadata.version("triton"), "mode": f"{run.name}: {run.why}", **NOTES},
        )

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> _Prepared:
        return _Prepared(case, inputs, grad, _mode())
