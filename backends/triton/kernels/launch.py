"""Launch plumbing shared by the autograd wrappers: the launch policy, accumulation dtypes, rows,
the second reduction, and the row-norm kernels' launches (LayerNorm and RMSNorm, optionally with the
fused residual add).

The row launchers take [n_rows, n_cols] tensors and the output buffers they write, so the same launch
serves an out-of-place call and an in-place one (y into x, residual_out into residual).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from backends.triton.kernels import blocks, mode
from backends.triton.kernels.launcher import Options, launch_with

mode.require_selected()

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from backends.triton.kernels.layer_norm import layer_norm_bwd, layer_norm_fwd  # noqa: E402
from backends.triton.kernels.reduce import column_sum  # noqa: E402
from backends.triton.kernels.rms_norm import rms_norm_bwd, rms_norm_fwd  # noqa: E402


def policy() -> blocks.Policy:
    """The launch policy of this machine: the interpreter's, or the current GPU's."""
    if mode.select().interpreted:
        return blocks.INTERPRETED
    return _native_policy(torch.cuda.current_device())


@functools.cache
def _native_policy(device: int) -> blocks.Policy:
    # Once per device: a call that leaves the policy to this module does not query the device each time.
    props = torch.cuda.get_device_properties(device)
    # ROCm builds of torch report HIP devices through torch.cuda too: the register bound is NVIDIA's.
    registers = blocks.NVIDIA_MAX_REGISTERS if torch.version.hip is None else None
    return blocks.native_policy(props.multi_processor_count, registers)


class _Untracked:
    """The ctx of a forward run outside autograd: what it saves for a backward is dropped."""

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def tracked(ctx: Any) -> bool:
    """Whether ``ctx`` is autograd's: an untracked forward skips what only a backward would read (the
    saved tensors, the shapes and dtypes kept on ctx)."""
    return type(ctx) is not _Untracked


def apply(function: type[torch.autograd.Function], *args: Any) -> Any:
    """``function.apply(*args)``, or its forward alone where nothing will need a gradient (grad mode off,
    or no tensor argument requires one): autograd's bookkeeping costs ~10 µs of host time a call, more
    than a decode-shape kernel takes on a GPU."""
    if torch.is_grad_enabled():
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                return function.apply(*args)  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    return function.forward(_Untracked(), *args)


def acc_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """Statistics and accumulation in float32, or float64 when any operand is float64."""
    for t in tensors:  # a loop, not any(<generator>): this runs on every call
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def tl_dtype(dtype: torch.dtype) -> Any:
    return tl.float64 if dtype == torch.float64 else tl.float32


def scalars(eps: float, second: float, acc: torch.dtype, device: torch.device) -> torch.Tensor:
    """eps and the second scalar (RMSNorm's weight offset, InstanceNorm's momentum) as a [2] tensor of
    ``acc`` on ``device``, made once per distinct value and kept: read-only for every kernel.

    A tensor, not kernel scalars: Triton passes Python floats as float32, and a float64 run needs them
    exactly as given. Kept, because making it is a host-to-device copy from pageable memory, which
    synchronizes the stream: per call it cost more than the kernels at small shapes. The first call with
    new values must therefore not be inside a CUDA graph capture (warm up first, as any capture does).
    Keyed by the values' bits, so that -0.0 and NaN payloads keep their own tensors."""
    return _scalars(float(eps).hex(), float(second).hex(), acc, device)


