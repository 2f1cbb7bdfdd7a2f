"""A deliberately broken ONNX adapter for the meta-tests, run by the real onnxruntime.

Loaded into a conformance run with ``-p normconf_onnx_fakes`` (tests/ on PYTHONPATH). It builds the
same real ONNX graphs as the onnxruntime adapter but passes PyTorch's momentum straight through as
ONNX's momentum attribute, the convention backwards: the training check must catch it.
"""

from __future__ import annotations

import conformance
from backends.onnx_graphs import OnnxRuntime
from conformance.model.case import Case


@conformance.register("fake-onnx-momentum")
class MomentumStraightThrough(OnnxRuntime):
    """ONNX's momentum weights the old running value; this fake gives it PyTorch's m instead of 1 - m."""

    name = "fake-onnx-momentum"

    def onnx_momentum(self, case: Case) -> float:
        return 1.0 if case.momentum is None else case.momentum
