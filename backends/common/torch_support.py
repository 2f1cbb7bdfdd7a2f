"""Shared plumbing of the PyTorch adapters: device, NumPy<->torch copies, running-stat resets, the add
ops' residual stream, Prepared.

Each adapter only says how to build the forward computation of a case; everything else lives here.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np
import torch

from backends.common import device_timing
from backends.common.host import cpu_name
from backends.common.translate import offset_scale
from conformance.adapter.backend import Capabilities, Inputs, Outputs, Unsupported
from conformance.model.case import BATCH_NORM, GROUP_OPS, RMS_OPS, Case
from conformance.model.dtypes import DTYPES

OPS = frozenset(
    {"layer_norm", "rms_norm", "batch_norm", "add_rms_norm", "add_layer_norm", "group_norm", "instance_norm"}
)
Forward = Callable[[], torch.Tensor]
Build = Callable[[Case, "Tensors"], "TorchPrepared"]
# What torch.nn and torch.nn.functional adapters declare beyond the feature names.
LIBRARY_NOTES = {
    "param_dtype": "torch decides per device: prepare() runs a two-row probe and raises Unsupported for a"
    " mix torch rejects (on CPU, LayerNorm/BatchNorm/GroupNorm/InstanceNorm take mixed dtypes only as"
    " float16/bfloat16 activations with float32 parameters; RMSNorm takes any mix)",
    "weight_offset": "translated: torch gets the weight offset + w, held exactly in float32 or float64",
    "channels_last": "prepare() lays x (and dy) out with .contiguous(memory_format=torch.channels_last or"
    " channels_last_3d); info() memory_format names the format the tensors handed over are in",
    "residual_dtype": "the residual arrives in its stream dtype; x + residual is formed with torch's type"
    " promotion and stored in the stream dtype as residual_out; y is cast to the activation dtype",
    "exact_sum": "the norm reads x.float() + residual.float() (float64 stays float64); residual_out is that"
    " sum rounded to the stream dtype. Where the norm so reads float32 beside half parameters, the"
    " parameters are widened to float32 (exact; torch's LayerNorm takes float32 input only with float32"
    " parameters) and their gradients reported in the parameter dtype",
}
# Memory the torch adapters share by design (Capabilities.aliases; the aliasing check judges the rest).
ALIASES = {
    # torch.autograd.grad returns one tensor for x and residual: h = x + residual's AddBackward hands its
    # incoming gradient dL/dh to both inputs unchanged, as it does inside any model's backward, where
    # the two branches receive the same tensor too. .backward() into .grad would add an AccumulateGrad
    # copy that only leaf tensors pay; activations are never leaves, so the suite is shown torch's own.
    "dresidual": "dx",
    # BatchNorm / InstanceNorm training updates the running statistics in place, in the buffers it reads
    # them from (reset from the prepared values at the start of every call, so calls repeat bit for bit).
    "running_mean": "running_mean",
    "running_var": "running_var",
}
ALIAS_NOTE = (
    "dresidual is dx's tensor: torch.autograd.grad passes AddBackward's one gradient of h = x + residual to"
    " both inputs; running_mean/running_var are updated in the buffers they are read from"
)
# torch's channels-last memory format for each rank that has one (Case allows the layout only there).
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
_FORMAT_NAMES = {torch.channels_last: "channels_last", torch.channels_last_3d: "channels_last_3d"}


def device() -> torch.device:
    """The device every torch adapter runs on: the current CUDA device when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()


