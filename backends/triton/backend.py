"""triton: normconf's own fused Triton kernels (backends/triton/kernels), gradients by autograd; and
triton-inplace: the fused add + norm kernels in place, as inference engines run them.

Runs natively on a CUDA device; without one, under the Triton interpreter on the CPU
(``TRITON_INTERPRET=1``, set by ``mode.select()`` before Triton is imported). The mode is declared
in the capabilities' notes and recorded in every result's ``extra.info``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

import numpy as np

from backends.triton.kernels import blocks, mode
from conformance.adapter.backend import BackendUnavailable, Capabilities, Inputs, Outputs, Unsupported
from conformance.model import inputs
from conformance.model.case import (
    ADD_LAYER_NORM,
    ADD_OPS,
    ADD_RMS_NORM,
    GROUP_NORM,
    GROUP_OPS,
    INSTANCE_NORM,
    LAYER_NORM,
    RMS_NORM,
    Case,
)

OPS = frozenset({"layer_norm", "rms_norm", "add_rms_norm", "add_layer_norm", "group_norm", "instance_norm"})
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
        "residual_dtype",
        "exact_sum",
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
    "residual": "add ops: x + residual formed in float32 (float64 for float64), stored once rounded to the "
    "stream's dtype (residual's: the activation dtype, or float32); the norm reads it as stored or, "
    "norm_input exact, the unrounded sum. Backward: dL/dh = the norm's backward of dy + dresidual_out",
    "aliases": "dresidual is dx's tensor when the stream has the activation dtype (one store of dL/dh, "
    "as autograd's own add hands one gradient to both); a float32 stream gets its own float32 buffer",
}
# With one dtype in the stream, x and residual receive the one dL/dh tensor.
ALIASES = {"dresidual": "dx"}


def _mode() -> mode.Mode:
    try:
        return mode.select()
    except (mode.ModeUnavailable, ImportError) as exc:
        raise BackendUnavailable(str(exc)) from exc


class TritonPrepared:
    """One case on the device; each call runs the fused forward (and the backward through autograd)."""

    def __init__(
        self, case: Case, tensors: dict[str, Any], grad: bool, run: mode.Mode, pol: blocks.Policy
    ) -> None:
        """``tensors``: the case's inputs on the run's device (meta tensors when the launches are only
        recorded for ahead-of-time compilation, triton_kernels.aot)."""
        import torch

        from backends.common import torch_support as common
        from backends.triton.kernels import functions

        self._torch, self._common, self._functions = torch, common, functions
        self.case, self.grad, self.mode = case, grad, run
        self.device = torch.device(run.device)
        self.policy = pol
        self.param_shape = case.param_shape  # a property of the case: computed once, not per call
        self.t = tensors
        if grad:
            for name in ("x", "residual", "weight", "bias"):
                if name in self.t:
                    self.t[name].requires_grad_(True)
        # What every gradient call differentiates, with respect to what, and by which cotangents: fixed
        # per case, so made once here rather than on each call (host time is what the calls measure).
        self._wrt = [f"d{name}" for name in ("x", "residual", "weight", "bias") if name in self.t]
        self._inputs = [self.t[name[1:]] for name in self._wrt]
        # The add ops' next layer reads both outputs: each brings its cotangent.
        heads = {"y": "dy", "residual_out": "dresidual_out"} if case.op in ADD_OPS else {"y": "dy"}
        self._heads = tuple(heads)
        self._cotangents = [self.t[d] for d in heads.values()] if grad else []
        self.results: dict[str, Any] = {}

    @classmethod
    def from_inputs(cls, case: Case, inputs: Inputs, grad: bool, run: mode.Mode) -> TritonPrepared:
        """Copies of ``inputs`` on the run's device, launched with this machine's policy."""
        import torch

        from backends.common import torch_support as common
        from backends.triton.kernels import functions

        device = torch.device(run.device)
        tensors = {name: common.to_torch(value, device) for name, value in inputs.items()}
        return cls(case, tensors, grad, run, functions.policy())

    def _forward(self) -> dict[str, Any]:
        return _FORWARDS[self.case.op](self)

    def _layer_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        y = self._functions.layer_norm(
            t["x"], self.param_shape, t.get("weight"), t.get("bias"), eps=c.eps, pol=self.policy
        )
        return {"y": y}

    def _rms_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        y = self._functions.rms_norm(
            t["x"],
            self.param_shape,
            t.get("weight"),
            eps=c.eps,
            weight_offset=c.weight_offset,
            pol=self.policy,
        )
        return {"y": y}

    def _add_rms_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        y, h = self._functions.add_rms_norm(
            t["x"], t["residual"], self.param_shape, t.get("weight"),
            eps=c.eps, weight_offset=c.weight_offset, exact=c.norm_input == "exact", pol=self.policy,
        )  # fmt: skip
        return {"y": y, "residual_out": h}

    def _add_layer_norm(self) -> dict[str, Any]:
        c, t = self.case, self.t
        y, h = self._functions.add_layer_norm(
            t["x"], t["residual"], self.param_shape, t.get("weight"), t.get("bias"),
            eps=c.eps, exact=c.norm_input == "exact", pol=self.policy,
        )  # fmt: skip
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
        with torch.enable_grad():
            out = self._forward()
            # autograd.grad returns fresh gradients: nothing accumulates across calls.
            grads = torch.autograd.grad([out[name] for name in self._heads], self._inputs, self._cotangents)
        results = {k: v.detach() for k, v in out.items()}
        results.update(zip(self._wrt, grads, strict=True))
        self.results = results

    def synchronize(self) -> None:
        self._common.synchronize(self.device)

    def device_timing(self) -> dict[str, float | str] | None:
        """The kernels' time per call apart from the host's, on CUDA (backends/common/device_timing.py);
        None under the interpreter."""
        from backends.common import device_timing

        return device_timing.info(self, self.device)

    def outputs(self) -> Outputs:
        if not self.results:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        return {name: self._common.to_numpy(value) for name, value in self.results.items()}

    def buffers(self) -> Mapping[str, Any]:
        """The tensors the kernels read and write (the aliasing check's evidence): the device copies
        of the inputs and, after a call, the outputs as computed (dx and dresidual one tensor where
        the stream has the activation dtype, declared in ALIASES)."""
        return {**self.t, **self.results}

    def info(self) -> Mapping[str, str | int | bool]:
        case, pol = self.case, self.policy
        details: dict[str, str | int | bool] = {"mode": self.mode.name, "triton": metadata.version("triton")}
        wide = _wide(case)
        if case.op in GROUP_OPS:
            # Group rows (N * G of C/G * spatial values) forward and for dx; channel rows for the sums.
            n_cols = math.prod(case.shape[1:]) // case.groups
            details.update(blocks.forward(case.rows, n_cols, pol, wide=wide).info("forward"))
            if self.grad:
                spatial = math.prod(case.shape[2:])
                channel_rows = case.shape[0] * case.shape[1]
                details.update(blocks.forward(channel_rows, spatial, pol, wide=wide).info("channel_sums"))
                details.update(blocks.forward(case.rows, n_cols, pol, wide=wide).info("backward"))
            return details
        n_rows, n_cols = case.rows, math.prod(case.param_shape)
        details.update(blocks.forward(n_rows, n_cols, pol, wide=wide).info("forward"))
        if self.grad:
            details.update(blocks.backward(n_rows, n_cols, pol, wide=wide).info("backward"))
        return details


def _wide(case: Case) -> bool:
    """The kernels accumulate in float64 when any tensor they are given is float64 (launch.acc_dtype):
    a float64 param_dtype counts only where the case has parameters or running statistics."""
    return any(dtype == "float64" for _, dtype in inputs.specs(case, grad=False).values())


_FORWARDS: dict[str, Callable[[TritonPrepared], dict[str, Any]]] = {
    LAYER_NORM: TritonPrepared._layer_norm,
    RMS_NORM: TritonPrepared._rms_norm,
    ADD_RMS_NORM: TritonPrepared._add_rms_norm,
    ADD_LAYER_NORM: TritonPrepared._add_layer_norm,
    GROUP_NORM: TritonPrepared._group_norm,
    INSTANCE_NORM: TritonPrepared._instance_norm,
}


def _capabilities(
    ops: frozenset[str], features: frozenset[str], notes: Mapping[str, str], aliases: Mapping[str, str]
) -> Capabilities:
    run = _mode()
    import torch

    from backends.common import torch_support as common

    dev = torch.device(run.device)
    label = common.device_name(dev) + (" (Triton interpreter)" if run.interpreted else "")
    return Capabilities(
        ops=ops,
        dtypes=DTYPES,
        features=features,
        device=run.device,
        device_name=label,
        notes={"triton": metadata.version("triton"), "mode": f"{run.name}: {run.why}", **notes},
        aliases=aliases,
    )


class TritonBackend:
    """The fused Triton kernels, native on a GPU or interpreted on the CPU."""

    name = "triton"

    def capabilities(self) -> Capabilities:
        return _capabilities(OPS, FEATURES, NOTES, ALIASES)

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> TritonPrepared:
        return TritonPrepared.from_inputs(case, inputs, grad, _mode())


# ----------------------------------------------------------------------------- triton-inplace

IN_PLACE_FEATURES = frozenset(
    {"weight_offset", "no_weight", "no_bias", "multi_axis", "param_dtype", "exact_sum"}
)
IN_PLACE_NOTES = {
    "in_place": "y is written into x's buffer and residual_out into residual's (vLLM's fused_add_rms_norm "
    "contract); on the CPU those are the very arrays handed to prepare(), on a GPU their device copies. "
    "Each call first restores both from pristine copies, so calls repeat (and benchmarks time that copy "
    "too)",
    "residual_dtype": "not declared: the in-place contract keeps one dtype for x, y and the residual "
    "stream (residual_out overwrites residual); the kernels themselves would take a float32 stream",
    "backward": "not declared: an in-place inference kernel; the inputs autograd would need are overwritten",
    **{k: NOTES[k] for k in ("statistics", "rows", "residual")},
}
IN_PLACE_ALIASES = {"y": "x", "residual_out": "residual"}


def _shared(array: np.ndarray, device: Any) -> Any:
    """The tensor the in-place kernel writes: on the CPU a view of the caller's own array (bfloat16
    through int16: torch.from_numpy knows no ml_dtypes), on a GPU a device copy."""
    import ml_dtypes
    import torch

    from backends.common import torch_support as common

    if device.type != "cpu":
        return common.to_torch(array, device)
    if not (array.flags.writeable and array.flags.c_contiguous):
        raise Unsupported("the in-place kernel writes x and residual: they must be writable, C-contiguous")
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class InPlacePrepared:
    """One add + norm case whose call overwrites x with y and residual with residual_out."""

    def __init__(self, case: Case, tensors: dict[str, Any], run: mode.Mode, pol: blocks.Policy) -> None:
        """``tensors``: x and residual (the buffers the kernel writes), weight and bias if the case has
        them, on the run's device."""
        import torch

        from backends.common import torch_support as common
        from backends.triton.kernels import functions

        self._common, self._functions = common, functions
        self.case, self.mode = case, run
        self.device = torch.device(run.device)
        self.policy = pol
        self.param_shape = case.param_shape  # computed once, not per call
        self.t = {name: tensors[name] for name in ("x", "residual")}
        self.params: dict[str, Any] = {name: tensors[name] for name in ("weight", "bias") if name in tensors}
        self.pristine = {name: tensor.clone() for name, tensor in self.t.items()}
        self.called = False

    @classmethod
    def from_inputs(cls, case: Case, inputs: Inputs, run: mode.Mode) -> InPlacePrepared:
        """x and residual shared with the caller's arrays on the CPU (see _shared), the parameters copied;
        launched with this machine's policy."""
        import torch

        from backends.common import torch_support as common
        from backends.triton.kernels import functions

        device = torch.device(run.device)
        tensors: dict[str, Any] = {name: _shared(inputs[name], device) for name in ("x", "residual")}
        for name in ("weight", "bias"):
            if name in inputs:
                tensors[name] = common.to_torch(inputs[name], device)
        return cls(case, tensors, run, functions.policy())

    def _add_rms_norm(self) -> None:
        c, t = self.case, self.t
        self._functions.add_rms_norm_(
            t["x"], t["residual"], self.param_shape, self.params.get("weight"),
            eps=c.eps, weight_offset=c.weight_offset, exact=c.norm_input == "exact", pol=self.policy,
        )  # fmt: skip

    def _add_layer_norm(self) -> None:
        c, t, p = self.case, self.t, self.params
        self._functions.add_layer_norm_(
            t["x"], t["residual"], self.param_shape, p.get("weight"), p.get("bias"),
            eps=c.eps, exact=c.norm_input == "exact", pol=self.policy,
        )  # fmt: skip

    def restore(self) -> None:
        """The previous call overwrote x and residual: put the inputs as given back."""
        for name, tensor in self.t.items():
            tensor.copy_(self.pristine[name])

    def __call__(self) -> None:
        self.restore()
        IN_PLACE_OPS[self.case.op](self)
        self.called = True

    def synchronize(self) -> None:
        self._common.synchronize(self.device)

    def device_timing(self) -> dict[str, float | str] | None:
        """The kernels' time per call apart from the host's, on CUDA (backends/common/device_timing.py);
        None under the interpreter."""
        from backends.common import device_timing

        return device_timing.info(self, self.device)

    def outputs(self) -> Outputs:
        if not self.called:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        to_numpy = self._common.to_numpy
        return {"y": to_numpy(self.t["x"]), "residual_out": to_numpy(self.t["residual"])}

    def buffers(self) -> Mapping[str, Any]:
        """The buffers the kernel reads and writes: y is x's, residual_out is residual's."""
        return {**self.t, **self.params, "y": self.t["x"], "residual_out": self.t["residual"]}

    def info(self) -> Mapping[str, str | int | bool]:
        n_rows, n_cols = self.case.rows, math.prod(self.case.param_shape)
        details: dict[str, str | int | bool] = {"mode": self.mode.name, "triton": metadata.version("triton")}
        details.update(blocks.forward(n_rows, n_cols, self.policy, wide=_wide(self.case)).info("forward"))
        return details


