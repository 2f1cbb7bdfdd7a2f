"""Fake Triton backends for the meta-tests, run natively or under the interpreter, each in a broken and a
correct build.

Loaded into a conformance run with ``-p fakes.triton`` (tests/ on PYTHONPATH).

- A real @triton.jit LayerNorm kernel whose broken build lets the padded lanes of a power-of-two block
  enter the variance, the classic masked-lane bug: exact when the row fills the block and wrong for
  every other row length.
- The triton backend's own GroupNorm kernels (backends/triton/kernels/group_norm.py) wired two wrong
  ways: statistics per channel instead of per group (the kernel launched with C groups; exact only
  when G = C), and dweight reduced with the group left out of the channel mapping (the per-(sample,
  channel) sums viewed as rows of C/G channels, so channel k of every group adds into one value;
  exact only when G = 1).
- The triton-inplace backend (y into x's buffer, residual_out into residual's) under a fake's name,
  and three ways to get its in-place contract wrong while returning right values: the residual buffer
  written but not declared; declared but left holding a stale value (x); the pristine inputs not
  restored before a call, so a second call starts from the first one's outputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import conformance
from backends.triton.kernels import blocks, mode
from conformance.adapter.backend import Capabilities
from conformance.model.case import Case

mode.select()  # before Triton is imported: switches the interpreter on where there is no GPU

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from backends.common import torch_support as common  # noqa: E402
from backends.triton.backend import TritonInPlaceBackend  # noqa: E402
from backends.triton.kernels import functions as F  # noqa: E402
from backends.triton.kernels.group_norm import channel_sums, group_norm_fwd  # noqa: E402
from backends.triton.kernels.reduce import column_sum  # noqa: E402


@triton.jit
def rowwise_layer_norm(
    X,  # [n_rows, n_cols] activations
    W,  # [n_cols] weight
    B,  # [n_cols] bias
    Y,  # [n_rows, n_cols] output
    n_cols,  # N
    eps,  # scalar
    BLOCK: tl.constexpr,  # next power of two >= N: lanes N..BLOCK-1 are padding
    MASK_STATS: tl.constexpr,  # False = the bug: padded lanes enter the variance
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = x - mean  # on a padded lane this is -mean, not 0
    if MASK_STATS:
        xc = tl.where(ok, xc, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=ok, other=0.0).to(tl.float32)
    y = xc * tl.math.rsqrt(var + eps) * w + b
    tl.store(Y + row * n_cols + cols, y.to(Y.dtype.element_ty), mask=ok)


class Prepared:
    def __init__(self, kernel_flag: bool, case: Case, inputs: dict[str, np.ndarray]) -> None:
        self.device = torch.device(mode.select().device)
        self.flag, self.case = kernel_flag, case
        self.t = {k: common.to_torch(v, self.device) for k, v in inputs.items()}
        self.y: Any = None

    def __call__(self) -> None:
        x = self.t["x"]
        n_cols = x.shape[-1]
        self.y = torch.empty_like(x)
        rowwise_layer_norm[(x.numel() // n_cols,)](
            x, self.t["weight"], self.t["bias"], self.y, n_cols, self.case.eps,
            BLOCK=blocks.next_pow2(n_cols), MASK_STATS=self.flag,
        )  # fmt: skip

    def synchronize(self) -> None:
        common.synchronize(self.device)

    def outputs(self) -> dict[str, np.ndarray]:
        return {"y": common.to_numpy(self.y)}


class RowwiseLayerNorm:
    """Forward LayerNorm with weight and bias over the last dim, float32 statistics, one row per program."""

    name = "fake-triton-rowwise"
    mask_stats = True

    def capabilities(self) -> Capabilities:
        return Capabilities(
            ops=frozenset({"layer_norm"}),
            dtypes=frozenset({"float32", "float16"}),
            device=mode.select().device,
            device_name="triton " + mode.select().name,
        )

    def prepare(self, case: Case, inputs: dict[str, np.ndarray], *, grad: bool) -> Prepared:
        return Prepared(self.mask_stats, case, inputs)


conformance.register("fake-triton-rowwise")(RowwiseLayerNorm)


@conformance.register("fake-triton-masked-lanes")
class MaskedLanesInVariance(RowwiseLayerNorm):
    """The same kernel without the ``tl.where``: padded lanes add mean^2 each to the sum of squares."""

    name = "fake-triton-masked-lanes"
    mask_stats = False


def _group_dweight(case: Case, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dweight from the real kernels' per-(sample, channel) sums, reduced with the wrong mapping: the
    [N * C] sums read as [N * G, C/G] rows, so column k sums channel k of every group."""
    n, channels, groups = case.shape[0], case.shape[1], case.groups
    cpg, spatial = channels // groups, x[0, 0].numel()
    x2, dy2 = x.detach().contiguous(), dy.contiguous()
    mean = torch.empty(n * groups, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    scalars = torch.tensor([case.eps, 0.0], dtype=torch.float32, device=x.device)
    group_norm_fwd[(n * groups,)](
        x2, x2, x2, x2, x2, scalars, torch.empty_like(x2), mean, rstd, mean,
        n * groups, cpg * spatial, spatial, cpg, groups,
        HAS_W=False, HAS_B=False, GIVEN_STATS=False, SAVE_VAR=False, ACC=tl.float32,
        BLOCK_M=1, BLOCK_N=blocks.next_pow2(cpg * spatial), ONE_CHUNK=True,
    )  # fmt: skip
    dw_sum, db_sum = torch.empty(n * channels, device=x.device), torch.empty(n * channels, device=x.device)
    channel_sums[(n * channels,)](
        x2, dy2, mean, rstd, dw_sum, db_sum, n * channels, spatial, cpg,
        ACC=tl.float32, BLOCK_M=1, BLOCK_N=blocks.next_pow2(spatial),
    )  # fmt: skip
    within = torch.empty(cpg, dtype=w.dtype, device=x.device)
    column_sum[(1,)](
        dw_sum, within, dw_sum, within, n * groups, cpg,
        TWO=False, BLOCK_M=blocks.next_pow2(n * groups), BLOCK_N=blocks.next_pow2(cpg),
    )  # fmt: skip
    return within.repeat(groups)


class GroupNormPrepared:
    """GroupNorm forward and backward through the triton backend's autograd.Function."""

    def __init__(self, broken: str, case: Case, inputs: dict[str, np.ndarray], grad: bool) -> None:
        self.device = torch.device(mode.select().device)
        self.broken, self.case, self.grad = broken, case, grad
        self.t = {k: common.to_torch(v, self.device) for k, v in inputs.items()}
        for name in ("x", "weight", "bias"):
            self.t[name].requires_grad_(grad)
        self.out: dict[str, Any] = {}

    def __call__(self) -> None:
        c, t = self.case, self.t
        # The first bug: C passed where num_groups belongs, so every channel is its own group.
        groups = c.shape[1] if self.broken == "channel_stats" else c.groups
        with torch.enable_grad():
            y = F.group_norm(t["x"], groups, t["weight"], t["bias"], eps=c.eps)
            self.out = {"y": y.detach()}
            if self.grad:
                dx, dw, db = torch.autograd.grad(y, [t["x"], t["weight"], t["bias"]], t["dy"])
                if self.broken == "group_dweight":
                    dw = _group_dweight(c, t["x"], t["weight"], t["dy"])
                self.out.update(dx=dx, dweight=dw, dbias=db)

    def synchronize(self) -> None:
        common.synchronize(self.device)

    def outputs(self) -> dict[str, np.ndarray]:
        return {name: common.to_numpy(value) for name, value in self.out.items()}


@conformance.register("fake-triton-gn")
class GroupNormKernels:
    """GroupNorm with weight and bias on the real kernels, float32 only: the control build."""

    name = "fake-triton-gn"
    broken = ""

    def capabilities(self) -> Capabilities:
        return Capabilities(
            ops=frozenset({"group_norm"}),
            dtypes=frozenset({"float32"}),
            features=frozenset({"backward"}),
            device=mode.select().device,
            device_name="triton " + mode.select().name,
        )

    def prepare(self, case: Case, inputs: dict[str, np.ndarray], *, grad: bool) -> GroupNormPrepared:
        return GroupNormPrepared(self.broken, case, inputs, grad)


@conformance.register("fake-triton-gn-channel-stats")
class ChannelStatistics(GroupNormKernels):
    """Statistics per channel instead of per group."""

    name = "fake-triton-gn-channel-stats"
    broken = "channel_stats"


@conformance.register("fake-triton-gn-group-dweight")
class GroupBlindDweight(GroupNormKernels):
    """dweight reduced without the group in the channel mapping."""

    name = "fake-triton-gn-group-dweight"
    broken = "group_dweight"


@conformance.register("fake-triton-inplace")
class InPlaceKernels(TritonInPlaceBackend):
    """triton-inplace itself (its own name belongs to its entry point): the control build."""

    name = "fake-triton-inplace"


@conformance.register("fake-triton-inplace-undeclared")
class InPlaceUndeclared(InPlaceKernels):
    """The same kernels writing residual_out into residual's buffer, declaring only y -> x."""

    name = "fake-triton-inplace-undeclared"

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), aliases={"y": "x"})