def capabilities(features: frozenset[str], notes: Mapping[str, str] | None = None) -> Capabilities:
    """Capabilities of a torch adapter on this machine's device (cheap: no kernels run)."""
    dev = device()
    return Capabilities(
        ops=OPS,
        dtypes=frozenset(DTYPES),
        features=features,
        device=dev.type,
        device_name=device_name(dev),
        notes={"torch": torch.__version__, "aliases": ALIAS_NOTE, **(notes or {})},
        aliases=ALIASES,
    )


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a contract dtype name."""
    dtypes = {
        "float64": torch.float64,
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
    }
    return dtypes[name]


def to_torch(array: np.ndarray, dev: torch.device) -> torch.Tensor:
    """A copy of ``array`` on ``dev``; never shares memory with the caller's array."""
    host = np.array(array, copy=True, order="C")
    if host.dtype == np.dtype(ml_dtypes.bfloat16):
        # torch.from_numpy does not know ml_dtypes.bfloat16: move the same bits through int16.
        return torch.from_numpy(host.view(np.int16)).view(torch.bfloat16).to(dev)
    return torch.from_numpy(host).to(dev)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host copy of ``tensor`` (bfloat16 as ml_dtypes.bfloat16); never aliases torch storage."""
    host = tensor.detach().to("cpu")
    if host.dtype == torch.bfloat16:
        # NumPy has no bfloat16 torch can hand over: move the same bits through int16.
        host = host.view(torch.int16)
    array: np.ndarray = host.numpy().copy()
    return array.view(ml_dtypes.bfloat16) if tensor.dtype == torch.bfloat16 else array


def threads() -> int:
    """Apply ``OMP_NUM_THREADS`` when set and return torch's intra-op thread count.

    torch reads the variable only when it is first imported; a session that sets it later (the
    benchmarks fix the count before preparing any case) still gets it through here.
    """
    wanted = os.environ.get("OMP_NUM_THREADS", "").strip()
    if wanted.isdigit() and int(wanted) > 0 and torch.get_num_threads() != int(wanted):
        torch.set_num_threads(int(wanted))
    return torch.get_num_threads()


class TorchCopy:
    """A device copy of ``nbytes`` (float32 elements): the benchmarks' memory roofline on this device."""

    def __init__(self, nbytes: int) -> None:
        threads()
        self._device = device()
        self._src = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=self._device)
        self._dst = torch.empty_like(self._src)

    def __call__(self) -> None:
        self._dst.copy_(self._src)

    def synchronize(self) -> None:
        synchronize(self._device)

    def outputs(self) -> Outputs:
        return {}

    def info(self) -> dict[str, str | int]:
        return {"threads": torch.get_num_threads(), "copy": "torch.Tensor.copy_"}


def copy_kernel(nbytes: int) -> TorchCopy:
    """The optional ``Backend.copy_kernel`` of every torch adapter."""
    return TorchCopy(nbytes)