@functools.lru_cache(maxsize=1024)
def _scalars(eps: str, second: str, acc: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor([float.fromhex(eps), float.fromhex(second)], dtype=acc, device=device)


def rows(x: torch.Tensor, normalized_shape: Sequence[int]) -> torch.Tensor:
    """x as [n_rows, n_cols] (a view when x is contiguous, else a contiguous copy)."""
    if len(normalized_shape) == 1 and x.ndim == 2 and x.shape[1] == normalized_shape[0] and x.is_contiguous():
        return x  # already [n_rows, n_cols]: no view to make (each costs host time)
    n_cols = math.prod(normalized_shape)
    if tuple(x.shape[x.ndim - len(normalized_shape) :]) != tuple(normalized_shape):
        raise ValueError(
            f"x of shape {tuple(x.shape)} does not end in normalized_shape={tuple(normalized_shape)}"
        )
    return x.reshape(-1, n_cols).contiguous()


def like_rows(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` (a gradient of rows viewed as the caller's shape) as contiguous rows shaped like ``like``;
    ``t`` itself when it is that already (a view costs host time on every backward)."""
    if t.shape == like.shape and t.is_contiguous():
        return t
    return t.reshape(like.shape).contiguous()


def shaped(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``t`` viewed as ``shape``, or ``t`` itself when it has that shape already."""
    return t if t.shape == shape else t.view(shape)


def reduce(
    parts: Sequence[tuple[torch.Tensor, torch.Tensor]], pol: blocks.Policy
) -> tuple[torch.Tensor, ...]:
    """Sum each (partial rows [programs, n_cols], like) into a tensor shaped and typed like ``like`` (a
    parameter: contiguous): one launch for up to two partial buffers of one shape (dweight and dbias),
    none for no buffer."""
    if not parts:
        return ()
    first, like = parts[0]
    outs: tuple[torch.Tensor, ...] = (torch.empty_like(like),)
    second, out2 = first, outs[0]
    if len(parts) == 2 and parts[1][0].shape == first.shape:
        second, out2 = parts[1][0], torch.empty_like(parts[1][1])
        outs = (outs[0], out2)
    elif len(parts) != 1:
        raise ValueError(f"one reduction takes one or two partial buffers of one shape: got {len(parts)}")
    b = blocks.column_sum(first.shape[0], first.shape[1], pol)
    args = (first, outs[0], second, out2, first.shape[0], first.shape[1])
    launch_with(column_sum, b.programs, args, kept(tile_options, b, _SUM, len(parts) == 2))
    return outs


# Made once per launch shape (read-only): every launch of a shape passes the same options.
@functools.lru_cache(maxsize=4096)
def launch_options(b: blocks.Blocks) -> Mapping[str, Any]:
    return MappingProxyType({**tile_options(b), "ONE_CHUNK": b.one_chunk})


# The constexprs of each kernel launched on every call, by name (values in this order at the call).
_LN_FWD = ("HAS_RES", "EXACT", "HAS_W", "HAS_B", "SAVE_STATS", "ACC")
_RMS_FWD = ("HAS_RES", "EXACT", "HAS_W", "SAVE_STATS", "ACC")
_LN_BWD = ("SUM", "HAS_DRES_OUT", "OWN_DRES", "HAS_W", "WANT_DW", "WANT_DB", "ACC")
_RMS_BWD = ("SUM", "HAS_DRES_OUT", "OWN_DRES", "HAS_W", "WANT_DW", "ACC")
_SUM = ("TWO",)


@functools.lru_cache(maxsize=4096)
def kept(
    shape: Callable[[blocks.Blocks], Mapping[str, Any]],
    b: blocks.Blocks,
    names: tuple[str, ...],
    *values: Any,
) -> Options:
    """A launch's options: the kernel's constexprs ``names`` = ``values`` and the launch shape's
    (``shape(b)``: ``launch_options`` for the row kernels, ``tile_options`` for the kernels that loop
    over every chunk), made once per distinct set and kept: a launch neither builds them again nor
    hashes them item by item (launcher.Options)."""
    return Options({**dict(zip(names, values, strict=True)), **shape(b)})


@functools.lru_cache(maxsize=4096)
def tile_options(b: blocks.Blocks) -> Mapping[str, Any]:
    """Launch options of the kernels that loop over every chunk whatever the row length."""
    return MappingProxyType({"BLOCK_M": b.block_m, "BLOCK_N": b.block_n, **warp_options(b)})


def warp_options(b: blocks.Blocks) -> dict[str, Any]:
    """num_warps, and on NVIDIA the register bound (blocks.Policy.max_registers)."""
    if b.max_registers is None:
        return {"num_warps": b.warps}
    return {"num_warps": b.warps, "maxnreg": b.max_registers}


def partial(want: bool, b: blocks.Blocks, n_cols: int, acc: torch.dtype, dummy: torch.Tensor) -> torch.Tensor:
    # Not zeroed (a fill would be one more launch): every program has at least one tile and writes its
    # row at its first; the dummy is never touched.
    # new_empty on the dummy (mean or rstd): its device without torch.empty's device keyword (cheaper).
    return dummy.new_empty((b.programs, n_cols), dtype=acc) if want else dummy


def sums(
    pairs: Sequence[tuple[bool, torch.Tensor, torch.Tensor | None]], pol: blocks.Policy
) -> tuple[torch.Tensor | None, ...]:
    """Per (wanted, partial buffer, parameter): the parameter's gradient reduced from the buffer, or None
    where not wanted; the wanted ones in one launch."""
    wanted = [(part, like) for want, part, like in pairs if want and like is not None]
    done = iter(reduce(wanted, pol))
    return tuple(next(done) if want and like is not None else None for want, _, like in pairs)


class Stream(NamedTuple):
    """The fused residual add of one forward launch, all [n_rows, n_cols]: ``residual`` in, ``out``
    (residual_out, in residual's dtype: it may be residual itself) written; ``exact``: the norm reads
    the unrounded sum rather than residual_out as stored. (A named tuple, as ``Grads``: one is made on
    every call, at half a frozen dataclass's cost.)"""

    residual: torch.Tensor
    out: torch.Tensor
    exact: bool = False


class Grads(NamedTuple):
    """Where a row backward writes dL/dx ([n_rows, n_cols]) and what the add ops add to it:
    residual_out's cotangent ``dres_out`` and a separate ``dres`` buffer when the stream's dtype differs
    from x's (with one dtype, dL/dresidual is dL/dx itself and the caller hands dx out twice)."""

    dx: torch.Tensor
    dres_out: torch.Tensor | None = None
    dres: torch.Tensor | None = None

    def kernel_args(self) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], tuple[bool, bool]]:
        """(DX, DRES_OUT, DRES) pointers, dummies where absent, and the flags that say which are real
        (HAS_DRES_OUT, OWN_DRES)."""
        dx, dres_out, dres = self.dx, self.dres_out, self.dres
        pointers = (dx, dx if dres_out is None else dres_out, dx if dres is None else dres)
        return pointers, (dres_out is not None, dres is not None)


def stream_rows(
    x: torch.Tensor, residual: torch.Tensor, normalized_shape: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """x and residual (the add ops' stream) as [n_rows, n_cols]."""
    if residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} must match x {tuple(x.shape)} in shape")
    return rows(x, normalized_shape), rows(residual, normalized_shape)


def add_grads(
    like: torch.Tensor,
    x_dtype: torch.dtype,
    res_dtype: torch.dtype,
    dres_out: torch.Tensor | None,
    want_dres: bool,
) -> Grads:
    """The add ops' backward outputs, [n_rows, n_cols] like ``like``: dx in x's dtype; dresidual a buffer
    of its own only where it is wanted and residual's dtype differs (with one dtype dL/dresidual is dx
    itself); residual_out's cotangent, if any, as rows."""
    own = want_dres and res_dtype != x_dtype
    dx = torch.empty(like.shape, dtype=x_dtype, device=like.device)
    dres = torch.empty(like.shape, dtype=res_dtype, device=like.device) if own else None
    cotangent = None if dres_out is None else like_rows(dres_out, like)
    return Grads(dx, cotangent, dres)


def dy_rows(dy: torch.Tensor | None, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dy as rows like ``like``; zeros of ``dtype`` without one (only residual_out is used downstream:
    the norm contributes nothing)."""
    if dy is None:
        return torch.zeros(like.shape, dtype=dtype, device=like.device)
    return like_rows(dy, like)


def saved_input(
    x2: torch.Tensor, stream: Stream | None, acc: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(H, RES or None): what the backward reads as the normalized input. x; residual_out when the norm
    read it as stored, or when the stream's dtype is the accumulation dtype (then residual_out holds the
    kernel's unrounded sum bit for bit); otherwise x and residual, which the backward adds again."""
    if stream is None:
        return x2, None
    if not stream.exact or stream.out.dtype == acc:
        return stream.out, None
    return x2, stream.residual


def saved(stats: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The statistics of a forward that saves them (the default, which the custom operators return)."""
    if stats is None:
        raise ValueError("the forward was asked not to save its statistics")
    return stats


def layer_norm_forward(
    x2: torch.Tensor,
    w: torch.Tensor | None,
    b_: torch.Tensor | None,
    eps: float,
    pol: blocks.Policy,
    y: torch.Tensor,
    stream: Stream | None = None,
    *,
    save: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Writes y (and the stream's residual_out); returns (mean, rstd) in the accumulation dtype, or
    None unless ``save``: then no statistics are allocated or written (a forward no backward reads)."""
    (n_rows, n_cols), acc = x2.shape, acc_dtype(x2, w, b_, None if stream is None else stream.residual)
    # Unsaved, the statistics' pointers are x's, never written (SAVE_STATS compiles the stores out).
    mean, rstd = (x2.new_empty(n_rows, dtype=acc), x2.new_empty(n_rows, dtype=acc)) if save else (x2, x2)
    b = blocks.forward(n_rows, n_cols, pol, wide=acc == torch.float64)
    res, out = (x2, y) if stream is None else (stream.residual, stream.out)
    args = (
        x2, res, x2 if w is None else w, x2 if b_ is None else b_, scalars(eps, 0.0, acc, x2.device),
        y, out, mean, rstd, n_rows, n_cols,
    )  # fmt: skip
    has_res, exact = stream is not None, stream is not None and stream.exact
    flags = (has_res, exact, w is not None, b_ is not None, save, tl_dtype(acc))
    launch_with(layer_norm_fwd, b.programs, args, kept(launch_options, b, _LN_FWD, *flags))
    return (mean, rstd) if save else None


def layer_norm_backward(
    saved: tuple[torch.Tensor, torch.Tensor | None],
    w: torch.Tensor | None,
    bias: torch.Tensor | None,
    stats: tuple[torch.Tensor, torch.Tensor],
    dy: torch.Tensor,
    grads: Grads,
    want: tuple[bool, bool],
    pol: blocks.Policy,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Writes ``grads``; returns (dweight, dbias), each None unless ``want``-ed (and present)."""
    (h, res), (mean, rstd) = saved, stats
    n_rows, n_cols = h.shape
    want_dw, want_db = want[0] and w is not None, want[1] and bias is not None
    b = blocks.backward(n_rows, n_cols, pol, wide=mean.dtype == torch.float64)
    dw_part = partial(want_dw, b, n_cols, mean.dtype, mean)
    db_part = partial(want_db, b, n_cols, mean.dtype, mean)
    (dx, dres_out, dres), (has_dres_out, own_dres) = grads.kernel_args()
    args = (
        h, h if res is None else res, h if w is None else w, dy, dres_out, mean, rstd, dx, dres,
        dw_part, db_part, n_rows, n_cols,
    )  # fmt: skip
    flags = (res is not None, has_dres_out, own_dres, w is not None, want_dw, want_db, tl_dtype(mean.dtype))
    launch_with(layer_norm_bwd, b.programs, args, kept(launch_options, b, _LN_BWD, *flags))
    dw, db = sums(((want_dw, dw_part, w), (want_db, db_part, bias)), pol)
    return dw, db


def rms_forward(
    x2: torch.Tensor,
    w: torch.Tensor | None,
    eps: float,
    offset: float,
    pol: blocks.Policy,
    y: torch.Tensor,
    stream: Stream | None = None,
    *,
    save: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Writes y (and the stream's residual_out); returns (rstd, the scalars eps and offset) in the
    accumulation dtype, or None unless ``save`` (as layer_norm_forward: no rstd allocated or written)."""
    (n_rows, n_cols), acc = x2.shape, acc_dtype(x2, w, None if stream is None else stream.residual)
    rstd = x2.new_empty(n_rows, dtype=acc) if save else x2
    consts = scalars(eps, offset, acc, x2.device)
    b = blocks.forward(n_rows, n_cols, pol, wide=acc == torch.float64)
    res, out = (x2, y) if stream is None else (stream.residual, stream.out)
    args = (x2, res, x2 if w is None else w, consts, y, out, rstd, n_rows, n_cols)
    has_res, exact = stream is not None, stream is not None and stream.exact
    flags = (has_res, exact, w is not None, save, tl_dtype(acc))
    launch_with(rms_norm_fwd, b.programs, args, kept(launch_options, b, _RMS_FWD, *flags))
    return (rstd, consts) if save else None


def rms_backward(
    saved: tuple[torch.Tensor, torch.Tensor | None],
    w: torch.Tensor | None,
    consts: torch.Tensor,
    rstd: torch.Tensor,
    dy: torch.Tensor,
    grads: Grads,
    want_dw: bool,
    pol: blocks.Policy,
) -> torch.Tensor | None:
    """Writes ``grads``; returns dweight when ``want_dw`` (and there is a weight), else None."""
    h, res = saved
    n_rows, n_cols = h.shape
    want_dw = want_dw and w is not None
    b = blocks.backward(n_rows, n_cols, pol, wide=rstd.dtype == torch.float64)
    dw_part = partial(want_dw, b, n_cols, rstd.dtype, rstd)
    (dx, dres_out, dres), (has_dres_out, own_dres) = grads.kernel_args()
    args = (
        h, h if res is None else res, h if w is None else w, consts, dy, dres_out, rstd, dx, dres,
        dw_part, n_rows, n_cols,
    )  # fmt: skip
    flags = (res is not None, has_dres_out, own_dres, w is not None, want_dw, tl_dtype(rstd.dtype))
    launch_with(rms_norm_bwd, b.programs, args, kept(launch_options, b, _RMS_BWD, *flags))
    (dw,) = sums(((want_dw, dw_part, w),), pol)
    return dw
