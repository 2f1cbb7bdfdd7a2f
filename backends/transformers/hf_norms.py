"""hf-*: the norm classes Hugging Face transformers model families ship, one backend per family.

Each class is built directly (no config, no weights downloaded) with the case's eps and its weight, and
run through torch autograd like torch.nn modules. The families differ where kernel authors match
against them: the dtype of the statistics, whether the normalized value is cast to the activation dtype
before or after the weight multiplies it, and Gemma's and Nemotron's ``1 + w``:

- hf-llama   LlamaRMSNorm: float32 statistics, ``w * xhat.to(input dtype)`` (cast, then weight)
- hf-gemma   GemmaRMSNorm: float32 statistics, ``(xhat * (1 + w.float())).type_as(x)`` (weight, then cast)
- hf-t5      T5LayerNorm: float32 variance, x itself stays in its dtype; cast to the weight dtype only
             when the weight is float16/bfloat16, then ``w * xhat``
- hf-olmo2   Olmo2RMSNorm: float32 statistics, ``(w * xhat).to(input dtype)`` (weight, then cast)
- hf-cohere  CohereLayerNorm: LayerNorm without bias, statistics and weight in float32, cast at the end
- hf-nemotron NemotronLayerNorm1P: nn.LayerNorm with weight ``w + 1`` added in the parameter dtype

Every class upcasts with ``.to(torch.float32)`` / ``.float()``, so float64 inputs are computed in
float32: that is what these classes do, and the ledger records what it costs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from backends.common import torch_support as common
from conformance.adapter.backend import (
    BackendUnavailable,
    Capabilities,
    Inputs,
    Prepared,
    Unsupported,
)
from conformance.model.case import LAYER_NORM, RMS_NORM, Case
from conformance.model.dtypes import round_to


@dataclass(frozen=True)
class Family:
    """One model family's norm class: where it lives, what it computes, and how the case maps onto it.

    ``offset`` is the weight offset the class applies itself (Gemma's and Nemotron's 1): a case with
    another offset has its weight translated by ``_translated`` (exactly, or Unsupported).
    ``offset_dtype`` is the dtype the class adds the offset in: "float32" (Gemma: ``1 + w.float()``)
    or "param" (Nemotron: ``self.weight + 1.0`` in the weight's own dtype).
    """

    name: str
    module: str
    cls: str
    op: str
    default_eps: float
    offset: float = 0.0
    offset_dtype: str = "param"
    multi_axis: bool = False
    what: str = ""


FAMILIES: tuple[Family, ...] = (
    Family(
        "hf-llama",
        "transformers.models.llama.modeling_llama",
        "LlamaRMSNorm",
        "rms_norm",
        1e-6,
        what="float32 statistics; xhat cast to the input dtype, then multiplied by the weight",
    ),
    Family(
        "hf-gemma",
        "transformers.models.gemma.modeling_gemma",
        "GemmaRMSNorm",
        "rms_norm",
        1e-6,
        offset=1.0,
        offset_dtype="float32",
        what="float32 statistics; xhat * (1 + w) in float32, then cast to the input dtype",
    ),
    Family(
        "hf-t5",
        "transformers.models.t5.modeling_t5",
        "T5LayerNorm",
        "rms_norm",
        1e-6,
        what="float32 variance; x * rstd promotes to float32; cast to the weight dtype when it is half",
    ),
    Family(
        "hf-olmo2",
        "transformers.models.olmo2.modeling_olmo2",
        "Olmo2RMSNorm",
        "rms_norm",
        1e-6,
        what="float32 statistics; weight times the float32 xhat, then cast to the input dtype",
    ),
    Family(
        "hf-cohere",
        "transformers.models.cohere.modeling_cohere",
        "CohereLayerNorm",
        "layer_norm",
        1e-5,
        what="LayerNorm without bias; statistics and weight in float32, cast at the end",
    ),
    Family(
        "hf-nemotron",
        "transformers.models.nemotron.modeling_nemotron",
        "NemotronLayerNorm1P",
        "layer_norm",
        1e-5,
        offset=1.0,
        multi_axis=True,
        what="nn.LayerNorm whose weight is w + 1, added in the parameter dtype",
    ),
)
BY_NAME = {family.name: family for family in FAMILIES}


def _class(family: Family) -> type[nn.Module]:
    """The family's norm class, imported on first use (transformers is imported only by hf-* backends)."""
    try:
        import importlib

        module = importlib.import_module(family.module)
    except ImportError as error:
        raise BackendUnavailable(
            f"{family.name} needs transformers ({error}); pip install 'normconf[transformers]'"
        ) from error
    cls: type[nn.Module] = getattr(module, family.cls)
    return cls


def _ops(family: Family) -> frozenset[str]:
    # The fused add op is composed as the torch adapters compose it (_torch_common.Residual), then the
    # family's norm class (RMSNorm, or Cohere's / Nemotron's LayerNorm); its backward runs through both
    # outputs. The residual conventions (features residual_dtype, exact_sum) are not declared: the
    # model families keep the stream in the activation dtype and normalize the stored sum.
    fused = {RMS_NORM: "add_rms_norm", "layer_norm": "add_layer_norm"}
    return frozenset({family.op, fused[family.op]}) if family.op in fused else frozenset({family.op})


def _features(family: Family) -> frozenset[str]:
    features = {"backward", "param_dtype", "no_weight"}
    if family.op == LAYER_NORM:
        features.add("no_bias")
    if family.multi_axis:
        features.add("multi_axis")
    if family.offset:
        # Only a class with an offset of its own holds Gemma's 1 + w exactly (see _translated): without
        # one, the cast-before-weight order of the rest depends on the weight's dtype, so no wider
        # weight can stand in for 1 + w.
        features.add("weight_offset")
    return frozenset(features)


def _add_dtype(family: Family, held: str) -> str:
    """The dtype the class adds its offset in, for a parameter held in ``held``."""
    return "float32" if family.offset_dtype == "float32" else held


def _translated(family: Family, case: Case, weight: np.ndarray) -> tuple[np.ndarray, str]:
    """The parameter ``p`` the class must hold so that its scale ``family.offset + p`` is the case's.

    The case's scale is ``case.weight_offset + w``. Where the offsets differ, ``p`` is that scale minus
    the class's offset, held in the first of (param dtype, float32) for which the class's own
    addition gives back the case's scale rounded to the dtype the class adds in: the translation adds
    no rounding the class would not make anyway. Gemma adds in float32 (``1 + w.float()``), so its
    parameter's dtype matters only through that upcast and a float32 ``p`` changes nothing else.
    Returns (p, how it was translated).
    """
    if case.weight_offset == family.offset:
        return weight, "as given"
    target = case.weight_offset + weight.astype(np.float64)
    # Never wider than float32 for a float32 or half case: a float64 parameter beside float32
    # activations would be a dtype mix the class's torch calls reject, not a translation.
    wider = ("float64",) if case.weight_dtype == "float64" else ("float32",)
    holders = dict.fromkeys((case.weight_dtype, *wider))
    for held in holders:
        p = round_to(target - family.offset, held)
        add_in = _add_dtype(family, held)
        scale = round_to(p.astype(np.float64) + family.offset, add_in).astype(np.float64)
        if np.array_equal(scale, round_to(target, add_in).astype(np.float64)):
            return p, f"p = w + {case.weight_offset - family.offset:g} held in {held}"
    raise Unsupported(
        f"{family.cls} scales by {family.offset:g} + p; no dtype holds p = w + "
        f"{case.weight_offset - family.offset:g} so that the class's own addition gives the case's scale"
    )


def _module(
    family: Family, case: Case, dtype: torch.dtype, dev: torch.device, default_eps: bool
) -> nn.Module:
    cls = _class(family)
    eps = {} if default_eps else {"eps": case.eps}
    if family.cls == "NemotronLayerNorm1P":
        return cls(list(case.param_shape), **eps, bias=bool(case.bias), device=dev, dtype=dtype)
    if family.op == LAYER_NORM and case.bias:
        raise Unsupported(f"{family.cls} has no bias (its bias argument is ignored); bias=True")
    module = cls(case.param_shape[-1], **eps)
    return module.to(device=dev, dtype=dtype)


def _weight(module: nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor), "every family's class has a weight"
    return weight


def _load(module: nn.Module, family: Family, case: Case, tensors: common.Tensors) -> None:
    weight = _weight(module)
    with torch.no_grad():
        if tensors.weight is not None:
            weight.copy_(tensors.weight)
        else:
            # weight=False: the class always has one; a frozen scale of exactly 1 (p = 1 - offset)
            # takes no gradient and multiplies exactly.
            weight.fill_(1.0 - family.offset).requires_grad_(False)
        bias = getattr(module, "bias", None)
        if bias is not None and tensors.bias is not None:
            bias.copy_(tensors.bias)


def _build(family: Family, default_eps: bool) -> common.Build:
    def build(case: Case, tensors: common.Tensors) -> common.TorchPrepared:
        dtype = tensors.weight.dtype if tensors.weight is not None else common.torch_dtype(case.weight_dtype)
        module = _module(family, case, dtype, tensors.x.device, default_eps)
        _load(module, family, case, tensors)
        bias = getattr(module, "bias", None)

        def forward() -> torch.Tensor:
            y: torch.Tensor = module(tensors.input())
            return y

        # y keeps the dtype the class returns (LlamaRMSNorm: the weight's, float32 beside half activations):
        # the hf-* backends show the class; no stream or sum convention of theirs widens it.
        return common.library_prepared(
            case, tensors, forward, _weight(module), bias, module=module, cast_y=False
        )

    return build


class HFNorm:
    """One transformers model family's norm class, on CUDA when available, else on the CPU.

    A subclass names its family in ``family_name`` (the entry points name those subclasses); a
    subclass may also set its own ``name`` (the meta-tests' broken variants do).
    """

    family_name: ClassVar[str] = ""

    def __init__(self, family: Family | None = None) -> None:
        self.family = family or BY_NAME[self.family_name]
        self.name: str = getattr(type(self), "name", self.family.name)

    def capabilities(self) -> Capabilities:
        cls = _class(self.family)
        import transformers

        caps = common.capabilities(
            _features(self.family),
            {
                "transformers": transformers.__version__,
                "class": f"{cls.__module__}.{cls.__qualname__}",
                "computes": self.family.what,
                "float64": "the class upcasts with .float(): float64 inputs are computed in float32",
            },
        )
        return replace(caps, ops=_ops(self.family))

    def translate(self, case: Case, weight: np.ndarray) -> tuple[np.ndarray, str]:
        """The class's parameter for the case's weight, and how it was translated (see _translated)."""
        return _translated(self.family, case, weight)

    def _prepare(self, case: Case, inputs: Inputs, *, grad: bool, default_eps: bool) -> Prepared:
        weight, how = None, "as given"
        if "weight" in inputs:
            weight, how = self.translate(case, inputs["weight"])
        tensors = common.to_device(case, inputs, grad=grad, weight=weight)
        build = _build(self.family, default_eps)
        common.probe(build, case, tensors)
        prepared = build(case, tensors)
        prepared.described.update({"class": self.family.cls, "weight": how})
        return prepared

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        return self._prepare(case, inputs, grad=grad, default_eps=False)

    def prepare_default_eps(self, case: Case, inputs: Inputs) -> Prepared:
        """The fingerprint's hook: the class built without eps (the family's own default)."""
        return self._prepare(case, inputs, grad=False, default_eps=True)

    def copy_kernel(self, nbytes: int) -> Prepared:
        return common.copy_kernel(nbytes)


# The entry points name these classes: one zero-argument backend per family.
class HFLlama(HFNorm):
    family_name = "hf-llama"


class HFGemma(HFNorm):
    family_name = "hf-gemma"


class HFT5(HFNorm):
    family_name = "hf-t5"


class HFOlmo2(HFNorm):
    family_name = "hf-olmo2"


class HFCohere(HFNorm):
    family_name = "hf-cohere"


class HFNemotron(HFNorm):
    family_name = "hf-nemotron"