def synchronize(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def momentum_factor(momentum: float | None, num_batches_tracked: torch.Tensor) -> float:
    """torch.nn's rule for one training step: count the batch; momentum None is a cumulative average."""
    num_batches_tracked.add_(1)
    if momentum is None:
        # float() of the counter waits for the device, exactly as torch.nn's own forward does.
        return 1.0 / float(num_batches_tracked)
    return momentum


class Residual:
    """The add ops' residual stream: ``add(x)`` forms h = x + residual as the case's convention asks
    (the composed op's first half), keeps h stored in the stream dtype as residual_out, and returns
    what the norm reads, so the sum is formed once per call inside autograd.

    ``stream`` is the stored dtype (the activation dtype, or float32 for "residual in fp32");
    ``exact``: the norm reads the sum in float32 (or float64) rather than the stored value.
    """

    def __init__(self, residual: torch.Tensor, stream: torch.dtype, *, exact: bool) -> None:
        self.residual = residual
        self.stream = stream
        self.exact = exact
        self.last: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact:
            wide = norm_dtype(x.dtype, self.stream, exact=True)
            total = x.to(wide) + self.residual.to(wide)
            # The stored copy is the rounded float32 sum, so dresidual_out joins the norm's gradient
            # in float32 and dx / dresidual are each rounded once, as a fused kernel's are.
            self.last = total.to(self.stream)
            return total
        # torch's promotion forms the sum in the wider of the two dtypes; .to() is a no-op unless the
        # stream is narrower than x (a float32 stream beside float64 activations).
        self.last = (x + self.residual).to(self.stream)
        return self.last

    def like(self, x: torch.Tensor) -> Residual:
        """A zero residual of the same dtype, stream and convention, shaped like ``x`` (probes)."""
        zeros = torch.zeros_like(x, dtype=self.residual.dtype).requires_grad_(self.residual.requires_grad)
        return Residual(zeros, self.stream, exact=self.exact)


def norm_dtype(activation: torch.dtype, stream: torch.dtype, *, exact: bool) -> torch.dtype:
    """The dtype of what an add op's norm reads: the stored sum's (the stream dtype), or for the exact
    sum float32 or wider (float64 activations or stream stay float64)."""
    if not exact:
        return stream
    return torch.promote_types(torch.promote_types(activation, stream), torch.float32)


@dataclass(frozen=True)
class Tensors:
    """A case's inputs on the device; ``x`` (and weight/bias when given) require grad when gradients do."""

    x: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    dy: torch.Tensor | None
    residual: Residual | None = None
    dresidual_out: torch.Tensor | None = None  # the add ops' cotangent of residual_out, with dy

    def input(self) -> torch.Tensor:
        """What the normalization reads: x, or for the add ops the sum of x and the residual their
        convention asks for (inside autograd)."""
        return self.x if self.residual is None else self.residual.add(self.x)

    def given(self) -> dict[str, torch.Tensor]:
        """The inputs as loaded, by contract name (what buffers() reports unless an adapter computes
        with its own copy, a module's parameter)."""
        named = {
            "x": self.x,
            "residual": None if self.residual is None else self.residual.residual,
            "weight": self.weight,
            "bias": self.bias,
            "running_mean": self.running_mean,
            "running_var": self.running_var,
            "dy": self.dy,
            "dresidual_out": self.dresidual_out,
        }
        return {name: tensor for name, tensor in named.items() if tensor is not None}

    def mixed(self) -> bool:
        """Whether any parameter's dtype differs from the activations'."""
        params = (self.weight, self.bias, self.running_mean, self.running_var)
        return any(p is not None and p.dtype != self.x.dtype for p in params)

    def tiny(self, case: Case) -> Tensors:
        """Same dtypes, parameters and memory format, a two-row x: enough to learn whether torch accepts
        the dtypes."""
        if case.op == BATCH_NORM:
            shape = (2, case.shape[1]) + (1,) * (len(case.shape) - 2)
        elif case.op in GROUP_OPS:
            # Two values per spatial dim: InstanceNorm refuses a single value per instance, and a
            # channels-last tensor of size-1 spatial dims would also be contiguous.
            shape = (2, case.shape[1]) + (2,) * (len(case.shape) - 2)
        else:
            shape = (2, *case.param_shape)
        fmt = memory_format(case)
        x = torch.zeros(shape, dtype=self.x.dtype, device=self.x.device).contiguous(memory_format=fmt)
        dy = None if self.dy is None else torch.zeros_like(x, dtype=self.dy.dtype)
        residual = None if self.residual is None else self.residual.like(x)
        cotangent = self.dresidual_out
        dresidual_out = None if cotangent is None else torch.zeros_like(x, dtype=cotangent.dtype)
        return replace(
            self,
            x=x.requires_grad_(self.x.requires_grad),
            weight=_clone(self.weight),
            bias=_clone(self.bias),
            running_mean=_clone(self.running_mean),
            running_var=_clone(self.running_var),
            dy=dy,
            residual=residual,
            dresidual_out=dresidual_out,
        )


def _clone(tensor: torch.Tensor | None) -> torch.Tensor | None:
    if tensor is None:
        return None
    return tensor.detach().clone().requires_grad_(tensor.requires_grad)


def memory_format(case: Case) -> torch.memory_format:
    """The memory format the case asks x to be computed in: channels_last(_3d), else contiguous."""
    if case.layout == "channels_last":
        return CHANNELS_LAST[len(case.shape)]
    return torch.contiguous_format


def laid_out(tensor: torch.Tensor) -> str:
    """The memory formats ``tensor``'s strides satisfy, '+'-joined ('strided' for none): read from the
    tensor itself, so info() reports what an op was handed, not what was asked for."""
    formats = [torch.contiguous_format]
    if tensor.dim() in CHANNELS_LAST:
        formats.append(CHANNELS_LAST[tensor.dim()])
    names = [_FORMAT_NAMES.get(f, "contiguous") for f in formats if tensor.is_contiguous(memory_format=f)]
    return "+".join(names) or "strided"


def layout_info(case: Case, tensors: Tensors) -> dict[str, str | int | float | bool]:
    """info() fields of the memory format x (and dy) are handed over in, for the ops that have layouts."""
    if case.op not in GROUP_OPS and case.layout == "contiguous":
        return {}
    info: dict[str, str | int | float | bool] = {"memory_format": laid_out(tensors.x)}
    if tensors.dy is not None:
        info["dy_memory_format"] = laid_out(tensors.dy)
    return info


def to_device(case: Case, inputs: Inputs, *, grad: bool, weight: np.ndarray | None = None) -> Tensors:
    """Copy the inputs to the device, x and dy in the case's memory format; ``weight`` replaces the
    input weight (an adapter's translation)."""
    dev = device()
    threads()
    fmt = memory_format(case)

    def get(name: str, *, leaf: bool = False) -> torch.Tensor | None:
        if name not in inputs:
            return None
        value = weight if name == "weight" and weight is not None else inputs[name]
        return to_torch(value, dev).requires_grad_(leaf and grad)

    dy = get("dy") if grad else None
    residual = None
    if "residual" in inputs:
        # The residual is differentiated as x is (dresidual), in the stream dtype it arrives in.
        stream = torch_dtype(case.stream_dtype)
        value = to_torch(inputs["residual"], dev).requires_grad_(grad)
        residual = Residual(value, stream, exact=case.norm_input == "exact")
    return Tensors(
        # Converted before requires_grad_, so x stays the leaf autograd differentiates (a no-op when
        # contiguous); a channels-last dy keeps the backward kernels on the same layout.
        x=to_torch(inputs["x"], dev).contiguous(memory_format=fmt).requires_grad_(grad),
        weight=get("weight", leaf=True),
        bias=get("bias", leaf=True),
        running_mean=get("running_mean"),
        running_var=get("running_var"),
        dy=None if dy is None else dy.contiguous(memory_format=fmt),
        residual=residual,
        dresidual_out=get("dresidual_out") if grad else None,
    )


def probe(build: Build, case: Case, tensors: Tensors, *, weightless: bool = False) -> None:
    """Raise Unsupported when torch rejects this mix of activation and parameter dtypes on the device,
    and with ``weightless`` also when it cannot differentiate a call given a bias but no weight (torch
    2.13's CPU group_norm backward cannot).

    Runs the adapter's own build on a two-row copy, so the answer is torch's, not a table of guesses.
    """
    mixed = tensors.mixed()
    bias_only = weightless and tensors.dy is not None and tensors.weight is None and tensors.bias is not None
    if not mixed and not bias_only:
        return
    try:
        build(case, tensors.tiny(case))()
    except RuntimeError as error:
        what = f"dtype={case.dtype} activations and param_dtype={case.weight_dtype}"
        raise Unsupported(
            f"torch {torch.__version__} on {tensors.x.device.type} rejects op={case.op} with "
            + (what if mixed else "a bias and no weight in the backward")
            + f": {error}"
        ) from error


class RunningStats:
    """BatchNorm buffers updated in place by a training call, and their prepared initial values."""

    def __init__(self, mean: torch.Tensor, var: torch.Tensor, num_batches_tracked: torch.Tensor) -> None:
        self._live = (mean, var, num_batches_tracked)
        self._initial = tuple(t.detach().clone() for t in self._live)

    def reset(self) -> None:
        # Every call starts from the prepared state, so repeated calls (benchmarks, determinism)
        # compute the same update instead of compounding it.
        with torch.no_grad():
            for live, initial in zip(self._live, self._initial, strict=True):
                live.copy_(initial)

    def outputs(self) -> dict[str, np.ndarray]:
        mean, var, _ = self._live
        return {"running_mean": to_numpy(mean), "running_var": to_numpy(var)}

    def buffers(self) -> dict[str, torch.Tensor]:
        """The statistics' live buffers: the inputs a training call reads and the outputs it writes."""
        mean, var, _ = self._live
        return {"running_mean": mean, "running_var": var}


@dataclass(frozen=True)
class Quiet:
    """A warning torch raises on a path the adapter chose deliberately, with the reason it is ignored."""

    message: str
    why: str


class TorchPrepared:
    """One case ready to run: ``forward`` builds y; with ``dy``, autograd.grad gives the ``wrt`` grads
    (and for the add ops dresidual, through both outputs: dy on y, dresidual_out on residual_out).

    ``computed_with`` names the tensors the forward reads where they are not the loaded inputs (a
    module's own parameters and running-statistics buffers): buffers() reports them. ``cast_y``: the
    add ops' y is cast to the activation dtype (see _y); False keeps the dtype the forward returns.
    """

    def __init__(
        self,
        forward: Forward,
        tensors: Tensors,
        wrt: Mapping[str, torch.Tensor],
        *,
        stats: RunningStats | None = None,
        out_dtypes: Mapping[str, torch.dtype] | None = None,
        quiet: Quiet | None = None,
        computed_with: Mapping[str, torch.Tensor | None] | None = None,
        cast_y: bool = True,
    ) -> None:
        self._forward = forward
        self._dy = tensors.dy
        self._dresidual_out = tensors.dresidual_out
        self._activation = tensors.x.dtype if cast_y else None
        self._residual = tensors.residual
        self._wrt = _with_residual(wrt, tensors) if tensors.dy is not None else {}
        self._stats = stats
        self._out_dtypes = dict(out_dtypes or {})
        self._quiet = quiet
        self._device = tensors.x.device
        given = tensors.given()
        mine = {k: v for k, v in (computed_with or {}).items() if k in given and v is not None}
        self._inputs = {**given, **mine}
        self._results: dict[str, torch.Tensor] = {}
        # What an adapter adds to info() about this case (a class name, a translation it made).
        self.described: dict[str, str | int | float | bool] = {}

    def __call__(self) -> None:
        if self._stats is not None:
            self._stats.reset()
        if self._quiet is None:
            self._results = self._run()
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=self._quiet.message, category=UserWarning)
            self._results = self._run()

    def _run(self) -> dict[str, torch.Tensor]:
        if self._dy is None:
            with torch.no_grad():
                return {"y": self._y(), **self._residual_out()}
        with torch.enable_grad():
            y = self._y()
            stored = self._residual_out()
            outputs, cotangents = [y], [self._dy]
            if stored and self._dresidual_out is not None:
                # The next layer reads residual_out too: its cotangent joins dy's at h.
                outputs.append(stored["residual_out"])
                cotangents.append(self._dresidual_out)
            # autograd.grad returns fresh gradients: nothing accumulates into .grad across calls.
            grads = torch.autograd.grad(outputs, list(self._wrt.values()), grad_outputs=cotangents)
        kept = {name: value.detach() for name, value in stored.items()}
        return {"y": y.detach(), **kept, **dict(zip(self._wrt, grads, strict=True))}

    def _y(self) -> torch.Tensor:
        y = self._forward()
        if self._residual is None or self._activation is None:
            return y
        # The add ops return y in the activation dtype (it is the next layer's input): where the
        # composition computes in float32 (a float32 stream or sum, or float32 parameters promoting
        # y), this cast is the one rounding a fused kernel makes when it stores y. A no-op otherwise.
        return y.to(self._activation)

    def _residual_out(self) -> dict[str, torch.Tensor]:
        if self._residual is None or self._residual.last is None:
            return {}
        return {"residual_out": self._residual.last}

    def synchronize(self) -> None:
        synchronize(self._device)

    def device_timing(self) -> dict[str, float | str] | None:
        """The kernels' time per call apart from the host's, on CUDA (backends/common/device_timing.py);
        None on the CPU, where there is no separate device."""
        return device_timing.info(self, self._device)

    def info(self) -> dict[str, str | int | float | bool]:
        """The intra-op thread count the calls ran with (the benchmarks check it against theirs), and what
        the adapter described."""
        return {"threads": torch.get_num_threads(), **self.described}

    def buffers(self) -> dict[str, torch.Tensor]:
        """The aliasing check's evidence: the inputs as the tensors the computation reads, the outputs as
        the tensors the last call produced (running statistics: the buffers updated in place)."""
        produced = {name: value.detach() for name, value in self._results.items()}
        live = self._stats.buffers() if self._stats is not None else {}
        return {**self._inputs, **produced, **live}

    def outputs(self) -> Outputs:
        if not self._results:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        out = {name: to_numpy(self._cast(name, value)) for name, value in self._results.items()}
        if self._stats is not None:
            out.update(self._stats.outputs())
        return out

    def _cast(self, name: str, value: torch.Tensor) -> torch.Tensor:
        dtype = self._out_dtypes.get(name)
        return value if dtype is None else value.to(dtype)


