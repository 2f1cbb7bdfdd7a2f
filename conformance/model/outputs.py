"""Which outputs a case produces, and each output's dtype and shape.

Part of the case model: the checks, the failure shrinker, the fingerprint and the properties all ask
the same questions of a case, so the answers live here, below all of them.
"""

from __future__ import annotations

from conformance.model.case import ADD_OPS, Case

# Outputs with the activation's shape; every other output has the parameters' (weight_dtype).
ACTIVATION_OUTPUTS: frozenset[str] = frozenset({"y", "dx", "residual_out", "dresidual"})
# The residual stream of the add ops and its gradient: the stream's dtype (Case.stream_dtype).
STREAM_OUTPUTS: frozenset[str] = frozenset({"residual_out", "dresidual"})


def forward_outputs(case: Case) -> tuple[str, ...]:
    return ("y", "residual_out") if case.op in ADD_OPS else ("y",)


def training_outputs(case: Case) -> tuple[str, ...]:
    return ("running_mean", "running_var") if case.training else ()


def grad_outputs(case: Case) -> tuple[str, ...]:
    # The add ops' dx and dresidual are both dL/dh: d norm(h) / dh . dy plus the cotangent of residual_out.
    names = ["dx", "dresidual"] if case.op in ADD_OPS else ["dx"]
    if case.weight:
        names.append("dweight")
    if case.bias:
        names.append("dbias")
    return tuple(names)


def output_dtype(case: Case, output: str) -> str:
    if output in STREAM_OUTPUTS:
        return case.stream_dtype
    return case.dtype if output in ACTIVATION_OUTPUTS else case.weight_dtype


def output_shape(case: Case, output: str) -> tuple[int, ...]:
    return case.shape if output in ACTIVATION_OUTPUTS else case.param_shape


def produced(case: Case, grad: bool) -> tuple[str, ...]:
    """Every output a prepared call must return."""
    return forward_outputs(case) + training_outputs(case) + (grad_outputs(case) if grad else ())
