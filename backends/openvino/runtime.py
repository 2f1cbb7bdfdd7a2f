"""openvino, openvino-default: OpenVINO's CPU runtime running the suite's hand-built ONNX graphs.

The graphs are backends/onnx/graphs.py's (LayerNormalization-17, RMSNormalization-23,
BatchNormalization-15 inference and training, Add + RMSNormalization or LayerNormalization with the
residual conventions' Casts, GroupNormalization-21 or -18,
InstanceNormalization with its running-statistics graphs), with its PyTorch translations,
read by ``core.read_model`` from the serialized ModelProto and compiled for the "CPU" device in
prepare(); a call runs the compiled model's InferRequest only.

- ``openvino`` pins INFERENCE_PRECISION_HINT to f32: the runtime compared as a faithful f32 runtime.
- ``openvino-default`` passes no hint, so the plugin's default precision policy applies (bf16 on CPUs
  with AVX512-BF16 or AMX, f16 on ARM, else f32), and builds the norm between two MatMul nodes, where a
  deployed model has it: the plugin keeps a graph's tail in f32, so a lone norm would never be lowered
  (backends/openvino/graph_edits.py ``fence``). Every result records the hint and the precision the runtime
  chose for the normalization's nodes (backends/openvino/precision.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import openvino as ov

from backends.common import ort_support as _ort
from backends.onnx import graphs
from backends.openvino import graph_edits as edits
from backends.openvino import precision
from conformance.adapter.backend import FEATURES, Capabilities, Inputs, Outputs, Prepared, Unsupported
from conformance.model.case import BATCH_NORM, GROUP_NORM, INSTANCE_NORM, Case
from conformance.model.dtypes import DTYPES

DEVICE = "CPU"
HINT = "INFERENCE_PRECISION_HINT"
_BF16 = np.dtype(ml_dtypes.bfloat16)
Info = dict[str, str | int | float | bool]


@dataclass(frozen=True)
class Policy:
    """How a backend compiles: the properties it passes, and whether the norm sits between MatMul fences."""

    config: Mapping[str, str]
    fenced: bool
    requested: str  # what results record as the precision asked for


PINNED = Policy({HINT: "f32"}, fenced=False, requested="f32")
DEFAULT = Policy({}, fenced=True, requested="default")


@dataclass(frozen=True)
class Compiled:
    """A compiled model, its contract outputs (-> graph output names), and what its results record."""

    model: Any  # ov.CompiledModel
    outputs: Mapping[str, str]
    info: Mapping[str, str | int | float | bool]


def _tensor(array: np.ndarray) -> ov.Tensor:
    """An ov.Tensor over ``array``'s memory (the caller keeps it alive); bfloat16 as its uint16 bits,
    because OpenVINO's Python binding has no NumPy type for it."""
    if array.dtype == _BF16:
        return ov.Tensor(array.view(np.uint16), array.shape, ov.Type.bf16)
    return ov.Tensor(array, shared_memory=True)


def _host(tensor: ov.Tensor) -> np.ndarray:
    """A copy of an output tensor; bf16 comes back through its bits (the binding shows it as float16)."""
    data = np.asarray(tensor.data)
    if tensor.element_type == ov.Type.bf16:
        return np.array(data.view(np.uint16).view(_BF16), copy=True)
    return np.array(data, copy=True)


class OpenVINOPrepared:
    """A compiled model with the case's inputs set on one InferRequest; a call is one synchronous infer."""

    def __init__(self, compiled: Compiled, feeds: Mapping[str, np.ndarray], cached: bool) -> None:
        self._outputs = compiled.outputs
        # compile_s is what this prepare() spent compiling: 0 when the signature's model was cached.
        compile_s = 0.0 if cached else compiled.info["compile_s"]
        self._info: Info = {**compiled.info, "cached": cached, "compile_s": compile_s}
        self._request = compiled.model.create_infer_request()
        # Copies, held for the request's lifetime: the tensors alias them, and the caller's arrays must
        # stay untouched (inputs_unchanged).
        self._feeds = {name: np.array(value, copy=True, order="C") for name, value in feeds.items()}
        for name, value in self._feeds.items():
            self._request.set_tensor(name, _tensor(value))
        self._ran = False

    def __call__(self) -> None:
        # Inputs are set once in prepare(); share_outputs leaves the results in the request's own tensors
        # (no copy in the timed region). Nothing is updated in place: every call starts from the inputs.
        self._request.infer(share_outputs=True)
        self._ran = True

    def synchronize(self) -> None:
        # infer() is synchronous on the CPU device.
        pass

    def outputs(self) -> Outputs:
        if not self._ran:
            raise RuntimeError("outputs() was asked for before the first call of the prepared case")
        return {name: _host(self._request.get_tensor(graph)) for name, graph in self._outputs.items()}

    def info(self) -> Info:
        return dict(self._info)

    def buffers(self) -> dict[str, np.ndarray]:
        """The memory the request reads (the feeds' copies, by contract name) and, once it has run, the
        output tensors it wrote (share_outputs: the request's own): the aliasing check's evidence."""
        found = dict(self._feeds)
        if self._ran:
            found |= {
                name: np.asarray(self._request.get_tensor(graph).data)
                for name, graph in self._outputs.items()
            }
        return found