def _with_residual(wrt: Mapping[str, torch.Tensor], tensors: Tensors) -> dict[str, torch.Tensor]:
    """The gradient targets, plus the residual (dresidual) for the add ops."""
    if tensors.residual is None:
        return dict(wrt)
    return {**wrt, "dresidual": tensors.residual.residual}


# torch.rms_norm warns when weight and input dtypes differ and takes its composite path, which upcasts
# and multiplies by the weight in the wider dtype: the mixed-dtype computation the case asks for.
MIXED_RMS = Quiet(
    message="Mismatch dtype between input and weight",
    why="the composite (unfused) path is the intended one for mixed dtypes; the warning is about speed",
)


def library_prepared(
    case: Case,
    tensors: Tensors,
    forward: Forward,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    stats: RunningStats | None = None,
    module: torch.nn.Module | None = None,
    cast_y: bool = True,
) -> TorchPrepared:
    """The Prepared of a library call (torch.nn, torch.nn.functional) on ``tensors``; ``module`` is the
    torch.nn module the call runs, whose own parameters and buffers are what it computes with;
    ``cast_y`` as TorchPrepared's."""
    params = torch_dtype(case.weight_dtype)
    # A translated weight (offset_scale) or parameters widened by norm_params may be wider than the param
    # dtype; their gradients are reported in the param dtype, as torch would give them for that dtype.
    # (A module's own bias is left alone: nemotron's is held in its translated weight's dtype.)
    held = {"dweight": weight, "dbias": tensors.bias}
    widened = {grad: params for grad, p in held.items() if p is not None and p.dtype != params}
    prepared = TorchPrepared(
        forward,
        tensors,
        gradient_targets(case, tensors.x, weight, bias),
        stats=stats,
        out_dtypes=widened,
        quiet=MIXED_RMS if case.op in RMS_OPS and tensors.mixed() else None,
        computed_with={**module_tensors(module), "weight": weight, "bias": bias},
        cast_y=cast_y,
    )
    prepared.described.update(layout_info(case, tensors))
    return prepared


