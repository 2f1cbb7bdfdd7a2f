"""liger-*: Liger-Kernel's norm modules (``liger-kernel`` on PyPI, linkedin/Liger-Kernel), the kernel library
people compare fused norm kernels against, in the same run as ours. Opt-in: ``--backend kernels``.

Each module is built as a model builds it (``liger_kernel.transformers``), with its own defaults except
eps, which is the case's, and the case's weight (and bias) loaded into it; forward and backward run through
autograd like the torch.nn modules:

- liger-rms         LigerRMSNorm (casting_mode "llama": float32 statistics, cast before the weight)
- liger-rms-gemma   LigerRMSNormForGemma (offset 1: the scale is 1 + w; casting_mode "gemma")
- liger-layer-norm  LigerLayerNorm (its bias a zero parameter when the case has none)
- liger-add-rms     LigerFusedAddRMSNorm (h = x + residual and RMSNorm(h) in one kernel: (y, h))
- liger-group-norm  LigerGroupNorm (weight and bias per channel)

Liger's kernels run on CUDA only: they do not run under Triton's interpreter, so on a machine without a
CUDA device these backends are unavailable with that reason (tests/fakes/liger.py runs the adapter over
stand-in classes). What they compute wrong is Liger's result for the report, not an entry of normconf's
ledger.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from backends.common import device_timing
from backends.common import torch_support as common
from conformance.adapter.backend import BackendUnavailable, Capabilities, Inputs, Outputs, Unsupported
from conformance.model.case import ADD_RMS_NORM, GROUP_NORM, LAYER_NORM, RMS_NORM, Case

LIBRARY = "liger_kernel.transformers"


@dataclass(frozen=True)
class Kind:
    """One Liger module: its class, the op it computes, the weight offset it applies itself."""

    name: str
    cls: str
    op: str
    offset: float
    what: str


KINDS = {
    k.name: k
    for k in (
        Kind("liger-rms", "LigerRMSNorm", RMS_NORM, 0.0, "RMSNorm, casting_mode 'llama'"),
        Kind(
            "liger-rms-gemma",
            "LigerRMSNormForGemma",
            RMS_NORM,
            1.0,
            "RMSNorm of scale 1 + w, casting 'gemma'",
        ),
        Kind("liger-layer-norm", "LigerLayerNorm", LAYER_NORM, 0.0, "LayerNorm"),
        Kind(
            "liger-add-rms", "LigerFusedAddRMSNorm", ADD_RMS_NORM, 0.0, "h = x + residual, RMSNorm(h): (y, h)"
        ),
        Kind("liger-group-norm", "LigerGroupNorm", GROUP_NORM, 0.0, "GroupNorm with weight and bias"),
    )
}
DTYPES = frozenset({"float32", "float16", "bfloat16"})


def _features(kind: Kind) -> frozenset[str]:
    features = {"backward", "param_dtype"}
    if kind.offset:
        features.add("weight_offset")  # the Gemma class: its own 1 + w, nothing else
    if kind.op == LAYER_NORM:
        features.add("no_bias")  # a zero bias parameter adds exactly nothing
    return frozenset(features)


def _module(kind: Kind, classes: Any, case: Case) -> nn.Module:
    cls = getattr(classes, kind.cls)
    if kind.op == GROUP_NORM:
        module: nn.Module = cls(case.shape[1], case.groups, eps=case.eps, bias=bool(case.bias))
    elif kind.op == LAYER_NORM:
        module = cls(case.param_shape[-1], eps=case.eps, bias=bool(case.bias))
    else:
        module = cls(case.param_shape[-1], eps=case.eps)
    return module


def _params(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's weight and (where it has one) bias."""
    found = {name: getattr(module, name, None) for name in ("weight", "bias")}
    return {name: p for name, p in found.items() if isinstance(p, torch.Tensor)}


