"""torch-nn (torch.nn.LayerNorm, RMSNorm, BatchNorm1d/2d/3d, GroupNorm, InstanceNorm1d/2d/3d) and
torch-functional (torch.nn.functional).

Every constructor and call argument is explicit. Conventions torch lacks are translated exactly:
Gemma's weight offset becomes the weight ``1 + w`` (``_torch_common.offset_scale``), and torch.nn's
bias-without-weight gets a frozen weight of ones. torch.nn.InstanceNorm gets momentum as the case
gives it, None included, so the suite sees what the module does with it. The add ops compose
x + residual (``_torch_common.Residual``) with the library's LayerNorm / RMSNorm; where the norm reads a
float32 sum beside half parameters, the parameters are widened exactly (``_torch_common.norm_params``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from backends.common import torch_support as common
from conformance.adapter.backend import FEATURES, Capabilities, Inputs, Prepared, Unsupported
from conformance.model.case import (
    ADD_LAYER_NORM,
    ADD_RMS_NORM,
    BATCH_NORM,
    GROUP_NORM,
    INSTANCE_NORM,
    LAYER_NORM,
    RMS_NORM,
    Case,
)

ModuleT = TypeVar("ModuleT", bound=nn.Module)

# torch.nn picks the BatchNorm class by input rank; each checks x.ndim in forward().
_BATCH_NORMS: dict[int, type[nn.modules.batchnorm._BatchNorm]] = {
    2: nn.BatchNorm1d,
    3: nn.BatchNorm1d,
    4: nn.BatchNorm2d,
    5: nn.BatchNorm3d,
}
_INSTANCE_NORMS: dict[int, type[nn.modules.instancenorm._InstanceNorm]] = {
    3: nn.InstanceNorm1d,
    4: nn.InstanceNorm2d,
    5: nn.InstanceNorm3d,
}


def _dtype(case: Case, tensors: common.Tensors) -> torch.dtype:
    """The module's parameter dtype: the (possibly widened, see offset_scale and norm_params) weight's or
    bias's, else the param dtype."""
    for param in (tensors.weight, tensors.bias):
        if param is not None:
            return param.dtype
    return common.torch_dtype(case.weight_dtype)


def _load_affine(weight: torch.Tensor | None, bias: torch.Tensor | None, tensors: common.Tensors) -> None:
    with torch.no_grad():
        if weight is not None and tensors.weight is None:
            # torch.nn has one switch for weight and bias together: a bias-only case gets a
            # frozen weight of ones, which is exact (x * 1 == x) and takes no gradient.
            weight.fill_(1.0).requires_grad_(False)
        elif weight is not None and tensors.weight is not None:
            weight.copy_(tensors.weight)
        if bias is not None and tensors.bias is not None:
            bias.copy_(tensors.bias)


def _eps(case: Case, default_eps: bool) -> dict[str, float]:
    """``eps=case.eps``, or nothing when the fingerprint asks for the library's default eps."""
    return {} if default_eps else {"eps": case.eps}


def with_bias(cls: Callable[..., ModuleT], case: Case, *args: Any, **kwargs: Any) -> ModuleT:
    """``cls(*args, bias=case.bias, **kwargs)`` where the installed torch's module takes ``bias=``
    (BatchNorm, GroupNorm and InstanceNorm gained it after torch 2.11, LayerNorm in 2.1); on an older
    torch the module is built affine and its bias parameter removed, which its forward passes on to
    the functional as None: the same computation."""
    if "bias" in inspect.signature(cls).parameters:
        return cls(*args, bias=bool(case.bias), **kwargs)
    module = cls(*args, **kwargs)
    if not case.bias and getattr(module, "bias", None) is not None:
        module.register_parameter("bias", None)
    return module