def module_tensors(module: torch.nn.Module | None) -> dict[str, torch.Tensor | None]:
    """A module's parameters and running-statistics buffers by contract name (None where it has none)."""
    if module is None:
        return {}
    names = ("weight", "bias", "running_mean", "running_var")
    found = {name: getattr(module, name, None) for name in names}
    return {name: value if isinstance(value, torch.Tensor) else None for name, value in found.items()}


def norm_params(tensors: Tensors) -> Tensors:
    """The add ops' parameters in the dtype their norm reads, where that is wider than the activations
    (a float32 stream or exact sum beside half parameters): torch's LayerNorm takes float32 input only
    with float32 parameters. The widening is exact; library_prepared reports the gradients in the
    parameter dtype."""
    residual = tensors.residual
    if residual is None:
        return tensors
    reads = norm_dtype(tensors.x.dtype, residual.stream, exact=residual.exact)
    if reads == tensors.x.dtype:
        return tensors
    return replace(tensors, weight=_widened(tensors.weight, reads), bias=_widened(tensors.bias, reads))


def _widened(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if tensor is None or torch.promote_types(tensor.dtype, dtype) == tensor.dtype:
        return tensor
    return tensor.detach().to(dtype).requires_grad_(tensor.requires_grad)


def first_step_momentum(momentum: float | None) -> float:
    """The factor of one running-statistics update: momentum None is the cumulative average, whose
    first step has factor 1/1; every call starts from the prepared statistics, so each call is a first
    step and 1.0 is exact."""
    return 1.0 if momentum is None else momentum


def prepare_library(
    build: Build, case: Case, inputs: Inputs, *, grad: bool, weightless: bool = False
) -> TorchPrepared:
    """Load (translating Gemma's offset into the weight, widening the parameters to what an add op's
    norm reads), check torch accepts the dtypes (and with ``weightless`` a bias without a weight; see
    probe), build."""
    weight = None
    if case.weight_offset:
        weight = offset_scale(inputs["weight"], case.weight_offset, case.weight_dtype)
    tensors = norm_params(to_device(case, inputs, grad=grad, weight=weight))
    probe(build, case, tensors, weightless=weightless)
    return build(case, tensors)


def gradient_targets(
    case: Case, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """Output name -> tensor to differentiate: dx always, dweight/dbias for the case's own parameters."""
    wrt = {"dx": x}
    if case.weight and weight is not None:
        wrt["dweight"] = weight
    if case.bias and bias is not None:
        wrt["dbias"] = bias
    return wrt
