"""triton: normconf's own fused Triton kernels (backends/triton_kernels), gradients by autograd.

Runs natively on a CUDA device; without one, under the Triton interpreter on the CPU
(``TRITON_INTERPRET=1``, set by ``mode.select()`` before Triton is imported). The mode is declared
in the capabilities' notes and recorded in every result's ``extra.info``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from backends.triton_kernels import blocks, mode
from conformance.adapter.backend import BackendUnavailable, Capabilities, Inputs, Outputs
from conformance.model.case import GROUP_OPS, Case

OPS = frozenset({"layer_norm", "rms_norm", "add_rms_norm", "group_norm", "instance_norm"})
DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
# Trailing dims are flattened into one row, parameters of any dtype are upcast in the kernels;
# InstanceNorm's training step and running statistics (momentum None as its first step) run in the
# kernels. Not channels_last: see NOTES.
FEATURES = frozenset(
    {
        "backward",
        "weight_offset",
        "no_weight",
        "no_bias",
        "multi_axis",
        "param_dtype",
        "training",
        "momentum_none",
        "running_stats",
    }
)
NOTES = {
    "statistics": "float32 accumulation (float64 when an operand is float64); two-pass variance; "
    "rsqrt with eps inside the root; masked lanes excluded",
    "rows": f"any length: rows (and GroupNorm groups) longer than {blocks.MAX_BLOCK_N} loop over chunks",
    "dweight": "per-program partial rows (GroupNorm/InstanceNorm: per (sample, channel) sums) + a second "
    "fixed-order reduction kernel: same bits every run",
    "running_stats": "InstanceNorm's update in a kernel, from the float32 instance means and unbiased "
    "variances the forward computes; momentum=None is the cumulative average's first step, factor 1",
    "channels_last": "not supported: the GroupNorm kernels read each group as one contiguous run of "
    "memory; in channels_last a group is strided by C, and copying x to contiguous first would test "
    "the contiguous kernels, not a channels-last computation",
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
        return _FORWARDS[self.case.op](self)

    def _layer_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        y = self._functions.layer_norm(
            t["x"], c.param_shape, t.get("weight"), t.get("bias"), eps=c.eps, pol=self.policy
        )
        return {"y": y}

    def _rms_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        y = self._functions.rms_norm(
            t["x"], c.param_shape, t.get("weight"), eps=c.eps, weight_offset=c.weight_offset, pol=self.policy
        )
        return {"y": y}

    def _add_rms_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        y, h = self._functions.add_rms_norm(
            t["x"],
            t["residual"],
            c.param_shape,
            t.get("weight"),
            eps=c.eps,
            weight_offset=c.weight_offset,
            pol=self.policy,
        )
        return {"y": y, "residual_out": h}

    def _group_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        y = self._functions.group_norm(
            t["x"], c.groups, t.get("weight"), t.get("bias"), eps=c.eps, pol=self.policy
        )
        return {"y": y}

    def _instance_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        # A training call updates running statistics in place: its own copies, so that every call
        # starts from the prepared values and the inputs stay untouched.
        names = ("running_mean", "running_var")
        stats = [t[name].clone() if c.training else t.get(name) for name in names]
        # momentum=None (the cumulative average) with no batch tracked yet is the factor 1/(0 + 1) = 1:
        # exact for the one step a case takes.
        momentum = 1.0 if c.momentum is None else c.momentum
        y = self._functions.instance_norm(
            t["x"], t.get("weight"), t.get("bias"), *stats,
            use_input_stats=c.uses_batch_stats, momentum=momentum, eps=c.eps, pol=self.policy,
        )  # fmt: skip
        out: dict[str, Any] = {"y": y}
        if c.training:
            out.update(zip(names, stats, strict=True))
        return out

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
        case = self.case
        details: dict[str, str | int | bool] = {"mode": self.mode.name, "triton": metadata.version("triton")}
        if case.op in GROUP_OPS:
            # Group rows (N * G of C/G * spatial values) forward and for dx; channel rows for the sums.
            n_cols = math.prod(case.shape[1:]) // case.groups
            details.update(blocks.forward(case.rows, n_cols, self.policy).info("forward"))
            if self.grad:
                spatial = math.prod(case.shape[2:])
                channel_rows = case.shape[0] * case.shape[1]
                details.update(blocks.forward(channel_rows, spatial, self.policy).info("channel_sums"))
                details.update(blocks.forward(case.rows, n_cols, self.policy).info("backward"))
            return details
        n_rows, n_cols = case.rows, math.prod(case.param_shape)
        details.update(blocks.forward(n_rows, n_cols, self.policy).info("forward"))
        if self.grad:
            details.update(blocks.backward(n_rows, n_cols, self.policy).info("backward"))
        return details


_FORWARDS: dict[str, Callable[[_Prepared], dict[str, Any]]] = {
    "layer_norm": _Prepared._layer_norm,
    "rms_norm": _Prepared._rms_norm,
    "add_rms_norm": _Prepared._add_rms_norm,
    "group_norm": _Prepared._group_norm,
    "instance_norm": _Prepared._instance_norm,
}


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
