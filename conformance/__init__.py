"""normconf's core: cases, inputs, oracle, tolerances, comparison, registry, results and the pytest plugin.

Importing this package is cheap: it never imports torch, triton, onnx or any backend.
"""

from conformance.backend import (
    Backend,
    BackendUnavailable,
    Capabilities,
    Inputs,
    Outputs,
    Prepared,
    Unsupported,
)
from conformance.case import Case, CaseError
from conformance.registry import register
from conformance.results import SCHEMA_VERSION

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
