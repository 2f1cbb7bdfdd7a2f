"""normconf's core: cases, inputs, oracle, tolerances, comparison, registry, results and the pytest plugin.

Importing this package is cheap: it never imports torch, triton, onnx or any backend.
"""

from conformance.adapter.backend import (
    Backend,
    BackendUnavailable,
    Capabilities,
    Inputs,
    Outputs,
    Prepared,
    Unsupported,
)
from conformance.adapter.registry import register
from conformance.model.case import Case, CaseError
from conformance.results.schema import SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "Backend",
    "BackendUnavailable",
    "Capabilities",
    "Case",
    "CaseError",
    "Inputs",
    "Outputs",
    "Prepared",
    "Unsupported",
    "register",
]
