"""Stand-ins for ``liger_kernel.transformers``' norm classes, in torch on the CPU: the constructors and
forward signatures of Liger-Kernel 0.8.5, computing as a sound kernel does (float32 statistics and
arithmetic, one rounding to the input dtype). The adapter (backends/liger/norms.py) runs over these in
tests/fakes/liger.py, since the real classes need CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


class LigerRMSNorm(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0, casting_mode: str = "llama",
        init_fn: str = "ones", in_place: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) if init_fn == "ones" else torch.zeros(hidden_size))
        self.variance_epsilon, self.offset, self.casting_mode = eps, offset, casting_mode

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # Both casting modes as a sound kernel computes them: float32 throughout, rounded once (a float32
        # weight's gradient keeps its precision).
        xhat = _rms(hidden_states, self.variance_epsilon)
        return (xhat * (self.offset + self.weight.float())).to(hidden_states.dtype)


class LigerRMSNormForGemma(LigerRMSNorm):
    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 1.0, casting_mode: str = "gemma",
                 init_fn: str = "zeros", in_place: bool = True) -> None:  # fmt: skip
        super().__init__(hidden_size, eps, offset, casting_mode, init_fn, in_place)


class LigerLayerNorm(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float = 1e-6, bias: bool = False, init_fn: str = "ones"
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) if init_fn == "ones" else torch.zeros(hidden_size))
        self.bias = nn.Parameter(torch.randn(hidden_size) if bias else torch.zeros(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = (hidden_states.shape[-1],)
        y = F.layer_norm(
            hidden_states.float(), shape, self.weight.float(), self.bias.float(), self.variance_epsilon
        )
        return y.to(hidden_states.dtype)


class LigerFusedAddRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0, casting_mode: str = "llama",
                 init_fn: str = "ones", in_place: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.norm = LigerRMSNorm(hidden_size, eps, offset, casting_mode, init_fn)
        self.weight = self.norm.weight

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = hidden_states + residual
        return self.norm(h), h


class LigerGroupNorm(nn.Module):
    def __init__(self, num_channels: int, num_groups: int, eps: float = 1e-6, bias: bool = False,
                 init_fn: str = "ones") -> None:  # fmt: skip
        super().__init__()
        self.num_channels, self.num_groups = num_channels, num_groups
        self.weight = nn.Parameter(
            torch.ones(num_channels) if init_fn == "ones" else torch.zeros(num_channels)
        )
        self.bias = nn.Parameter(torch.randn(num_channels) if bias else torch.zeros(num_channels))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        y = F.group_norm(
            hidden_states.float(),
            self.num_groups,
            self.weight.float(),
            self.bias.float(),
            self.variance_epsilon,
        )
        return y.to(hidden_states.dtype)
