"""torch-eager: the from-scratch eager PyTorch modules of the seed documents, kept faithful to them.

LayerNorm and BatchNorm compute their statistics in the activation dtype, as the seeds write them;
RMSNorm upcasts to float32 first. The suite is meant to show what that costs, so nothing is fixed here.
GroupNorm and InstanceNorm (no seed) are written in torch ops with float32-or-wider statistics. The add
ops compose x + residual (``_torch_common.Residual``) with the seed LayerNorm / RMSNorm, which then
compute in the dtype of the sum they read: the stream dtype, or float32 for the exact sum.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from backends.common import torch_support as common
from conformance.adapter.backend import FEATURES, Capabilities, Inputs, Prepared
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


def _parameter(value: torch.Tensor | None) -> nn.Parameter | None:
    return None if value is None else nn.Parameter(value.detach().clone())


class LayerNorm(nn.Module):
    """The seed's LayerNorm over the trailing ``len(normalized_shape)`` dims; weight and bias optional."""

    def __init__(
        self,
        normalized_shape: tuple[int, ...],
        eps: float = 1e-5,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.dims = tuple(range(-len(normalized_shape), 0))
        self.eps = eps
        self.weight = _parameter(weight)
        self.bias = _parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in x's own dtype (bfloat16 stays bfloat16): the seed never upcasts.
        mean = x.mean(dim=self.dims, keepdim=True)
        var = x.var(dim=self.dims, unbiased=False, keepdim=True)
        y = (x - mean) / torch.sqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y


class RMSNorm(nn.Module):
    """The seed's RMSNorm: statistics in float32 (float64 stays float64), scale ``weight_offset + weight``."""

    def __init__(
        self,
        normalized_shape: tuple[int, ...],
        eps: float = 1e-6,
        weight: torch.Tensor | None = None,
        weight_offset: float = 0.0,
    ) -> None:
        super().__init__()
        self.dims = tuple(range(-len(normalized_shape), 0))
        self.eps = eps
        self.weight = _parameter(weight)
        self.weight_offset = weight_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        # The seed's x.float(), except that it must not narrow float64 inputs.
        x = x.to(torch.promote_types(dtype, torch.float32))
        rms = torch.sqrt(x.pow(2).mean(dim=self.dims, keepdim=True) + self.eps)
        y = x / rms
        if self.weight is not None:
            y = y * self._scale(self.weight)
        return y.to(dtype)

    def _scale(self, weight: torch.Tensor) -> torch.Tensor:
        # Gemma's (1 + w), formed in float32 like its reference code (float64 weights stay float64).
        wide = weight.to(torch.promote_types(weight.dtype, torch.float32))
        return wide + self.weight_offset if self.weight_offset else wide


class BatchNorm(nn.Module):
    """The seed's BatchNorm with the channel on axis 1 of (N, C) or (N, C, L...); buffers in param dtype."""

    # Buffers, declared for the type checker (register_buffer attributes are otherwise Tensor | Module).
    running_mean: torch.Tensor
    running_var: torch.Tensor
    num_batches_tracked: torch.Tensor

    def __init__(self, tensors: common.Tensors, eps: float = 1e-5, momentum: float | None = 0.1) -> None:
        super().__init__()
        assert tensors.running_mean is not None and tensors.running_var is not None, "BN inputs lack stats"
        self.eps = eps
        self.momentum = momentum
        self.weight = _parameter(tensors.weight)
        self.bias = _parameter(tensors.bias)
        self.register_buffer("running_mean", tensors.running_mean.detach().clone())
        self.register_buffer("running_var", tensors.running_var.detach().clone())
        self.register_buffer(
            "num_batches_tracked", torch.zeros((), dtype=torch.long, device=tensors.x.device)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = (0, *range(2, x.ndim))
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)  # broadcasts a per-channel (C,) over axis 1
        if self.training:
            # Batch statistics in x's own dtype, as the seed computes them.
            mean = x.mean(dim=dims)
            var = x.var(dim=dims, unbiased=False)
            with torch.no_grad():
                self._update(mean, x.var(dim=dims, unbiased=True))
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + self.eps)
        if self.weight is not None:
            y = y * self.weight.reshape(shape)
        if self.bias is not None:
            y = y + self.bias.reshape(shape)
        return y

    def _update(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        # The seed's exponential average with PyTorch's momentum convention; the running variance
        # takes the unbiased batch variance. momentum=None follows torch.nn: a cumulative average.
        m = common.momentum_factor(self.momentum, self.num_batches_tracked)
        self.running_mean.mul_(1 - m).add_(m * mean)
        self.running_var.mul_(1 - m).add_(m * unbiased_var)

    def stats(self) -> common.RunningStats:
        return common.RunningStats(self.running_mean, self.running_var, self.num_batches_tracked)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or wider (float64 stays float64): where GroupNorm/InstanceNorm statistics live."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class GroupNorm(nn.Module):
    """GroupNorm over (N, C, spatial...): per sample, mean and biased variance of each group of C/G
    channels and all their spatial values, in float32 or wider; per-channel weight and bias."""

    def __init__(
        self,
        num_groups: int,
        eps: float = 1e-5,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.num_groups = num_groups
        self.eps = eps
        self.weight = _parameter(weight)
        self.bias = _parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._affine(self._normalize(x), x.dtype)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        # (N, G, C/G * spatial): one row per group (a copy for channels-last x, whose groups are strided).
        groups = _wide(x).reshape(x.shape[0], self.num_groups, -1)
        mean = groups.mean(dim=-1, keepdim=True)
        var = groups.var(dim=-1, unbiased=False, keepdim=True)
        return ((groups - mean) / torch.sqrt(var + self.eps)).reshape(x.shape)

    def _affine(self, xhat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        shape = (1, -1) + (1,) * (xhat.ndim - 2)  # broadcasts a per-channel (C,) over axis 1
        for param in (self.weight, self.bias):
            # The affine in the wide dtype, one rounding at the end; the result takes PyTorch's type
            # promotion of x and the parameters, as the seed LayerNorm/BatchNorm's does.
            if param is not None:
                dtype = torch.promote_types(dtype, param.dtype)
        if self.weight is not None:
            xhat = xhat * self.weight.reshape(shape)
        if self.bias is not None:
            xhat = xhat + self.bias.reshape(shape)
        return xhat.to(dtype)


class InstanceNorm(GroupNorm):
    """InstanceNorm: GroupNorm with one channel per group, plus torch's optional running statistics
    (training updates them from the instance statistics; eval with them normalizes by them)."""

    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    num_batches_tracked: torch.Tensor

    def __init__(self, tensors: common.Tensors, eps: float = 1e-5, momentum: float | None = 0.1) -> None:
        super().__init__(tensors.x.shape[1], eps, tensors.weight, tensors.bias)
        self.momentum = momentum
        for name in ("running_mean", "running_var"):
            value = getattr(tensors, name)
            self.register_buffer(name, None if value is None else value.detach().clone())
        self.register_buffer(
            "num_batches_tracked", torch.zeros((), dtype=torch.long, device=tensors.x.device)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.running_mean is None or self.running_var is None or self.training:
            if self.training:
                with torch.no_grad():
                    self._update(x)
            return super().forward(x)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean, var = _wide(self.running_mean).reshape(shape), _wide(self.running_var).reshape(shape)
        return self._affine((_wide(x) - mean) / torch.sqrt(var + self.eps), x.dtype)

    def _update(self, x: torch.Tensor) -> None:
        assert self.running_mean is not None and self.running_var is not None, "training needs tracking"
        # Per instance over its spatial values; the running variance takes the unbiased variances.
        instances = _wide(x).reshape(x.shape[0], x.shape[1], -1)
        mean = instances.mean(dim=-1).mean(dim=0)
        unbiased_var = instances.var(dim=-1, unbiased=True).mean(dim=0)
        # torch.nn's momentum rule (None: the cumulative average); formed wide, rounded once.
        m = common.momentum_factor(self.momentum, self.num_batches_tracked)
        for running, batch in ((self.running_mean, mean), (self.running_var, unbiased_var)):
            running.copy_((1 - m) * _wide(running) + m * batch)

    def stats(self) -> common.RunningStats:
        assert self.running_mean is not None and self.running_var is not None, "training needs tracking"
        return common.RunningStats(self.running_mean, self.running_var, self.num_batches_tracked)


def _eps(case: Case, default_eps: bool) -> dict[str, float]:
    """``eps=case.eps``, or nothing when the fingerprint asks for the seed module's default eps."""
    return {} if default_eps else {"eps": case.eps}


def _layer_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    module = LayerNorm(case.param_shape, weight=tensors.weight, bias=tensors.bias, **_eps(case, default_eps))
    return _prepared(case, tensors, module, module.weight, module.bias)


def _rms_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    eps = _eps(case, default_eps)
    module = RMSNorm(case.param_shape, weight=tensors.weight, weight_offset=case.weight_offset, **eps)
    return _prepared(case, tensors, module, module.weight, None)


def _batch_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    module = BatchNorm(tensors, momentum=case.momentum, **_eps(case, default_eps)).train(case.training)
    stats = module.stats() if case.training else None
    return _prepared(case, tensors, module, module.weight, module.bias, stats=stats)


def _group_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    eps = _eps(case, default_eps)
    module = GroupNorm(case.groups, weight=tensors.weight, bias=tensors.bias, **eps)
    return _prepared(case, tensors, module, module.weight, module.bias)


def _instance_norm(case: Case, tensors: common.Tensors, default_eps: bool = False) -> common.TorchPrepared:
    module = InstanceNorm(tensors, momentum=case.momentum, **_eps(case, default_eps)).train(case.training)
    stats = module.stats() if case.training else None
    return _prepared(case, tensors, module, module.weight, module.bias, stats=stats)


def _prepared(
    case: Case,
    tensors: common.Tensors,
    module: nn.Module,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    stats: common.RunningStats | None = None,
) -> common.TorchPrepared:
    def forward() -> torch.Tensor:
        y: torch.Tensor = module(tensors.input())
        return y

    wrt = common.gradient_targets(case, tensors.x, weight, bias)
    own = {**common.module_tensors(module), "weight": weight, "bias": bias}
    prepared = common.TorchPrepared(forward, tensors, wrt, stats=stats, computed_with=own)
    prepared.described.update(common.layout_info(case, tensors))
    return prepared


# Each build takes default_eps: True leaves eps out, so the seed module's own default applies.
_BUILD: dict[str, Callable[[Case, common.Tensors, bool], common.TorchPrepared]] = {
    LAYER_NORM: _layer_norm,
    RMS_NORM: _rms_norm,
    BATCH_NORM: _batch_norm,
    # The eager compositions: x + residual as the case's convention asks, then the seed norm.
    ADD_RMS_NORM: _rms_norm,
    ADD_LAYER_NORM: _layer_norm,
    GROUP_NORM: _group_norm,
    INSTANCE_NORM: _instance_norm,
}


class TorchEager:
    """The seed modules, run eagerly on CUDA when available, else on the CPU."""

    name = "torch-eager"

    def capabilities(self) -> Capabilities:
        # Type promotion lets the seed modules take any activation/parameter dtype mix.
        return common.capabilities(
            frozenset(FEATURES),
            {
                "statistics": "LayerNorm/BatchNorm in the activation dtype; RMSNorm, GroupNorm and"
                " InstanceNorm in float32 or wider; the add ops' in the dtype of the sum the norm reads",
                "channels_last": common.LIBRARY_NOTES["channels_last"],
                "residual_dtype": common.LIBRARY_NOTES["residual_dtype"],
                "exact_sum": "the norm reads x.float() + residual.float() (float64 stays float64);"
                " residual_out is that sum rounded to the stream dtype",
            },
        )

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        return _BUILD[case.op](case, common.to_device(case, inputs, grad=grad), False)

    def prepare_default_eps(self, case: Case, inputs: Inputs) -> Prepared:
        """The fingerprint's hook: the seed module built without eps (its constructor's default)."""
        return _BUILD[case.op](case, common.to_device(case, inputs, grad=False), True)

    def copy_kernel(self, nbytes: int) -> Prepared:
        return common.copy_kernel(nbytes)
