"""Deliberately broken ONNX adapters for the meta-tests, run by the real onnxruntime.

Loaded into a conformance run with ``-p fakes.onnx`` (tests/ on PYTHONPATH). Each builds the
same real ONNX graphs as the onnxruntime adapter and gets one translation wrong:

- ``fake-onnx-momentum`` passes PyTorch's momentum straight through as ONNX's momentum attribute, the
  convention backwards: the training check must catch it;
- ``fake-onnx-stash`` gives GroupNormalization-21 stash_type FLOAT16, so x is rounded to float16 and the
  statistics kept there: the forward check must catch it on float32 cases;
- ``fake-onnx-group-affine`` feeds PyTorch's per-channel weight and bias untranslated to
  GroupNormalization-18, which takes one per group: right only where each group is one channel;
- ``fake-onnx-exact-sum`` normalizes the add ops' unrounded float32 sum for every case: the forward
  check must catch it on the default convention's half offset rows.
"""

from __future__ import annotations

import dataclasses

import onnx

import conformance
from backends.onnx.graphs import OnnxRuntime, Plan, scale_dtype
from conformance.adapter.backend import Inputs, Prepared
from conformance.model.case import ADD_OPS, Case


@conformance.register("fake-onnx-momentum")
class MomentumStraightThrough(OnnxRuntime):
    """ONNX's momentum weights the old running value; this fake gives it PyTorch's m instead of 1 - m."""

    name = "fake-onnx-momentum"

    def onnx_momentum(self, case: Case) -> float:
        return 1.0 if case.momentum is None else case.momentum


@conformance.register("fake-onnx-stash")
class StashLowered(OnnxRuntime):
    """GroupNormalization-21 with its statistics in float16 instead of float32 (PyTorch's precision)."""

    name = "fake-onnx-stash"

    def stash_type(self, compute: str) -> int:
        return onnx.TensorProto.FLOAT16


@conformance.register("fake-onnx-group-affine")
class GroupAffineUntranslated(OnnxRuntime):
    """GroupNormalization-18 given the per-channel weight and bias where it expects one per group."""

    name = "fake-onnx-group-affine"

    def plan(self, case: Case, inputs: Inputs) -> Plan:
        if case.op != "group_norm":
            return super().plan(case, inputs)
        return Plan(scale_dtype(case, inputs), 18, "per_channel")


@conformance.register("fake-onnx-exact-sum")
class ExactSumAlways(OnnxRuntime):
    """The add ops' norm reads the unrounded float32 sum whatever the case's norm_input asks (what ORT's
    fused SkipLayerNormalization kernels do for half inputs)."""

    name = "fake-onnx-exact-sum"

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        if case.op in ADD_OPS:
            case = dataclasses.replace(case, norm_input="exact")
        return super().prepare(case, inputs, grad=grad)