class _StaleCommit(TritonInPlaceBackend.prepared):
    """Computes out of place, returns those (right) outputs, then copies them into the buffers from the
    wrong tensor: residual's buffer receives x as it was before the call, not residual_out."""

    def __call__(self) -> None:
        self.restore()
        c, p, x, residual = self.case, self.params, self.t["x"], self.t["residual"]
        exact = c.norm_input == "exact"
        w, b = p.get("weight"), p.get("bias")
        if c.op == "add_rms_norm":
            offset = c.weight_offset
            y, h = F.add_rms_norm(x, residual, c.param_shape, w, eps=c.eps, weight_offset=offset, exact=exact)
        else:
            y, h = F.add_layer_norm(x, residual, c.param_shape, w, b, eps=c.eps, exact=exact)
        residual.copy_(x)  # the bug: a stale value in the declared buffer
        x.copy_(y)
        self.returned = {"y": y, "residual_out": h}
        self.called = True

    def outputs(self) -> dict[str, np.ndarray]:
        return {name: common.to_numpy(value) for name, value in self.returned.items()}


@conformance.register("fake-triton-inplace-stale")
class InPlaceStale(InPlaceKernels):
    """Declares both buffers; residual's is left holding x."""

    name = "fake-triton-inplace-stale"
    prepared = _StaleCommit


class _NoRestore(TritonInPlaceBackend.prepared):
    def restore(self) -> None:
        pass  # the bug: the next call reads the previous call's y and residual_out as its inputs


@conformance.register("fake-triton-inplace-no-restore")
class InPlaceNoRestore(InPlaceKernels):
    """Right and declared, but never puts the inputs back: only the first call is right."""

    name = "fake-triton-inplace-no-restore"
    prepared = _NoRestore
