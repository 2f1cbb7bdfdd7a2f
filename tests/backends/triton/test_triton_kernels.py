"""normconf's Triton kernels through their autograd.Functions: masking, multi-chunk rows, row tails,
float32 statistics, deterministic dweight, the fused residual add's conventions and in-place form, and
gradients against float64 torch autograd.

Runs natively on a GPU, else under the Triton interpreter; shapes stay small so the interpreter is fast.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from backends.triton.kernels import blocks, mode  # noqa: E402

DEVICE = mode.select().device
from backends.triton.kernels import functions as F  # noqa: E402

# Forces several chunks per row, several rows per tile and a strided backward loop on small shapes.
SMALL = blocks.Policy(max_block_n=64, tile=256, max_programs=3)
HALF_BOUND = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float64: 1e-12}
ADD_OPS = ("add_rms_norm", "add_layer_norm")
LN_OPS = ("layer_norm", "add_layer_norm")


def _t(shape, dtype, *, scale=1.0, shift=0.0, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    value = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + shift
    return value.to(dtype).to(DEVICE).requires_grad_(grad)


def _ref(op, x, w, b, residual, eps, offset, cotangents, exact=False):
    """float64 torch autograd on the same (rounded) inputs: (outputs, grads of x, residual, w, b).

    The add ops: h = x + residual (exact in float64), stored rounded once to residual's dtype; the
    norm reads the stored h (its rounding has derivative 1) or, ``exact``, the sum itself."""
    leaves = [v.detach().double().requires_grad_() if v is not None else None for v in (x, residual, w, b)]
    x64, r64, w64, b64 = leaves
    n = x.shape[-1:]
    h = x64
    if residual is not None:
        total = x64 + r64
        stored = total + (total.detach().to(residual.dtype).double() - total).detach()
        h = total if exact else stored
    if op in LN_OPS:
        outs = [torch.nn.functional.layer_norm(h, n, w64, b64, eps)]
    else:
        outs = [torch.nn.functional.rms_norm(h, n, None if w64 is None else offset + w64, eps)]
    if residual is not None:
        outs.append(stored)
    live = [v for v in leaves if v is not None]
    grads = torch.autograd.grad(outs, live, [c.double() for c in cotangents])
    return [o.detach() for o in outs], grads


def _run(op, x, w, b, residual, eps, offset, cotangents, pol, exact=False):
    n = x.shape[-1:]
    if op == "layer_norm":
        outs = [F.layer_norm(x, n, w, b, eps=eps, pol=pol)]
    elif op == "rms_norm":
        outs = [F.rms_norm(x, n, w, eps=eps, weight_offset=offset, pol=pol)]
    elif op == "add_rms_norm":
        outs = list(F.add_rms_norm(x, residual, n, w, eps=eps, weight_offset=offset, exact=exact, pol=pol))
    else:
        outs = list(F.add_layer_norm(x, residual, n, w, b, eps=eps, exact=exact, pol=pol))
    grads = torch.autograd.grad(outs, [v for v in (x, residual, w, b) if v is not None], cotangents)
    return outs, grads


def _close(actual, expected, dtype):
    err = (actual.double().cpu() - expected.cpu()).abs().max().item()
    assert err <= HALF_BOUND[dtype] * max(1.0, expected.abs().max().item()), err


def _check(
    op,
    shape,
    dtype,
    pol,
    *,
    weight=True,
    bias=None,
    param=None,
    offset=0.0,
    shift=0.0,
    stream=None,
    exact=False,
):
    """Outputs and every gradient of ``op`` against float64 autograd; the add ops' ``stream`` is
    residual's dtype (default x's), ``exact`` has the norm read the unrounded sum."""
    n = shape[-1]
    bias = op in LN_OPS if bias is None else bias
    x = _t(shape, dtype, shift=shift, grad=True)
    w = _t((n,), param or dtype, scale=0.2, shift=1.0, seed=1, grad=True) if weight else None
    b = _t((n,), param or dtype, scale=0.2, seed=2, grad=True) if bias else None
    residual = _t(shape, stream or dtype, seed=3, grad=True) if op in ADD_OPS else None
    cotangents = [_t(shape, dtype, seed=4)]
    if residual is not None:
        cotangents.append(_t(shape, residual.dtype, seed=5))
    outs, grads = _run(op, x, w, b, residual, 1e-5, offset, cotangents, pol, exact)
    ref_outs, ref_grads = _ref(op, x, w, b, residual, 1e-5, offset, cotangents, exact)
    assert outs[0].dtype == dtype
    _close(outs[0], ref_outs[0], dtype)
    if residual is not None:
        # residual_out is the exact sum rounded once to the stream's dtype: bit for bit.
        assert outs[1].dtype == residual.dtype and torch.equal(outs[1].double().cpu(), ref_outs[1].cpu())
    leaves = [v for v in (x, residual, w, b) if v is not None]
    for actual, leaf, expected in zip(grads, leaves, ref_grads, strict=True):
        assert actual.dtype == leaf.dtype and actual.shape == leaf.shape
        # dweight/dbias sum over rows: judge them relative to their own size.
        _close(actual, expected, leaf.dtype)
    return outs, grads


OPS = ("layer_norm", "rms_norm", *ADD_OPS)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [1, 3, 40, 127])
def test_rows_shorter_than_the_block_leave_padded_lanes_out(op, n):
    # A large mean makes any padded lane in the variance visible (it would add mean^2 per lane).
    _check(op, (5, n), torch.float32, blocks.INTERPRETED, shift=30.0)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_rows_longer_than_a_chunk_loop_over_chunks(op, dtype):
    assert blocks.forward(7, 300, SMALL).chunks == 5
    _check(op, (7, 300), dtype, SMALL, offset=1.0 if "rms" in op else 0.0, shift=3.0)


@pytest.mark.parametrize("op", OPS)
def test_a_row_longer_than_the_default_chunk(op):
    assert blocks.forward(2, 8200, blocks.INTERPRETED).chunks == 3
    _check(op, (2, 8200), torch.float32, blocks.INTERPRETED)


@pytest.mark.parametrize("op", OPS)
def test_a_partial_last_tile_of_rows(op):
    # 37 rows in tiles of 4 rows (SMALL with 64 columns): the last tile has one live row.
    assert blocks.forward(37, 64, SMALL).block_m == 4
    _check(op, (37, 64), torch.bfloat16, SMALL)


@pytest.mark.parametrize("op", LN_OPS)
@pytest.mark.parametrize(("weight", "bias"), [(False, True), (True, False), (False, False)])
def test_layer_norm_affine_variants(op, weight, bias):
    _check(op, (6, 33), torch.float32, SMALL, weight=weight, bias=bias)


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
def test_rms_without_weight(op):
    _check(op, (6, 33), torch.float32, SMALL, weight=False)


@pytest.mark.parametrize("op", OPS)
def test_half_activations_with_float32_parameters(op):
    _, grads = _check(op, (8, 200), torch.bfloat16, SMALL, param=torch.float32)
    assert grads[-2 if op in LN_OPS else -1].dtype == torch.float32


def test_statistics_are_float32_for_half_inputs():
    # Rows of 4096 values near 1000: a float16 sum of squares would overflow (max 65504) and a float16
    # mean would lose the small deviations entirely.
    _check("layer_norm", (2, 4096), torch.float16, blocks.INTERPRETED, shift=1000.0)
    _check("rms_norm", (2, 4096), torch.float16, blocks.INTERPRETED, shift=1000.0)


# ---------------------------------------------------------------- the residual stream's conventions

# (activations, residual stream, the norm reads the exact sum): each convention of Case.residual_dtype
# and Case.norm_input, in the dtypes the ci profile runs them.
CONVENTIONS = [
    (torch.bfloat16, torch.bfloat16, False),
    (torch.bfloat16, torch.bfloat16, True),
    (torch.bfloat16, torch.float32, False),
    (torch.float16, torch.float32, True),
    (torch.float32, torch.float32, True),
]


@pytest.mark.parametrize("op", ADD_OPS)
@pytest.mark.parametrize(("dtype", "stream", "exact"), CONVENTIONS, ids=str)
@pytest.mark.parametrize("pol", [blocks.INTERPRETED, SMALL], ids=["one-chunk", "chunks"])
def test_each_residual_convention_forward_and_backward(op, dtype, stream, exact, pol):
    _check(op, (6, 150), dtype, pol, stream=stream, exact=exact, offset=0.5 if "rms" in op else 0.0)


@pytest.mark.parametrize("op", ADD_OPS)
@pytest.mark.parametrize("pol", [blocks.INTERPRETED, SMALL], ids=["one-chunk", "chunks"])
def test_each_sum_convention_is_the_one_computed(op, pol):
    # Values near 64 with residuals of ~0.25: bfloat16 (8 bits) rounds most of each residual away, so
    # the two conventions differ by about half an ulp of y everywhere. Over 4096 values each convention's
    # output lies closer, on average, to its own float64 reference than to the other's.
    x = _t((16, 256), torch.bfloat16, scale=64.0)
    residual = _t((16, 256), torch.bfloat16, scale=0.25, seed=6)
    fn = F.add_layer_norm if op in LN_OPS else F.add_rms_norm
    cotangents = [torch.ones_like(x)] * 2
    refs = {exact: _ref(op, x, None, None, residual, 1e-5, 0.0, cotangents, exact)[0][0] for exact in (0, 1)}
    for exact in (False, True):
        y, h = fn(x, residual, (256,), eps=1e-5, exact=exact, pol=pol)
        own, other = ((y.double().cpu() - refs[e].cpu()).abs().mean().item() for e in (exact, not exact))
        assert own < 0.9 * other, (exact, own, other)
        assert torch.equal(h, (x.double() + residual.double()).to(torch.bfloat16))  # stored alike


def test_residual_out_is_the_sum_rounded_once():
    x, residual = _t((4, 100), torch.bfloat16), _t((4, 100), torch.bfloat16, seed=5)
    _, h = F.add_rms_norm(x, residual, (100,), None, eps=1e-6)
    assert torch.equal(h, x + residual)  # torch rounds the bfloat16 sum to nearest even too
    # A float32 stream keeps the float32 sum: x is upcast, never residual rounded down.
    wide = _t((4, 100), torch.float32, seed=5)
    _, h = F.add_layer_norm(x, wide, (100,), None, None, eps=1e-6)
    assert h.dtype == torch.float32 and torch.equal(h, x.float() + wide)


@pytest.mark.parametrize("op", ADD_OPS)
def test_one_stream_dtype_hands_out_one_gradient_tensor(op):
    # dL/dx and dL/dresidual are the same values; with one dtype they are one tensor (as autograd's add
    # does), with a float32 stream dresidual has its own float32 buffer.
    for stream, shared in ((torch.bfloat16, True), (torch.float32, False)):
        x, residual = _t((3, 16), torch.bfloat16, grad=True), _t((3, 16), stream, seed=1, grad=True)
        fn = F.add_layer_norm if op in LN_OPS else F.add_rms_norm
        y, h = fn(x, residual, (16,), eps=1e-5)
        dx, dres = torch.autograd.grad([y, h], [x, residual], [torch.ones_like(y), torch.ones_like(h)])
        assert (dx.data_ptr() == dres.data_ptr()) is shared and dres.dtype == stream


@pytest.mark.parametrize("op", ADD_OPS)
def test_a_gradient_through_residual_out_alone(op):
    # Only residual_out used downstream: y's cotangent is None and dL/dh is residual_out's cotangent.
    x, residual = _t((3, 16), torch.float32, grad=True), _t((3, 16), torch.float32, seed=1, grad=True)
    fn = F.add_layer_norm if op in LN_OPS else F.add_rms_norm
    _, h = fn(x, residual, (16,), eps=1e-5)
    g = _t((3, 16), torch.float32, seed=2)
    dx, dres = torch.autograd.grad(h, [x, residual], g)
    assert torch.equal(dx, g) and torch.equal(dres, g)


# ---------------------------------------------------------------- in place


@pytest.mark.parametrize("op", ADD_OPS)
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("pol", [blocks.INTERPRETED, SMALL], ids=["one-chunk", "chunks"])
def test_in_place_writes_the_out_of_place_bits_into_x_and_residual(op, exact, pol):
    # Chunked rows read x and residual in every pass and write only in the last: in place, an earlier
    # write would feed y back into the statistics.
    x, residual = _t((5, 150), torch.bfloat16, shift=2.0), _t((5, 150), torch.bfloat16, seed=1)
    w, b = _t((150,), torch.float32, seed=2), _t((150,), torch.float32, seed=3)
    if op in LN_OPS:
        y, h = F.add_layer_norm(x, residual, (150,), w, b, eps=1e-5, exact=exact, pol=pol)
        out = F.add_layer_norm_(x, residual, (150,), w, b, eps=1e-5, exact=exact, pol=pol)
    else:
        y, h = F.add_rms_norm(x, residual, (150,), w, eps=1e-5, weight_offset=1.0, exact=exact, pol=pol)
        out = F.add_rms_norm_(x, residual, (150,), w, eps=1e-5, weight_offset=1.0, exact=exact, pol=pol)
    assert out[0] is x and out[1] is residual
    assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    assert torch.equal(residual.view(torch.int16), h.view(torch.int16))


def test_in_place_refuses_buffers_it_cannot_write_through():
    x = _t((8, 6), torch.float32)
    with pytest.raises(ValueError, match="must be contiguous"):
        F.add_rms_norm_(x.t(), x.t().clone(), (8,), eps=1e-5)


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
        residual = _t((512, 48), torch.bfloat16, seed=3, grad=True) if op in ADD_OPS else None
        cotangents = [_t((512, 48), torch.bfloat16, seed=4)]
        if residual is not None:
            cotangents.append(_t((512, 48), torch.bfloat16, seed=5))
        _, grads = _run(
            op,
            _t((512, 48), torch.bfloat16, grad=True),
            _t((48,), torch.float32, seed=1, grad=True),
            _t((48,), torch.float32, seed=2, grad=True) if op in LN_OPS else None,
            residual,
            1e-5,
            0.0,
            cotangents,
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
    b = _t((9,), torch.float64, seed=2, grad=True)
    r = _t((3, 9), torch.float64, seed=3, grad=True)
    # The add ops: both outputs, so residual_out's own upstream gradient flows back to x and residual too.
    fns = {
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (9,), w, b, eps=1e-5, pol=tiny), (x, w, b)),
        "rms_norm": (lambda x, w: F.rms_norm(x, (9,), w, eps=1e-5, weight_offset=0.5, pol=tiny), (x, w)),
        "add_rms_norm": (lambda x, r, w: F.add_rms_norm(x, r, (9,), w, eps=1e-5, pol=tiny), (x, r, w)),
        "add_layer_norm": (
            lambda x, r, w, b: F.add_layer_norm(x, r, (9,), w, b, eps=1e-5, pol=tiny),
            (x, r, w, b),
        ),
    }
    fn, inputs = fns[op]
    # fast_mode: random projections of the Jacobian, so a handful of interpreted launches suffice.
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8, fast_mode=True)


def test_residual_must_match_x_in_shape():
    x = _t((2, 8), torch.float32)
    with pytest.raises(ValueError, match="must match"):
        F.add_rms_norm(x, x[:, :4].to(torch.float64), (8,), None, eps=1e-6)
    with pytest.raises(ValueError, match="must match"):
        F.add_layer_norm(x, x[:1], (8,), None, None, eps=1e-6)


# ---------------------------------------------------------------- GroupNorm / InstanceNorm


def _gn_leaves(shape, dtype, *, weight=True, bias=True, param=None, shift=0.0, scale=1.0):
    channels = shape[1]
    x = _t(shape, dtype, shift=shift, scale=scale, grad=True)
    # Per-channel weights far from each other: a weight read for the wrong channel shows.
    w = _t((channels,), param or dtype, scale=0.5, shift=1.0, seed=1, grad=True) if weight else None
    b = _t((channels,), param or dtype, scale=0.5, seed=2, grad=True) if bias else None
    return x, w, b, _t(shape, dtype, seed=4)


def _gn_check(x, w, b, dy, run, ref):
    """run(x, w, b) with the kernels against ref(x, w, b) in float64 torch autograd on the same bits."""
    leaves = [v for v in (x, w, b) if v is not None]
    y = run(x, w, b)
    grads = torch.autograd.grad(y, leaves, dy)
    ref_leaves = [v.detach().double().requires_grad_() for v in leaves]
    full = iter(ref_leaves)
    y64 = ref(*(next(full) if v is not None else None for v in (x, w, b)))
    ref_grads = torch.autograd.grad(y64, ref_leaves, dy.double())
    assert y.dtype == x.dtype and y.shape == x.shape
    _close(y, y64.detach(), x.dtype)
    for actual, leaf, expected in zip(grads, leaves, ref_grads, strict=True):
        assert actual.dtype == leaf.dtype and actual.shape == leaf.shape
        _close(actual, expected, leaf.dtype)


def _gn_ref(x, groups, w, b, eps):
    """GroupNorm composed of float64 torch ops: the backward of torch's own CPU kernel fails for a bias
    without a weight ("tensor does not have a device", torch 2.13)."""
    rows = x.reshape(x.shape[0], groups, -1)
    mean = rows.mean(dim=2, keepdim=True)
    var = ((rows - mean) ** 2).mean(dim=2, keepdim=True)
    y = ((rows - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    if w is not None:
        y = y * w.reshape(per_channel)
    if b is not None:
        y = y + b.reshape(per_channel)
    return y


def _gn(shape, groups, dtype, pol, *, shift=0.0, **params):
    x, w, b, dy = _gn_leaves(shape, dtype, shift=shift, **params)
    _gn_check(
        x, w, b, dy,
        lambda x, w, b: F.group_norm(x, groups, w, b, eps=1e-5, pol=pol),
        lambda x, w, b: _gn_ref(x, groups, w, b, 1e-5),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "groups"),
    [((2, 6, 5), 1), ((2, 6, 5), 3), ((2, 6, 5), 6), ((3, 4), 2), ((2, 4, 3, 5), 2), ((1, 3, 2, 2, 2), 3)],
)
def test_group_norm_statistics_per_group_and_affine_per_channel(shape, groups):
    # A large mean makes any padded lane in the variance visible (groups of 15, 10 or 12 values in 16
    # lanes). Groups of two values fill their block, and a mean 30 times their spread would only make
    # dx ill-conditioned (kappa ~ 1e3 there).
    shift = 0.0 if len(shape) == 2 else 30.0
    _gn(shape, groups, torch.float32, blocks.INTERPRETED, shift=shift)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_groups_longer_than_a_chunk_loop_over_chunks(dtype):
    # Groups of 3 channels x 50 values in chunks of 64 lanes; channel rows of 50 in one chunk.
    assert blocks.forward(4, 150, SMALL).chunks == 3
    _gn((2, 6, 50), 2, dtype, SMALL, shift=3.0)


def test_a_partial_last_tile_of_group_rows():
    # 15 group rows of 8 values in tiles of 4 rows: the last tile has three live rows.
    pol = blocks.Policy(max_block_n=64, tile=32, max_programs=3)
    assert blocks.forward(15, 8, pol) == blocks.Blocks(4, 8, 1, 1, 4)
    _gn((5, 6, 4), 3, torch.bfloat16, pol)


@pytest.mark.parametrize(("weight", "bias"), [(False, True), (True, False), (False, False)])
def test_group_norm_affine_variants(weight, bias):
    _gn((2, 6, 9), 3, torch.float32, SMALL, weight=weight, bias=bias)


def test_group_norm_half_activations_with_float32_parameters():
    _gn((2, 8, 25), 4, torch.bfloat16, SMALL, param=torch.float32)


@pytest.mark.parametrize("pol", [blocks.INTERPRETED, SMALL], ids=["one-chunk", "chunks"])
def test_group_statistics_are_float32_for_half_inputs(pol):
    # Groups of 4096 values near 1000: float16 sums of squares would overflow and a float16 mean would
    # lose the deviations entirely.
    _gn((2, 4, 2048), 2, torch.float16, pol, shift=1000.0)


def _in_ref(x, w, b, running=None, use_input_stats=True, momentum=0.1):
    rm, rv = running if running is not None else (None, None)
    return torch.nn.functional.instance_norm(x, rm, rv, w, b, use_input_stats, momentum, 1e-5)


def _stats(channels, dtype):
    gen = torch.Generator().manual_seed(7)
    mean = torch.randn(channels, generator=gen, dtype=torch.float64)
    var = torch.rand(channels, generator=gen, dtype=torch.float64) + 0.5
    return mean.to(dtype).to(DEVICE), var.to(dtype).to(DEVICE)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("pol", [blocks.INTERPRETED, SMALL], ids=["one-chunk", "chunks"])
def test_instance_norm_is_group_norm_with_one_channel_per_group(affine, pol):
    x, w, b, dy = _gn_leaves((4, 3, 70), torch.float32, weight=affine, bias=affine, shift=5.0)
    _gn_check(
        x, w, b, dy,
        lambda x, w, b: F.instance_norm(x, w, b, eps=1e-5, pol=pol),
        lambda x, w, b: _in_ref(x, w, b),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_instance_norm_eval_normalizes_with_the_running_statistics(dtype):
    x, w, b, dy = _gn_leaves((3, 4, 2, 5), dtype, shift=2.0)
    running = _stats(4, dtype)
    before = [t.clone() for t in running]
    _gn_check(
        x, w, b, dy,
        lambda x, w, b: F.instance_norm(x, w, b, *running, use_input_stats=False, eps=1e-5, pol=SMALL),
        lambda x, w, b: _in_ref(x, w, b, [t.double() for t in running], use_input_stats=False),
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(running, before, strict=True))  # eval leaves them


@pytest.mark.parametrize(
    ("dtype", "param"),
    [(torch.float32, None), (torch.float64, None), (torch.bfloat16, None), (torch.float16, torch.float32)],
)
@pytest.mark.parametrize("momentum", [0.1, 1.0])
def test_instance_norm_training_updates_the_running_statistics(dtype, param, momentum):
    x = _t((5, 3, 40), dtype, shift=4.0, scale=2.0)
    running = _stats(3, param or dtype)
    expected = [t.double() for t in running]
    F.instance_norm(x, None, None, *running, momentum=momentum, eps=1e-5, pol=SMALL)
    _in_ref(x.double(), None, None, expected, momentum=momentum)
    for actual, want in zip(running, expected, strict=True):
        assert actual.dtype == (param or dtype)
        _close(actual, want, actual.dtype)


def test_running_variance_keeps_the_spread_of_near_constant_instances():
    # Spread 1e-4 around 5 and eps 1e-2: var = 1e-8 is lost in rsqrt(var + eps), so a running variance
    # recovered from rstd would be noise; from the kernel's own two-pass variance it is float32-accurate.
    x = _t((4, 2, 64), torch.float32, shift=5.0, scale=1e-4)
    running = [torch.zeros(2, device=DEVICE), torch.zeros(2, device=DEVICE)]
    F.instance_norm(x, None, None, *running, momentum=1.0, eps=1e-2, pol=SMALL)
    x64 = x.double()
    expected = x64.var(dim=2, unbiased=True).mean(dim=0)
    assert torch.allclose(running[1].double().cpu(), expected.cpu(), rtol=1e-4, atol=0.0)
    assert torch.allclose(running[0].double().cpu(), x64.mean(dim=2).mean(dim=0).cpu(), rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_group_norm_dweight_and_dbias_have_the_same_bits_on_every_run(groups):
    # Per-(sample, channel) sums, then the fixed-order column sum over 64 samples.
    bits = []
    for _ in range(2):
        x, w, b, dy = _gn_leaves((64, 16, 12), torch.bfloat16, param=torch.float32)
        y = F.group_norm(x, groups, w, b, eps=1e-5, pol=SMALL)
        grads = torch.autograd.grad(y, [x, w, b], dy)
        bits.append([g.cpu().view(torch.int16 if g.dtype == torch.bfloat16 else torch.int32) for g in grads])
    for first, second in zip(*bits, strict=True):
        assert torch.equal(first, second)


@pytest.mark.parametrize("mode_", ["group", "instance", "running"])
def test_group_norm_gradients_pass_gradcheck_in_float64(mode_):
    # Central differences through the kernels' float64 path: groups of 2 channels x 5 in chunks of 4.
    tiny = blocks.Policy(max_block_n=4, tile=8, max_programs=2)
    x = _t((2, 4, 5), torch.float64, grad=True)
    w = _t((4,), torch.float64, seed=1, shift=1.0, grad=True)
    b = _t((4,), torch.float64, seed=2, grad=True)
    if mode_ == "group":
        fn = lambda x, w, b: F.group_norm(x, 2, w, b, eps=1e-5, pol=tiny)  # noqa: E731
    elif mode_ == "instance":
        fn = lambda x, w, b: F.instance_norm(x, w, b, eps=1e-5, pol=tiny)  # noqa: E731
    else:
        rm, rv = _stats(4, torch.float64)
        fn = lambda x, w, b: F.instance_norm(  # noqa: E731
            x, w, b, rm, rv, use_input_stats=False, eps=1e-5, pol=tiny
        )
    assert torch.autograd.gradcheck(fn, (x, w, b), eps=1e-6, atol=1e-8, fast_mode=True)


def test_group_and_instance_norm_refuse_what_they_cannot_compute():
    x = _t((2, 6, 4), torch.float32)
    with pytest.raises(ValueError, match="num_groups=4 must divide C"):
        F.group_norm(x, 4, eps=1e-5)
    with pytest.raises(ValueError, match="per-channel tensors"):
        F.group_norm(x, 3, torch.ones(4, device=DEVICE), eps=1e-5)
    with pytest.raises(ValueError, match="spatial"):
        F.instance_norm(_t((2, 6), torch.float32), eps=1e-5)
    with pytest.raises(ValueError, match="more than one spatial value"):
        F.instance_norm(_t((2, 6, 1), torch.float32), eps=1e-5)
    with pytest.raises(ValueError, match="use_input_stats=False needs them"):
        F.instance_norm(x, use_input_stats=False, eps=1e-5)
