"""The kernels as PyTorch custom operators (backends/triton/kernels/ops.py): torch.library.opcheck on each
(schema, fake implementation, autograd registration, dispatch under AOT autograd), a block of them
compiled with fullgraph=True and traced with fake tensors, and opcheck catching a broken fake."""

from __future__ import annotations

import pytest

from backends.triton.kernels import mode

mode.select()

import torch  # noqa: E402
from torch.testing._internal.optests import OpCheckError  # noqa: E402

from backends.triton.kernels import functions as F  # noqa: E402
from backends.triton.kernels import ops  # noqa: E402

GEN = torch.Generator().manual_seed(0)


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, generator=GEN).requires_grad_(True)


X, R, R64, W, B = _t(3, 8), _t(3, 8), _t(3, 8, dtype=torch.float64), _t(8), _t(8)

CALLS = {
    "rms_norm": (torch.ops.normconf.rms_norm.default, [(X, W, [8], 1e-5, 0.0), (X, None, [8], 1e-6, 1.0)]),
    "layer_norm": (torch.ops.normconf.layer_norm.default, [(X, W, B, [8], 1e-5), (X, None, None, [8], 1e-5)]),
    "add_rms_norm": (
        torch.ops.normconf.add_rms_norm.default,
        [(X, R, W, [8], 1e-5, 0.0, False), (X, R64, None, [8], 1e-5, 1.0, True)],
    ),
    "add_layer_norm": (
        torch.ops.normconf.add_layer_norm.default,
        [(X, R, W, B, [8], 1e-5, False), (X, R64, W, None, [8], 1e-5, True)],
    ),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_opcheck(name):
    op, calls = CALLS[name]
    for args in calls:
        torch.library.opcheck(op, args)  # raises OpCheckError with the failed test's name


def test_opcheck_catches_a_fake_that_lies_about_its_output():
    # The broken build: a fake implementation that promises rstd per column instead of per row.
    @torch.library.custom_op("normconf_test::rms_norm_bad_fake", mutates_args=())
    def bad(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.rms_norm(x, weight, [x.shape[-1]], 1e-5, 0.0)

    @bad.register_fake
    def _(x, weight):
        return torch.empty_like(x), x.new_empty((x.shape[-1],))

    with pytest.raises(OpCheckError, match="test_faketensor"):
        torch.library.opcheck(bad, (X.detach(), W.detach()))


def _block(x, residual, w, b):
    """A pre-norm step: the residual add + RMSNorm, then a LayerNorm and an RMSNorm of its output."""
    y, h = F.add_rms_norm(x, residual, (8,), w, eps=1e-6)
    z = F.layer_norm(y * 2.0, (8,), w, b, eps=1e-5)
    return F.rms_norm(z + h, (8,), w, eps=1e-6, weight_offset=1.0).sum()


def test_a_block_of_the_functions_compiles_with_no_graph_break_and_the_same_results():
    explained = torch._dynamo.explain(_block)(X, R, W, B)
    assert explained.graph_break_count == 0 and len(explained.graphs) == 1
    code = explained.graphs[0].code  # the functions went through the operators while compiling
    assert all(f"torch.ops.normconf.{op}" in code for op in ("add_rms_norm", "layer_norm", "rms_norm"))
    compiled = torch.compile(_block, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(X, R, W, B), (X, R, W, B))
    want = torch.autograd.grad(_block(X, R, W, B), (X, R, W, B))
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_traced_with_fake_tensors_the_block_is_our_operators():
    from torch.fx.experimental.proxy_tensor import make_fx

    def traced(x, residual, w, b):
        with torch._dynamo.config.patch(suppress_errors=False):
            y, h = ops.add_rms_norm_y(x, residual, (8,), w, 1e-6, 0.0, False)
            return ops.rms_norm_y(ops.layer_norm_y(y, (8,), w, b, 1e-5) + h, (8,), w, 1e-6, 1.0)

    graph = make_fx(traced, tracing_mode="fake")(X.detach(), R.detach(), W.detach(), B.detach())
    called = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert [c for c in called if c.startswith("normconf.")] == [
        "normconf.add_rms_norm.default",
        "normconf.layer_norm.default",
        "normconf.rms_norm.default",
    ]