IN_PLACE_OPS: dict[str, Callable[[InPlacePrepared], None]] = {
    ADD_RMS_NORM: InPlacePrepared._add_rms_norm,
    ADD_LAYER_NORM: InPlacePrepared._add_layer_norm,
}


class TritonInPlaceBackend:
    """The fused add + norm kernels writing y into x and residual_out into residual, forward only."""

    name = "triton-inplace"
    prepared = InPlacePrepared

    def capabilities(self) -> Capabilities:
        return _capabilities(frozenset(IN_PLACE_OPS), IN_PLACE_FEATURES, IN_PLACE_NOTES, IN_PLACE_ALIASES)

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> InPlacePrepared:
        return self.prepared.from_inputs(case, inputs, _mode())


# ----------------------------------------------------------------------------- triton-graph


class GraphPrepared:
    """A TritonPrepared call captured once in a CUDA graph; each call replays it. The outputs are the
    captured call's own tensors, which every replay rewrites in place."""

    def __init__(self, inner: TritonPrepared) -> None:
        import torch

        self.inner = inner
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            inner()  # warm up outside the capture: compiles the kernels, fills the scalars' cache
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            inner()

    def __call__(self) -> None:
        self.graph.replay()

    def synchronize(self) -> None:
        self.inner.synchronize()

    def outputs(self) -> Outputs:
        return self.inner.outputs()

    def buffers(self) -> Mapping[str, Any]:
        return self.inner.buffers()

    def info(self) -> Mapping[str, str | int | bool]:
        return {**self.inner.info(), "replay": "CUDA graph of one prepared call"}

    def device_timing(self) -> dict[str, float | str] | None:
        return self.inner.device_timing()


class TritonGraphBackend:
    """The triton backend's calls replayed from a CUDA graph: the same kernels with no host work per
    call, the floor of host time a benchmark can show beside ``triton``. CUDA only (opt-in, ``kernels``)."""

    name = "triton-graph"

    def capabilities(self) -> Capabilities:
        run = _mode()
        if run.device != "cuda":
            raise BackendUnavailable(
                f"replays CUDA graphs: needs a CUDA device (the kernels run {run.name} here: {run.why})"
            )
        caps = _capabilities(OPS, FEATURES, NOTES, ALIASES)
        replay = "each call replays a CUDA graph captured from one prepared call"
        return dataclasses.replace(caps, notes={**caps.notes, "replay": replay})

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> GraphPrepared:
        return GraphPrepared(TritonPrepared.from_inputs(case, inputs, grad, _mode()))