def layer_norm_module(
    case: Case, dtype: torch.dtype, device: torch.device, *, default_eps: bool = False
) -> nn.LayerNorm:
    """torch.nn.LayerNorm over the case's trailing dims, every argument explicit."""
    return nn.LayerNorm(
        list(case.param_shape),
        **_eps(case, default_eps),
        elementwise_affine=case.weight or bool(case.bias),
        bias=bool(case.bias),
        device=device,
        dtype=dtype,
    )


def rms_norm_module(
    case: Case, dtype: torch.dtype, device: torch.device, *, default_eps: bool = False
) -> nn.RMSNorm:
    """torch.nn.RMSNorm over the case's trailing dims, every argument explicit."""
    return nn.RMSNorm(
        list(case.param_shape),
        **_eps(case, default_eps),
        elementwise_affine=case.weight,
        device=device,
        dtype=dtype,
    )


def batch_norm_module(
    case: Case, dtype: torch.dtype, device: torch.device, *, default_eps: bool = False
) -> nn.modules.batchnorm._BatchNorm:
    """torch.nn.BatchNorm1d/2d/3d by input rank, in the case's mode, every argument explicit."""
    cls = _BATCH_NORMS.get(len(case.shape))
    if cls is None:
        raise Unsupported(f"torch.nn has BatchNorm1d/2d/3d for 2-D to 5-D input; shape={case.shape}")
    module = with_bias(
        cls,
        case,
        case.shape[1],
        **_eps(case, default_eps),
        momentum=case.momentum,
        affine=case.weight or bool(case.bias),
        track_running_stats=True,
        device=device,
        dtype=dtype,
    )
    return module.train(case.training)


def group_norm_module(
    case: Case, dtype: torch.dtype, device: torch.device, *, default_eps: bool = False
) -> nn.GroupNorm:
    """torch.nn.GroupNorm with the case's groups over its channels, every argument explicit."""
    return with_bias(
        nn.GroupNorm,
        case,
        case.groups,
        case.shape[1],
        **_eps(case, default_eps),
        affine=case.weight or bool(case.bias),
        device=device,
        dtype=dtype,
    )


def instance_norm_module(
    case: Case, dtype: torch.dtype, device: torch.device, *, default_eps: bool = False
) -> nn.modules.instancenorm._InstanceNorm:
    """torch.nn.InstanceNorm1d/2d/3d by input rank, in the case's mode, every argument explicit."""
    cls = _INSTANCE_NORMS.get(len(case.shape))
    if cls is None:
        raise Unsupported(f"torch.nn has InstanceNorm1d/2d/3d for 3-D to 5-D input; shape={case.shape}")
    module = with_bias(
        cls,
        case,
        case.shape[1],
        **_eps(case, default_eps),
        # Untranslated: the module passes 0.0 to F.instance_norm for None (its running statistics then
        # never move), where the reference takes the cumulative average; the suite reports it.
        momentum=case.momentum,
        affine=case.weight or bool(case.bias),
        track_running_stats=bool(case.track_running_stats),
        device=device,
        dtype=dtype,
    )
    return module.train(case.training)


# The module of each op (the add ops: x + residual as the case's convention asks, then the row norm).
MODULES: dict[str, Callable[[Case, torch.dtype, torch.device], nn.Module]] = {
    LAYER_NORM: layer_norm_module,
    RMS_NORM: rms_norm_module,
    BATCH_NORM: batch_norm_module,
    ADD_RMS_NORM: rms_norm_module,
    ADD_LAYER_NORM: layer_norm_module,
    GROUP_NORM: group_norm_module,
    INSTANCE_NORM: instance_norm_module,
}


def _nn_layer_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    module = layer_norm_module(case, _dtype(case, tensors), tensors.x.device, default_eps=default_eps)
    return _prepared(case, tensors, module, module.weight, module.bias)


def _nn_rms_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    module = rms_norm_module(case, _dtype(case, tensors), tensors.x.device, default_eps=default_eps)
    return _prepared(case, tensors, module, module.weight, None)


