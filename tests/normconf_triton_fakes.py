"""Fake Triton backends for the meta-tests: a real @triton.jit LayerNorm kernel, run natively or under
the interpreter, in a broken and a correct build.

Loaded into a conformance run with ``-p normconf_triton_fakes`` (tests/ on PYTHONPATH). The broken
build lets the padded lanes of a power-of-two block enter the variance, the classic masked-lane bug:
it is exact when the row fills the block and wrong for every other row length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import conformance
from backends.triton_kernels import blocks, mode
from conformance.adapter.backend import Capabilities
from conformance.model.case import Case

mode.select()  # before Triton is imported: switches the interpreter on where there is no GPU

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from backends import _torch_common as common  # noqa: E402


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
