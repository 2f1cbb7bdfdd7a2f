"""normconf's Triton kernels through their autograd.Functions: masking, multi-chunk rows, row tails,
float32 statistics, deterministic dweight, and gradients against float64 torch autograd.

Runs natively on a GPU, else under the Triton interpreter; shapes stay small so the interpreter is fast.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from backends.triton_kernels import blocks, mode  # noqa: E402

DEVICE = mode.select().device
from backends.triton_kernels import functions as F  # noqa: E402

# Forces several chunks per row, several rows per tile and a strided backward loop on small shapes.
SMALL = blocks.Policy(max_block_n=64, tile=256, max_programs=3)
HALF_BOUND = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float64: 1e-12}


def _t(shape, dtype, *, scale=1.0, shift=0.0, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    value = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + shift
    return value.to(dtype).to(DEVICE).requires_grad_(grad)


def _ref(op, x, w, b, residual, eps, offset, dy):
    """float64 torch autograd on the same (rounded) inputs: (outputs, grads of x, w, b)."""
    leaves = [v.detach().double().requires_grad_() if v is not None else None for v in (x, w, b)]
    x64, w64, b64 = leaves
    n = x.shape[-1:]
    if op == "layer_norm":
        outs = [torch.nn.functional.layer_norm(x64, n, w64, b64, eps)]
    else:
        h = x64
        if residual is not None:
            rounded = (x.detach().double() + residual.double()).to(x.dtype).double()
            h = x64 + (rounded - x64).detach()  # the rounded sum, with d/dx = 1
        scale = None if w64 is None else offset + w64
        outs = [torch.nn.functional.rms_norm(h, n, scale, eps)]
        if residual is not None:
            outs.append(h)
    grads = torch.autograd.grad(outs[0], [v for v in leaves if v is not None], dy.double())
    return [o.detach() for o in outs], grads


def _run(op, x, w, b, residual, eps, offset, dy, pol):
    n = x.shape[-1:]
    if op == "layer_norm":
        outs = [F.layer_norm(x, n, w, b, eps=eps, pol=pol)]
    elif op == "rms_norm":
        outs = [F.rms_norm(x, n, w, eps=eps, weight_offset=offset, pol=pol)]
    else:
        outs = list(F.add_rms_norm(x, residual, n, w, eps=eps, weight_offset=offset, pol=pol))
    grads = torch.autograd.grad(outs[0], [v for v in (x, w, b) if v is not None], dy)
    return outs, grads


def _close(actual, expected, dtype):
    err = (actual.double().cpu() - expected.cpu()).abs().max().item()
    assert err <= HALF_BOUND[dtype] * max(1.0, expected.abs().max().item()), err


def _check(op, shape, dtype, pol, *, weight=True, bias=None, param=None, offset=0.0, shift=0.0):
    n = shape[-1]
    bias = op == "layer_norm" if bias is None else bias
    x = _t(shape, dtype, shift=shift, grad=True)
    w = _t((n,), param or dtype, scale=0.2, shift=1.0, seed=1, grad=True) if weight else None
    b = _t((n,), param or dtype, scale=0.2, seed=2, grad=True) if bias else None
    residual = _t(shape, dtype, seed=3) if op == "add_rms_norm" else None
    dy = _t(shape, dtype, seed=4)
    outs, grads = _run(op, x, w, b, residual, 1e-5, offset, dy, pol)
    ref_outs, ref_grads = _ref(op, x, w, b, residual, 1e-5, offset, dy)
    for actual, expected in zip(outs, ref_outs, strict=True):
        assert actual.dtype == dtype
        _close(actual, expected, dtype)
    for actual, leaf, expected in zip(grads, [v for v in (x, w, b) if v is not None], ref_grads, strict=True):
        assert actual.dtype == leaf.dtype and actual.shape == leaf.shape
        # dweight/dbias sum over rows: judge them relative to their own size.
        _close(actual, expected, leaf.dtype)
    return outs, grads


OPS = ("layer_norm", "rms_norm", "add_rms_norm")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [1, 3, 40, 127])
def test_rows_shorter_than_the_block_leave_padded_lanes_out(op, n):
    # A large mean makes any padded lane in the variance visible (it would add mean^2 per lane).
    _check(op, (5, n), torch.float32, blocks.INTERPRETED, shift=30.0)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_rows_longer_than_a_chunk_loop_over_chunks(op, dtype):
    assert blocks.forward(7, 300, SMALL).chunks == 5
    _check(op, (7, 300), dtype, SMALL, offset=1.0 if op != "layer_norm" else 0.0, shift=3.0)


@pytest.mark.parametrize("op", OPS)
def test_a_row_longer_than_the_default_chunk(op):
    assert blocks.forward(2, 8200, blocks.INTERPRETED).chunks == 3
    _check(op, (2, 8200), torch.float32, blocks.INTERPRETED)


@pytest.mark.parametrize("op", OPS)
def test_a_partial_last_tile_of_rows(op):
    # 37 rows in tiles of 4 rows (SMALL with 64 columns): the last tile has one live row.
    assert blocks.forward(37, 64, SMALL).block_m == 4
    _check(op, (37, 64), torch.bfloat16, SMALL)


@pytest.mark.parametrize(("weight", "bias"), [(False, True), (True, False), (False, False)])
def test_layer_norm_affine_variants(weight, bias):
    _check("layer_norm", (6, 33), torch.float32, SMALL, weight=weight, bias=bias)


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
def test_rms_without_weight(op):
    _check(op, (6, 33), torch.float32, SMALL, weight=False)


@pytest.mark.parametrize("op", OPS)
def test_half_activations_with_float32_parameters(op):
    _, grads = _check(op, (8, 200), torch.bfloat16, SMALL, param=torch.float32)
    assert grads[1].dtype == torch.float32


def test_statistics_are_float32_for_half_inputs():
    # Rows of 4096 values near 1000: a float16 sum of squares would overflow (max 65504) and a float16
    # mean would lose the small deviations entirely.
    _check("layer_norm", (2, 4096), torch.float16, blocks.INTERPRETED, shift=1000.0)
    _check("rms_norm", (2, 4096), torch.float16, blocks.INTERPRETED, shift=1000.0)


def test_residual_out_is_the_sum_rounded_once():
    x, residual = _t((4, 100), torch.bfloat16), _t((4, 100), torch.bfloat16, seed=5)
    _, h = F.add_rms_norm(x, residual, (100,), None, eps=1e-6)
    assert torch.equal(h, x + residual)  # torch rounds the bfloat16 sum to nearest even too


def test_multi_axis_rows_are_the_flattened_trailing_dims():
    x = _t((3, 4, 10), torch.float32)
    w = _t((4, 10), torch.float32, seed=1)
    y = F.layer_norm(x, (4, 10), w, None, eps=1e-5)
    expected = torch.nn.functional.layer_norm(x.double(), (4, 10), w.double(), None, 1e-5)
    _close(y, expected, torch.float32)


@pytest.mark.parametrize("op", OPS)
def test_dweight_has_the_same_bits_on_every_run(op):
    # 32 tiles of 16 rows over 5 programs: several tiles per program, then the second reduction.
    bits = []
    for _ in range(2):
        _, grads = _run(
            op,
            _t((512, 48), torch.bfloat16, grad=True),
            _t((48,), torch.float32, seed=1, grad=True),
            _t((48,), torch.float32, seed=2, grad=True) if op == "layer_norm" else None,
            _t((512, 48), torch.bfloat16, seed=3) if op == "add_rms_norm" else None,
            1e-5,
            0.0,
            _t((512, 48), torch.bfloat16, seed=4),
            blocks.Policy(max_block_n=4096, tile=1024, max_programs=5),
        )
        bits.append([g.cpu().view(torch.int16 if g.dtype == torch.bfloat16 else torch.int32) for g in grads])
    for first, second in zip(*bits, strict=True):
        assert torch.equal(first, second)


@pytest.mark.parametrize("op", OPS)
def test_gradients_pass_gradcheck_in_float64(op):
    # Central differences through the kernels' own float64 path: 3 chunks of 4, 2-row tiles, 2 programs.
    tiny = blocks.Policy(max_block_n=4, tile=8, max_programs=2)
    assert blocks.backward(3, 9, tiny) == blocks.Blocks(2, 4, 3, 1, 2)
    x = _t((3, 9), torch.float64, grad=True)
    w = _t((9,), torch.float64, seed=1, shift=1.0, grad=True)
    if op == "layer_norm":
        b = _t((9,), torch.float64, seed=2, grad=True)
        fn = lambda x, w, b: F.layer_norm(x, (9,), w, b, eps=1e-5, pol=tiny)  # noqa: E731
        inputs = (x, w, b)
    elif op == "rms_norm":
        fn = lambda x, w: F.rms_norm(x, (9,), w, eps=1e-5, weight_offset=0.5, pol=tiny)  # noqa: E731
        inputs = (x, w)
    else:
        r = _t((3, 9), torch.float64, seed=3, grad=True)
        # Both outputs: residual_out's own upstream gradient flows back to x and residual too.
        fn = lambda x, r, w: F.add_rms_norm(x, r, (9,), w, eps=1e-5, pol=tiny)  # noqa: E731
        inputs = (x, r, w)
    # fast_mode: random projections of the Jacobian, so a handful of interpreted launches suffice.
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8, fast_mode=True)


def test_residual_must_match_x():
    x = _t((2, 8), torch.float32)
    with pytest.raises(ValueError, match="must match"):
        F.add_rms_norm(x, x.to(torch.float64), (8,), None, eps=1e-6)