def _nn_batch_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    module = batch_norm_module(case, _dtype(case, tensors), tensors.x.device, default_eps=default_eps)
    stats = _load_stats(module, tensors)
    return _prepared(case, tensors, module, module.weight, module.bias, stats if case.training else None)


def _nn_group_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    module = group_norm_module(case, _dtype(case, tensors), tensors.x.device, default_eps=default_eps)
    return _prepared(case, tensors, module, module.weight, module.bias)


def _nn_instance_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    module = instance_norm_module(case, _dtype(case, tensors), tensors.x.device, default_eps=default_eps)
    # Eval with running statistics reads them; only a training call updates (and resets) them.
    stats = _load_stats(module, tensors) if case.track_running_stats else None
    return _prepared(case, tensors, module, module.weight, module.bias, stats if case.training else None)


def _load_stats(module: nn.modules.batchnorm._NormBase, tensors: common.Tensors) -> common.RunningStats:
    running_mean, running_var, count = module.running_mean, module.running_var, module.num_batches_tracked
    assert running_mean is not None and running_var is not None and count is not None, "stats are tracked"
    assert tensors.running_mean is not None and tensors.running_var is not None, "inputs lack stats"
    with torch.no_grad():
        running_mean.copy_(tensors.running_mean)
        running_var.copy_(tensors.running_var)
    return common.RunningStats(running_mean, running_var, count)


def _prepared(
    case: Case,
    tensors: common.Tensors,
    module: nn.Module,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    stats: common.RunningStats | None = None,
) -> common.TorchPrepared:
    _load_affine(weight, bias, tensors)

    def forward() -> torch.Tensor:
        y: torch.Tensor = module(tensors.input())
        return y

    return common.library_prepared(case, tensors, forward, weight, bias, stats=stats, module=module)


# Each build takes default_eps: True leaves eps out, so torch's own default applies (fingerprint hook).
EpsBuild = Callable[[Case, common.Tensors, bool], common.TorchPrepared]


def _build(build: EpsBuild, default_eps: bool = False) -> common.Build:
    return lambda case, tensors: build(case, tensors, default_eps)


_NN: dict[str, EpsBuild] = {
    LAYER_NORM: _nn_layer_norm,
    RMS_NORM: _nn_rms_norm,
    BATCH_NORM: _nn_batch_norm,
    # The add ops composed: x + residual as the case's convention asks, then nn.RMSNorm / nn.LayerNorm.
    ADD_RMS_NORM: _nn_rms_norm,
    ADD_LAYER_NORM: _nn_layer_norm,
    GROUP_NORM: _nn_group_norm,
    INSTANCE_NORM: _nn_instance_norm,
}


class TorchNN:
    """torch.nn modules, on CUDA when available, else on the CPU."""

    name = "torch-nn"

    def capabilities(self) -> Capabilities:
        notes = {
            **common.LIBRARY_NOTES,
            "momentum": "passed as the case gives it; nn.InstanceNorm hands None to F.instance_norm as 0.0",
        }
        return common.capabilities(frozenset(FEATURES), notes)

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        return common.prepare_library(_build(_NN[case.op]), case, inputs, grad=grad)

    def prepare_default_eps(self, case: Case, inputs: Inputs) -> Prepared:
        """The fingerprint's hook: the module built without eps (torch.nn's own default)."""
        return common.prepare_library(_build(_NN[case.op], True), case, inputs, grad=False)

    def copy_kernel(self, nbytes: int) -> Prepared:
        return common.copy_kernel(nbytes)


