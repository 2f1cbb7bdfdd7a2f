"""What precision OpenVINO's CPU plugin chose: the compiled model's hint and each runtime node's precision.

``compiled.get_runtime_model()`` is the graph the plugin executes; each node's rt_info names its kernel
(``layerType``: MVN, RMS, Eltwise, Subgraph, FullyConnected, ...) and the precision it runs in
(``runtimePrecision``) and writes (``outputPrecisions``). The adapters record these for the nodes of the
normalization layer, so every result shows the decision the runtime took for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Layer types that carry data without computing on it, or are the MatMul fences around the layer.
_PLUMBING = frozenset(
    {"Input", "Output", "Const", "Reshape", "Reorder", "Convert", "ShapeOf", "StridedSlice"}
)
FENCES = frozenset({"FullyConnected", "MatMul"})
# Runtime precisions of floating-point work; integer nodes (shape arithmetic: i32, i64) are not the layer's.
FLOATS = ("f64", "f32", "bf16", "f16")


@dataclass(frozen=True)
class RuntimeNode:
    """One node of the executed graph, as its rt_info describes it."""

    layer_type: str
    precision: str  # runtimePrecision: what the kernel computes in
    outputs: str  # outputPrecisions: what it writes
    names: str  # originalLayersNames: the model ops fused into it


def runtime_nodes(compiled: Any) -> tuple[RuntimeNode, ...]:
    """The executed graph of an ``ov.CompiledModel``, in its order."""
    nodes = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        field = {key: str(info[key].astype(str)) for key in info}
        nodes.append(
            RuntimeNode(
                field.get("layerType", "?"),
                field.get("runtimePrecision", "?"),
                field.get("outputPrecisions", "?"),
                field.get("originalLayersNames", ""),
            )
        )
    return tuple(nodes)


def layer_nodes(nodes: Iterable[RuntimeNode]) -> tuple[RuntimeNode, ...]:
    """The nodes of the normalization layer: floating-point compute that is neither plumbing nor a fence.

    A Subgraph (a snippets kernel) made only of Convert ops is plumbing too: the plugin fuses the
    conversions of a bf16/f16 graph's inputs into such kernels, whose runtimePrecision is their input's.
    """
    return tuple(
        n
        for n in nodes
        if n.layer_type not in _PLUMBING | FENCES and n.precision in FLOATS and not _conversion(n)
    )


def _conversion(node: RuntimeNode) -> bool:
    names = [name.strip() for name in node.names.split(",") if name.strip()]
    return bool(names) and all(name.startswith("Convert") for name in names)


def short(element_type: Any) -> str:
    """``f32`` for ``<Type: 'float32'>`` (a compiled model's INFERENCE_PRECISION_HINT), as rt_info has it."""
    return str(element_type.get_type_name())


def decision(nodes: tuple[RuntimeNode, ...], hint: str) -> dict[str, str]:
    """What the results record: the hint, the layer's precisions, and those of the fences around it."""
    layer = layer_nodes(nodes)
    fences = [n for n in nodes if n.layer_type in FENCES]
    info = {
        "inference_precision_hint": hint,
        "norm_precision": "+".join(sorted({n.precision for n in layer}, key=FLOATS.index)) or "none",
        "norm_nodes": " ".join(dict.fromkeys(f"{n.layer_type}:{n.precision}->{n.outputs}" for n in layer)),
    }
    if fences:
        info["fence_nodes"] = " ".join(dict.fromkeys(f"{n.layer_type}:{n.precision}" for n in fences))
    return info


def lowered(nodes: tuple[RuntimeNode, ...], dtype: str) -> bool:
    """Whether any node of the layer computes in a narrower float than ``dtype`` (a contract dtype name)."""
    width = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}[dtype]
    bits = {"f64": 64, "f32": 32, "bf16": 16, "f16": 16}
    return any(bits[n.precision] < width for n in layer_nodes(nodes))
