"""ONNX Runtime plumbing of the ONNX adapters: provider, session options and cache, OrtValues, Prepared.

Inputs and outputs cross into ORT as OrtValues over host NumPy buffers bound once per case; bfloat16
travels as its uint16 bits, because ORT's Python binding has no NumPy type for it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort  # type: ignore[import-untyped]  # ships no type information
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state  # type: ignore[import-untyped]

from backends.common.host import cpu_name
from conformance.adapter.backend import BackendUnavailable, Capabilities, Outputs, Unsupported
from conformance.model.dtypes import DTYPES

OPS = frozenset({"layer_norm", "rms_norm", "batch_norm", "add_rms_norm", "group_norm", "instance_norm"})
# ORT_ENABLE_ALL is ORT's default: the suite runs the graph users get, fusions included.
OPTIMIZATION = "ORT_ENABLE_ALL"
ONNX_TYPES: dict[str, int] = {
    "float64": onnx.TensorProto.DOUBLE,
    "float32": onnx.TensorProto.FLOAT,
    "float16": onnx.TensorProto.FLOAT16,
    "bfloat16": onnx.TensorProto.BFLOAT16,
}
# ORT's type strings (NodeArg.type) -> contract dtype names.
_ORT_TYPES = {
    "tensor(double)": "float64",
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
}
_BF16 = np.dtype(ml_dtypes.bfloat16)
# Whether a session's intra-op threads spin while they wait for work (ORT's default) or wait blocked.
# A spinning thread keeps a core busy all the time its session is idle between runs; in a conformance
# run that is nearly all the time (the oracle, the judging and the other checks run between two calls),
# and the core it holds is the one another xdist worker or the compiles ahead would use: on two cores a
# ci run of the ORT backends took twice its wall time in CPU. Blocked, the threads are the same, each
# kernel splits its work the same way and the outputs are bit for bit the same (tests pin it); only a
# run's wake-up differs. The benchmarks time ORT as it is configured by default: they set it to 1.
SPINNING_VARIABLE = "NORMCONF_ORT_SPINNING"
_SPINNING_ENTRY = "session.intra_op.allow_spinning"
_ONNX_NAMES = {name: value[len("tensor(") : -1] for value, name in _ORT_TYPES.items()}


def provider() -> str:
    """The execution provider sessions use: CUDA when this ORT build has it, else the CPU."""
    available = ort.get_available_providers()
    return "CUDAExecutionProvider" if "CUDAExecutionProvider" in available else "CPUExecutionProvider"


def spinning() -> bool:
    """Whether sessions spin while idle: NORMCONF_ORT_SPINNING (0 or 1), else 0 (they wait blocked)."""
    raw = os.environ.get(SPINNING_VARIABLE, "").strip()
    if raw in ("", "0", "1"):
        return raw == "1"
    raise BackendUnavailable(
        f"{SPINNING_VARIABLE}={raw!r} is not allowed; allowed: 0 (intra-op threads wait blocked, the"
        " default) or 1 (they spin, as ONNX Runtime's own default)"
    )


def capabilities(
    features: frozenset[str], notes: Mapping[str, str], *, ops: frozenset[str] = OPS
) -> Capabilities:
    """What an ORT adapter declares: ``ops`` (OPS unless given), every dtype (kernels are found per case),
    no backward."""
    cuda = provider() == "CUDAExecutionProvider"
    return Capabilities(
        ops=ops,
        dtypes=frozenset(DTYPES),
        features=features,
        device="cuda" if cuda else "cpu",
        device_name="CUDA device of ONNX Runtime" if cuda else cpu_name(),
        notes={
            "onnxruntime": ort.__version__,
            "onnx": onnx.__version__,
            "execution_provider": provider(),
            "graph_optimization_level": OPTIMIZATION,
            "intra_op_spinning": f"{int(spinning())} ({SPINNING_VARIABLE}: 0, the default, threads wait"
            " blocked between runs; 1, they spin, as ONNX Runtime's default and the benchmarks)",
            "backward": "not declared: ONNX Runtime inference sessions have no autograd",
            "dtypes": "all four are passed in (bfloat16 as OrtValues over its uint16 bits); a dtype the"
            " provider has no kernel for is Unsupported from prepare() with ORT's NOT_IMPLEMENTED message",
            **notes,
        },
    )


def session(model: onnx.ModelProto, what: str) -> ort.InferenceSession:
    """An ORT session for ``model``; a missing kernel (NOT_IMPLEMENTED) is Unsupported, naming ``what``."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION)
    options.add_session_config_entry(_SPINNING_ENTRY, "1" if spinning() else "0")
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=[provider()])
    except ort_state.NotImplemented as error:
        raise Unsupported(
            f"onnxruntime {ort.__version__} {provider()} has no kernel for {what}: {error}"
        ) from error


@functools.cache
def _kernels(provider_name: str) -> frozenset[tuple[str, int, int, str]]:
    """(op, first opset, last opset, T's type) of every ONNX-domain kernel ``provider_name`` registers."""
    return frozenset(
        (kernel.op_name, *kernel.version_range, type_name)
        for kernel in ort_state.get_all_opkernel_def()
        if kernel.provider == provider_name and kernel.domain == ""
        for type_name in kernel.type_constraints.get("T", [])
    )


