"""Which outputs a case produces, and each output's dtype and shape.

Part of the case model: the checks, the failure shrinker, the fingerprint and the properties all ask
the same questions of a case, so the answers live here, below all of them.
"""

from __future__ import annotations

from conformance.model.case import Case

# Outputs with the activation's dtype and shape; every other output has the parameters' (weight_dtype).
ACTIVATION_OUTPUTS: frozenset[str] = frozenset({"y", "dx", "residual_out"})


def forward_outputs(case: Case) -> tuple[str, ...]:
    return ("y", "residual_out") if case.op == "add_rms_norm" else ("y",)


def training_outputs(case: Case) -> tuple[str, ...]:
    return ("running_mean", "running_var") if case.training else ()


def grad_outputs(case: Case) -> tuple[str, ...]:
    names = ["dx"]
    if case.weight:
        names.append("dweight")
    if case.bias:
        names.append("dbias")
    return tuple(names)


def output_dtype(case: Case, output: str) -> str:
    return case.dtype if output in ACTIVATION_OUTPUTS else case.weight_dtype


def output_shape(case: Case, output: str) -> tuple[int, ...]:
    return case.shape if output in ACTIVATION_OUTPUTS else case.param_shape


def produced(case: Case, grad: bool) -> tuple[str, ...]:
    """Every output a prepared call must return."""
    return forward_outputs(case) + training_outputs(case) + (grad_outputs(case) if grad else ())
