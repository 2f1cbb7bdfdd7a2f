"""Stand-ins of ``liger_kernel.transformers`` with the two defects a GPU run of the real classes showed
(../shared/gpu/h200-2026-12-04/liger.log.gz), for the meta-tests: GroupNorm's variance as
E[x^2] - E[x]^2 in the input dtype, unclamped (NaN or garbage on groups with a large mean or constant
values), and RMSNorm's weight gradient rounded to the activation dtype before it reaches a float32
weight. The other classes are the sound stand-ins."""

from __future__ import annotations

from typing import Any

import torch

from fakes.liger_standin import LigerFusedAddRMSNorm as LigerFusedAddRMSNorm
from fakes.liger_standin import LigerGroupNorm as _SoundGroupNorm
from fakes.liger_standin import LigerLayerNorm as LigerLayerNorm
from fakes.liger_standin import LigerRMSNorm as _SoundRMSNorm
from fakes.liger_standin import LigerRMSNormForGemma as LigerRMSNormForGemma
from fakes.liger_standin import _rms


class LigerGroupNorm(_SoundGroupNorm):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        n, c = hidden_states.shape[:2]
        x = hidden_states.reshape(n, self.num_groups, -1)  # the input dtype throughout
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean  # cancels; may go negative
        y = ((x - mean) / torch.sqrt(var + self.variance_epsilon)).reshape(hidden_states.shape)
        shape = (1, c) + (1,) * (hidden_states.ndim - 2)
        return y * self.weight.to(y.dtype).reshape(shape) + self.bias.to(y.dtype).reshape(shape)


class _RoundedWeightGrad(torch.autograd.Function):
    """y = xhat * w in the activation dtype; dweight summed in that dtype, then widened."""

    @staticmethod
    def forward(ctx: Any, xhat: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(xhat, weight)
        return xhat * weight.to(xhat.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xhat, weight = ctx.saved_tensors
        rows = dy.reshape(-1, dy.shape[-1])
        dw = (rows * xhat.reshape(rows.shape)).sum(0)  # summed in the activation dtype
        return dy * weight.to(dy.dtype), dw.to(weight.dtype)


class LigerRMSNorm(_SoundRMSNorm):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        xhat = _rms(hidden_states, self.variance_epsilon).to(hidden_states.dtype)
        apply: Any = _RoundedWeightGrad.apply
        out: torch.Tensor = apply(xhat, self.weight)
        return out