class LigerPrepared:
    """One case on a Liger module: forward (y, and h for the fused add), the backward by autograd."""

    def __init__(self, case: Case, module: nn.Module, t: dict[str, torch.Tensor], grad: bool) -> None:
        self.case, self.module, self.t, self.grad = case, module, t, grad
        self.device = t["x"].device
        self.wrt = {"dx": t["x"]}
        if "residual" in t:
            self.wrt["dresidual"] = t["residual"]
        for name, param in _params(module).items():
            if name in t and param.requires_grad:
                self.wrt[f"d{name}"] = param
        self.results: dict[str, torch.Tensor] = {}

    def _forward(self) -> dict[str, torch.Tensor]:
        if self.case.op == ADD_RMS_NORM:
            y, h = self.module(self.t["x"], self.t["residual"])
            return {"y": y, "residual_out": h}
        return {"y": self.module(self.t["x"])}

    def __call__(self) -> None:
        if not self.grad:
            with torch.no_grad():
                self.results = self._forward()
            return
        with torch.enable_grad():
            out = self._forward()
            heads = [out["y"]] + ([out["residual_out"]] if "residual_out" in out else [])
            cotangents = [self.t["dy"]] + ([self.t["dresidual_out"]] if "residual_out" in out else [])
            grads = torch.autograd.grad(heads, list(self.wrt.values()), cotangents)
        self.results = {k: v.detach() for k, v in out.items()} | dict(zip(self.wrt, grads, strict=True))

    def synchronize(self) -> None:
        common.synchronize(self.device)

    def outputs(self) -> Outputs:
        if not self.results:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        return {name: common.to_numpy(value) for name, value in self.results.items()}

    def buffers(self) -> Mapping[str, Any]:
        return {**self.t, **_params(self.module), **self.results}

    def info(self) -> Mapping[str, str | int | bool]:
        return {"class": type(self.module).__name__}

    def device_timing(self) -> dict[str, float | str] | None:
        """The kernels' time per call apart from the host's (backends/common/device_timing.py)."""
        return device_timing.info(self, self.device)


class LigerNorm:
    """One Liger-Kernel norm module. ``library`` is the module the classes come from and ``needs_cuda``
    whether they need a CUDA device (tests swap in stand-ins that run on the CPU)."""

    kind_name: ClassVar[str] = ""
    library: ClassVar[str] = LIBRARY
    needs_cuda: ClassVar[bool] = True

    def __init__(self) -> None:
        self.kind = KINDS[self.kind_name]
        self.name: str = getattr(type(self), "name", self.kind.name)

    def _classes(self) -> Any:
        if self.needs_cuda and not torch.cuda.is_available():
            raise BackendUnavailable(
                "Liger-Kernel's kernels run on CUDA only (they do not run under Triton's interpreter) and "
                "this machine has no CUDA device"
            )
        try:
            return importlib.import_module(self.library)
        except ImportError as exc:
            raise BackendUnavailable(
                f"liger-kernel is not installed (pip install liger-kernel): {exc}"
            ) from exc

    def capabilities(self) -> Capabilities:
        classes = self._classes()
        dev = torch.device("cuda") if self.needs_cuda else torch.device("cpu")
        version = getattr(importlib.import_module(self.library.split(".")[0]), "__version__", "unknown")
        return Capabilities(
            ops=frozenset({self.kind.op}),
            dtypes=DTYPES,
            features=_features(self.kind),
            device=dev.type,
            device_name=common.device_name(dev),
            # The fused add hands one gradient tensor to x and the residual (its backward returns dX twice).
            aliases={"dresidual": "dx"} if self.kind.op == ADD_RMS_NORM else {},
            notes={
                "library": f"{self.library} {version}",
                "class": f"{classes.__name__}.{self.kind.cls}",
                "computes": self.kind.what,
                "built": "as a model builds it: the class's own defaults, eps passed",
            },
        )

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> LigerPrepared:
        classes = self._classes()
        if case.weight_offset != self.kind.offset:
            raise Unsupported(
                f"{self.kind.cls} scales by {self.kind.offset:g} + w: weight_offset={case.weight_offset}"
            )
        if "weight" not in inputs:
            raise Unsupported(f"{self.kind.cls} always has a weight")
        dev = torch.device("cuda") if self.needs_cuda else torch.device("cpu")
        t = {name: common.to_torch(value, dev) for name, value in inputs.items()}
        module = _module(self.kind, classes, case).to(device=dev, dtype=t["weight"].dtype)
        params = _params(module)
        with torch.no_grad():
            params["weight"].copy_(t["weight"])
            if "bias" in params and "bias" in t:
                params["bias"].copy_(t["bias"])
            elif "bias" in params:
                # no_bias: the class's bias held at zero and frozen adds exactly nothing.
                params["bias"].zero_().requires_grad_(False)
        if grad:
            for name in ("x", "residual"):
                if name in t:
                    t[name].requires_grad_(True)
        return LigerPrepared(case, module, t, grad)


class LigerRMS(LigerNorm):
    kind_name = "liger-rms"


class LigerRMSGemma(LigerNorm):
    kind_name = "liger-rms-gemma"


class LigerLayerNorm(LigerNorm):
    kind_name = "liger-layer-norm"


class LigerAddRMS(LigerNorm):
    kind_name = "liger-add-rms"


class LigerGroupNorm(LigerNorm):
    kind_name = "liger-group-norm"