def _functional_layer_norm(case: Case, t: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    eps = _eps(case, default_eps)

    def forward() -> torch.Tensor:
        return F.layer_norm(t.input(), list(case.param_shape), weight=t.weight, bias=t.bias, **eps)

    return common.library_prepared(case, t, forward, t.weight, t.bias)


def _functional_rms_norm(case: Case, t: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    eps = _eps(case, default_eps)

    def forward() -> torch.Tensor:
        return F.rms_norm(t.input(), list(case.param_shape), weight=t.weight, **eps)

    return common.library_prepared(case, t, forward, t.weight, None)


def _functional_batch_norm(case: Case, t: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    running_mean, running_var = t.running_mean, t.running_var
    eps = _eps(case, default_eps)
    assert running_mean is not None and running_var is not None, "BN inputs lack stats"
    count = torch.zeros((), dtype=torch.long, device=t.x.device)  # torch.nn's num_batches_tracked

    def forward() -> torch.Tensor:
        # torch.nn passes momentum (0.0 for None) in eval mode, where batch_norm ignores it.
        factor = common.momentum_factor(case.momentum, count) if case.training else case.momentum or 0.0
        return F.batch_norm(
            t.x,
            running_mean,
            running_var,
            weight=t.weight,
            bias=t.bias,
            training=case.training,
            momentum=factor,
            **eps,
        )

    stats = common.RunningStats(running_mean, running_var, count) if case.training else None
    return common.library_prepared(case, t, forward, t.weight, t.bias, stats=stats)


def _functional_group_norm(case: Case, t: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    eps = _eps(case, default_eps)

    def forward() -> torch.Tensor:
        return F.group_norm(t.x, case.groups, weight=t.weight, bias=t.bias, **eps)

    return common.library_prepared(case, t, forward, t.weight, t.bias)


def _functional_instance_norm(
    case: Case, t: common.Tensors, default_eps: bool = False
) -> common.TorchPrepared:
    eps = _eps(case, default_eps)
    # momentum None -> 1.0: exact, every call being the cumulative average's first step (see
    # first_step_momentum); read by F.instance_norm only when it updates running statistics.
    momentum = common.first_step_momentum(case.momentum)

    def forward() -> torch.Tensor:
        # Running statistics are None without tracking; with them, use_input_stats=False is eval.
        return F.instance_norm(
            t.x,
            t.running_mean,
            t.running_var,
            weight=t.weight,
            bias=t.bias,
            use_input_stats=case.uses_batch_stats,
            momentum=momentum,
            **eps,
        )

    stats = None
    if case.training:
        assert t.running_mean is not None and t.running_var is not None, "training needs tracking"
        # A batch count only for RunningStats' reset: F.instance_norm keeps none.
        stats = common.RunningStats(t.running_mean, t.running_var, torch.zeros((), dtype=torch.long))
    return common.library_prepared(case, t, forward, t.weight, t.bias, stats=stats)


_FUNCTIONAL: dict[str, EpsBuild] = {
    LAYER_NORM: _functional_layer_norm,
    RMS_NORM: _functional_rms_norm,
    BATCH_NORM: _functional_batch_norm,
    ADD_RMS_NORM: _functional_rms_norm,
    ADD_LAYER_NORM: _functional_layer_norm,
    GROUP_NORM: _functional_group_norm,
    INSTANCE_NORM: _functional_instance_norm,
}


class TorchFunctional:
    """torch.nn.functional calls, on CUDA when available, else on the CPU."""

    name = "torch-functional"

    def capabilities(self) -> Capabilities:
        notes = {
            **common.LIBRARY_NOTES,
            "momentum": "None: BatchNorm keeps torch.nn's batch count; InstanceNorm gets 1.0, exact for the"
            " one step of a call",
        }
        return common.capabilities(frozenset(FEATURES), notes)

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        # The functions take weight=None with a bias, which torch.nn never passes: torch's answer on
        # whether the backward runs so is asked (F.group_norm's fails on the CPU in torch 2.13).
        build = _build(_FUNCTIONAL[case.op])
        return common.prepare_library(build, case, inputs, grad=grad, weightless=True)

    def prepare_default_eps(self, case: Case, inputs: Inputs) -> Prepared:
        """The fingerprint's hook: the function called without eps (its own default)."""
        return common.prepare_library(_build(_FUNCTIONAL[case.op], True), case, inputs, grad=False)

    def copy_kernel(self, nbytes: int) -> Prepared:
        return common.copy_kernel(nbytes)