def kernel_or_function(op: str, opset: int, dtype: str) -> str:
    """How the session's provider runs the ONNX op ``op``-``opset`` on ``dtype``: its "kernel"; a
    "float32 kernel between Casts" (ORT's InsertCastTransformer runs float16 nodes that have no float16
    kernel on the float32 one); or, for an op with an ONNX function body and no kernel, the "function
    body" inlined into primitive ops at session creation."""
    kernels = {
        (first, last, type_name) for name, first, last, type_name in _kernels(provider()) if name == op
    }
    types = {type_name for first, last, type_name in kernels if first <= opset <= last}
    if f"tensor({_ONNX_NAMES[dtype]})" in types:
        return "kernel"
    if dtype == "float16" and "tensor(float)" in types:
        return "float32 kernel between Casts"
    schema = onnx.defs.get_schema(op, opset)
    # OpSchema is a pybind class whose stubs lack the two function flags.
    if getattr(schema, "has_function", False) or getattr(schema, "has_context_dependent_function", False):
        return "function body"
    return f"no {dtype} kernel"


class Cache:
    """Sessions (or the Unsupported reason) by signature; the leading dimensions are dynamic."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, object] = {}

    def get(self, key: Hashable, build: Callable[[], object]) -> tuple[object, bool]:
        """(the entry for ``key``, whether it was cached); an Unsupported from ``build`` is cached too."""
        hit = key in self._entries
        if not hit:
            try:
                self._entries[key] = build()
            except Unsupported as exc:
                self._entries[key] = exc
        entry = self._entries[key]
        if isinstance(entry, Unsupported):
            raise Unsupported(str(entry))
        return entry, hit

    def __len__(self) -> int:
        return len(self._entries)


def ortvalue(array: np.ndarray) -> ort.OrtValue:
    """An OrtValue over ``array``'s memory (the caller keeps ``array`` alive); bfloat16 via uint16 bits."""
    if array.dtype == _BF16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            array.view(np.uint16), onnx.TensorProto.BFLOAT16
        )
    return ort.OrtValue.ortvalue_from_numpy(array)


def _storage(dtype: str) -> np.dtype[np.generic]:
    """The NumPy dtype of a host output buffer ORT can write into (bfloat16 as uint16)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def output_dtypes(sess: ort.InferenceSession) -> dict[str, str]:
    """Graph output name -> contract dtype name, as the session reports them."""
    dtypes = {}
    for arg in sess.get_outputs():
        if arg.type not in _ORT_TYPES:
            raise Unsupported(
                f"graph output {arg.name} has type {arg.type}; the contract takes float outputs"
            )
        dtypes[arg.name] = _ORT_TYPES[arg.type]
    return dtypes


@dataclass(frozen=True)
class Bound:
    """One output: the contract name, the graph's output name, its shape and dtype."""

    output: str
    graph_name: str
    shape: tuple[int, ...]
    dtype: str


class OrtPrepared:
    """A session with the case's inputs and output buffers bound; a call is one run_with_iobinding."""

    def __init__(
        self,
        sess: ort.InferenceSession,
        feeds: Mapping[str, np.ndarray],
        bound: tuple[Bound, ...],
        info: Mapping[str, str | int | float | bool],
    ) -> None:
        self._session = sess
        # Copies, held for the session's lifetime: OrtValues alias them, and the caller's arrays
        # must stay untouched (inputs_unchanged).
        self._feeds = {name: np.array(value, copy=True, order="C") for name, value in feeds.items()}
        self._buffers = {b.output: np.zeros(b.shape, _storage(b.dtype)) for b in bound}
        self._bound = bound
        self._info = dict(info)
        self._binding = sess.io_binding()
        for name, value in self._feeds.items():
            self._binding.bind_ortvalue_input(name, ortvalue(value))
        for b in bound:
            self._binding.bind_ortvalue_output(b.graph_name, ortvalue(self._view(b)))
        self._ran = False

    def _view(self, b: Bound) -> np.ndarray:
        buffer = self._buffers[b.output]
        return buffer.view(_BF16) if b.dtype == "bfloat16" else buffer

    def __call__(self) -> None:
        self._session.run_with_iobinding(self._binding)
        self._ran = True

    def synchronize(self) -> None:
        # Outputs are bound to host buffers: run_with_iobinding returns once they are written.
        pass

    def outputs(self) -> Outputs:
        if not self._ran:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        return {b.output: np.array(self._view(b), copy=True) for b in self._bound}

    def info(self) -> dict[str, str | int | float | bool]:
        return dict(self._info)

    def host_buffers(self) -> dict[str, np.ndarray]:
        """The host memory the session reads and writes: each feed's copy by graph input name, each
        output's bound buffer by contract name (the evidence an adapter's ``buffers()`` reports)."""
        return {**self._feeds, **{b.output: self._buffers[b.output] for b in self._bound}}


class ReportedOrtPrepared(OrtPrepared):
    """OrtPrepared that reports its buffers to the aliasing check; for graphs whose input names are the
    contract's (x, residual, weight, bias, ...)."""

    def buffers(self) -> dict[str, np.ndarray]:
        # A name that is an input and an output (BatchNorm's running_mean) is two buffers here, one name
        # in the contract: left out, so neither is taken for the other.
        both = set(self._feeds) & {b.output for b in self._bound}
        return {name: value for name, value in self.host_buffers().items() if name not in both}


def session_info(sess: ort.InferenceSession) -> dict[str, str | int | float | bool]:
    """What every ORT result records: version, the providers the session runs on, optimization level."""
    return {
        "onnxruntime": ort.__version__,
        "execution_provider": ",".join(sess.get_providers()),
        "graph_optimization_level": OPTIMIZATION,
        # As the session holds it (session() always sets it).
        "intra_op_spinning": sess.get_session_options().get_session_config_entry(_SPINNING_ENTRY) != "0",
    }