def _read(core: ov.Core, model: onnx.ModelProto, what: str) -> ov.Model:
    """The ONNX frontend's model; a graph it cannot convert is Unsupported with the frontend's summary."""
    try:
        return core.read_model(model.SerializeToString(), b"")
    except RuntimeError as error:
        if "FrontEnd API failed" not in str(error):
            raise
        raise Unsupported(
            f"OpenVINO {ov.__version__} ONNX frontend cannot read {what}: {_frontend_summary(str(error))}"
        ) from error


def _frontend_summary(text: str) -> str:
    """Each failed op with the last line of its message, or the summary's lines (ops without a rule)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    failed: dict[str, str] = {}
    op = ""
    for line in lines:
        if line == "Summary:":
            break
        if line.startswith("-- ") and line.endswith(" with a message:"):
            op = line[3 : -len(" with a message:")]
        elif op:
            failed[op] = line
    if failed:
        return "; ".join(f"{op}: {message}" for op, message in failed.items())
    return " ".join(line[3:] for line in lines if line.startswith("-- ")) or text


class OpenVINO:
    """The suite's ONNX graphs on OpenVINO's CPU plugin, inference precision pinned to f32; forward only."""

    name = "openvino"
    policy = PINNED
    # The builder asks its backend for ONNX's momentum attribute; OpenVINO's ONNX frontend follows ONNX
    # (running = momentum * running + (1 - momentum) * batch), so the translation is onnx_graphs' own,
    # read from the onnxruntime adapter (no session of it is made).
    conventions_type: type[graphs.OnnxRuntime] = graphs.OnnxRuntime

    def __init__(self) -> None:
        self._core = ov.Core()
        self._cache = _ort.Cache()
        self.conventions = self.conventions_type()

    def capabilities(self) -> Capabilities:
        core = self._core
        return Capabilities(
            ops=frozenset(graphs.OPSETS),
            dtypes=frozenset(DTYPES),
            # ONNX tensors have no memory format: a channels_last case would run the contiguous graph.
            features=frozenset(FEATURES) - {"backward", "channels_last"},
            device="cpu",
            device_name=str(core.get_property(DEVICE, "FULL_DEVICE_NAME")),
            notes={
                "openvino": ov.get_version(),
                "onnx": onnx.__version__,
                "graphs": "backends/onnx/graphs.py, opsets "
                + ", ".join(f"{op} {v}" for op, v in graphs.OPSETS.items()),
                "inference_precision": self._precision_note(),
                "optimization_capabilities": " ".join(core.get_property(DEVICE, "OPTIMIZATION_CAPABILITIES")),
                "backward": "not declared: OpenVINO compiles inference graphs and has no autograd",
                "float64": "declared and run as OpenVINO runs it: the CPU plugin has no f64 kernels and"
                " converts f64 graphs to f32 at compile time (results record norm_precision f32); the ledger"
                " records what it costs",
                "compile": "core.read_model + core.compile_model in prepare(), one per signature (info:"
                " compile_s, 0 when cached); __call__ is one InferRequest.infer",
                "bfloat16": "bfloat16 graphs run in f32 where the hint is f32; outputs are rounded to"
                " bfloat16 by the plugin's Convert, which truncates when the kept last bit is even (ledger)",
                GROUP_NORM: "GroupNormalization-21 (or -18, NORMCONF_ORT_GROUP_NORM_OPSET), read as the"
                " plugin's MVN plus a per-channel Eltwise; (N, C) input is Unsupported (the CPU plugin has no"
                " GroupNormalization below rank 3)",
                INSTANCE_NORM: "onnx_graphs' graphs: InstanceNormalization, BatchNormalization for eval"
                " with running statistics, the training update composed of ReduceMean/ReduceSum",
                "channels_last": "not declared: ONNX tensors have no memory format",
                BATCH_NORM: "eps is held in x's dtype (float16(1e-12) = 0) and momentum in the parameters'"
                " dtype; parameters wider than x are Unsupported (the frontend's BatchNormInference binds"
                " their types)",
            },
        )

    def _precision_note(self) -> str:
        return "INFERENCE_PRECISION_HINT pinned to f32 at compile time (the compiled model reads it back)"

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        return self._prepare(case, inputs, default_eps=False)

    def prepare_default_eps(self, case: Case, inputs: Inputs) -> Prepared:
        """The fingerprint's hook: the graph without epsilon attributes, so ONNX's default (1e-5) applies."""
        return self._prepare(case, inputs, default_eps=True)

    def _prepare(self, case: Case, inputs: Inputs, *, default_eps: bool) -> OpenVINOPrepared:
        chosen = graphs.plan(case, inputs, self.conventions)
        # What the graph depends on; leading dimensions and parameter values are run-time inputs.
        key: tuple[object, ...] = (case.op, case.dtype, case.weight_dtype, chosen)
        key += (tuple(graphs.x_shape(case)), case.norm_ndim, case.bias, case.eps)
        key += (case.training, case.momentum, case.num_groups, case.track_running_stats, default_eps)
        key += (case.residual_dtype, case.norm_input)
        built, hit = self._cache.get(key, lambda: self._compile(case, chosen, default_eps))
        assert isinstance(built, Compiled), "the cache holds Compiled entries"
        return OpenVINOPrepared(built, graphs.feeds(case, inputs, chosen), hit)

    def _compile(self, case: Case, chosen: graphs.Plan, default_eps: bool) -> Compiled:
        spec = graphs.build(case, chosen, self.conventions)
        if default_eps:
            edits.drop_eps(spec)
        if self.policy.fenced:
            edits.fence(spec)
        model = spec.model()
        checked = graphs.check(spec, model)
        what = f"{edits.ops(spec)} (opset {chosen.opset}) with x {case.dtype}, parameters {chosen.compute}"
        start = time.perf_counter()  # reading and compiling: the work prepare() does once per signature
        compiled = self._compile_model(_read(self._core, model, what), what)
        seconds = time.perf_counter() - start
        nodes = precision.runtime_nodes(compiled)
        info: Info = {
            "openvino": ov.__version__,
            "device": DEVICE,
            "opset": chosen.opset,
            "graph": edits.ops(spec),
            "compile_s": round(seconds, 4),
            "requested_precision": self.policy.requested,
            **precision.decision(nodes, precision.short(compiled.get_property(HINT))),
            "norm_lowered": precision.lowered(nodes, case.dtype),
            "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
        }
        info |= {k: v for k, v in graphs.graph_info(spec, self.conventions).items() if k != "ort_kernel"}
        info |= checked
        if default_eps:
            info["eps"] = "ONNX default (attribute omitted)"
        return Compiled(compiled, dict(spec.outputs), info)

    def _compile_model(self, model: ov.Model, what: str) -> Any:
        """The compiled model; an op the CPU plugin has no implementation for is Unsupported, naming it
        (GroupNormalization on (N, C) input: the plugin runs it for rank 3 and up only)."""
        try:
            return self._core.compile_model(model, DEVICE, dict(self.policy.config))
        except RuntimeError as error:
            unsupported = [
                line.strip() for line in str(error).splitlines() if "Unsupported operation" in line
            ]
            if not unsupported:
                raise
            raise Unsupported(
                f"OpenVINO {ov.__version__} {DEVICE} plugin cannot compile {what}: {unsupported[0]}"
            ) from error


class OpenVINODefault(OpenVINO):
    """The same graphs, the runtime's default precision policy, the norm between MatMul fences."""

    name = "openvino-default"
    policy = DEFAULT

    def _precision_note(self) -> str:
        hint = precision.short(self._core.get_property(DEVICE, HINT))
        return (
            f"no hint passed: the CPU plugin's default, {hint} on this CPU (bf16 where it has AVX512-BF16 or"
            " AMX, f16 on ARM); the norm is built between two exact MatMul nodes ([[1]] on a column view), as"
            " in a model, because the plugin keeps a graph's tail (everything between the outputs and the"
            " last MatMul/FullyConnected/Convolution) in f32; results record norm_precision and norm_nodes"
        )
