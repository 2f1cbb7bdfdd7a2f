"""Deliberately broken OpenVINO adapters for the meta-tests, run by the real OpenVINO CPU runtime.

Loaded into a conformance run with ``-p fakes.openvino`` (tests/ on PYTHONPATH). Both build the
same real ONNX graphs as the openvino adapter and get one translation wrong:

- ``fake-openvino-eps`` leaves the epsilon attribute out of every graph, so ONNX's default 1e-5 applies
  whatever the case asks for (what a hand-written or exported graph without eps computes);
- ``fake-openvino-momentum`` passes PyTorch's momentum straight through as ONNX's momentum attribute,
  which weights the old running value: the convention backwards.
"""

from __future__ import annotations

import conformance
from backends.onnx.graphs import OnnxRuntime
from backends.openvino.runtime import OpenVINO, OpenVINOPrepared
from conformance.adapter.backend import Inputs
from conformance.model.case import Case


@conformance.register("fake-openvino-eps")
class EpsLeftOut(OpenVINO):
    """Every case runs the default-eps graph: ONNX's 1e-5 instead of case.eps."""

    name = "fake-openvino-eps"

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> OpenVINOPrepared:
        return self._prepare(case, inputs, default_eps=True)


class _TorchMomentumAsOnnx(OnnxRuntime):
    """ONNX's momentum keeps ``momentum`` of the old running value; this passes PyTorch's m, not 1 - m."""

    def onnx_momentum(self, case: Case) -> float:
        return 1.0 if case.momentum is None else case.momentum


@conformance.register("fake-openvino-momentum")
class MomentumStraightThrough(OpenVINO):
    """The BatchNormalization graphs built with PyTorch's momentum as the ONNX attribute."""

    name = "fake-openvino-momentum"
    conventions_type = _TorchMomentumAsOnnx
