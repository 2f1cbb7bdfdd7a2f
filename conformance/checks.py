"""The checks run per backend x case: forward, backward, training, inputs_unchanged, determinism.

Each check turns one backend run into one Result; the pytest plugin only maps Results to test
outcomes. Skips come from capabilities; ``Unsupported`` only from ``prepare()``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conformance import messages, oracle
from conformance.backend import Backend, Capabilities, Inputs, Outputs, Unsupported
from conformance.case import Case
from conformance.compare import Comparison, compare
from conformance.conditioning import mean_error
from conformance.execute import AdapterError, Run, run_backend
from conformance.inputs import make_inputs
from conformance.ledger import Ledger
from conformance.results import Result
from conformance.scales import scale, sensitivity
from conformance.tolerances import ToleranceTable

CHECK_NAMES: tuple[str, ...] = ("forward", "backward", "training", "inputs_unchanged", "determinism")


@dataclass(frozen=True)
class Context:
    """What a check needs besides the backend and the case."""

    tolerances: ToleranceTable
    ledger: Ledger
    timeout: float
    reproduce: str = ""
    save_failures: Path | None = None  # --save-failures: write a replayable bundle per failure


@dataclass(frozen=True)
class Verdict:
    outcome: str
    reason: str = ""
    comparisons: tuple[Comparison, ...] = ()
    warnings: tuple[str, ...] = ()
    info: Mapping[str, object] = dataclasses.field(default_factory=dict)
    bundle: str = ""


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
    return case.dtype if output in ("y", "dx", "residual_out") else case.params


def output_shape(case: Case, output: str) -> tuple[int, ...]:
    return case.shape if output in ("y", "dx", "residual_out") else case.param_shape


def produced(case: Case, grad: bool) -> tuple[str, ...]:
    """Every output a prepared call must return."""
    return forward_outputs(case) + training_outputs(case) + (grad_outputs(case) if grad else ())


@functools.lru_cache(maxsize=4)
def materials(case: Case) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs with dy, every oracle output) for a case; cached so checks of one case share them."""
    inputs = make_inputs(case, grad=True)
    return inputs, oracle.evaluate(case, inputs, grad=True)


def _run(backend: Backend, case: Case, ctx: Context, grad: bool, calls: int = 1) -> Run:
    inputs, _ = materials(case)
    given = inputs if grad else {k: v for k, v in inputs.items() if k != "dy"}
    shapes = {name: output_shape(case, name) for name in produced(case, grad)}
    return run_backend(
        backend, case, given, grad=grad, calls=calls, expected_shapes=shapes, timeout=ctx.timeout
    )


def compare_outputs(
    case: Case,
    inputs: Inputs,
    expected: Mapping[str, np.ndarray],
    actual: Outputs,
    names: tuple[str, ...],
    tolerances: ToleranceTable,
) -> tuple[Comparison, ...]:
    """Each named output against the oracle under its tolerance rule (shared with replay and shrinking)."""
    return tuple(
        compare(
            name,
            actual[name],
            expected[name],
            tolerances.lookup(case.op, name, output_dtype(case, name), case.dist),
            output_dtype(case, name),
            scale=scale(case, name, inputs, expected),
            mean_error=mean_error(case, expected),
            sensitivity=sensitivity(case, name, inputs, expected),
        )
        for name in names
    )


def _compared(
    backend: Backend, case: Case, ctx: Context, check: str, names: tuple[str, ...], grad: bool
) -> Verdict:
    run = _run(backend, case, ctx, grad)
    inputs, expected = materials(case)
    comparisons = compare_outputs(case, inputs, expected, run.outputs[0], names, ctx.tolerances)
    verdict = _judge(backend.name, case, check, comparisons, ctx)
    verdict = dataclasses.replace(verdict, warnings=run.warnings, info=run.info)
    if ctx.save_failures is not None and verdict.outcome in ("failed", "xfailed"):
        verdict = _saved(backend, case, check, grad, ctx, run.outputs[0], verdict)
    return verdict


def _saved(
    backend: Backend, case: Case, check: str, grad: bool, ctx: Context, actual: Outputs, verdict: Verdict
) -> Verdict:
    """Shrink the failure, write its bundle, and say where it is and how to replay it."""
    from conformance import bundle, failures  # failures imports this module

    assert ctx.save_failures is not None
    inputs, expected = materials(case)
    given = inputs if grad else {k: v for k, v in inputs.items() if k != "dy"}
    first = failures.Attempt(case, dict(given), actual, expected, verdict.comparisons)
    names = tuple(c.output for c in verdict.comparisons)
    run = failures.runner(backend, names, grad, ctx.tolerances, ctx.timeout)
    try:
        path = failures.save(
            ctx.save_failures,
            backend.name,
            check,
            verdict.outcome,
            verdict.reason,
            first,
            run,
            grad=grad,
            tolerances=ctx.tolerances,
        )
    except OSError as exc:
        return dataclasses.replace(verdict, reason=f"{verdict.reason}\n  bundle: not saved: {exc}")
    where = f"\n  bundle: {path}\n  replay: {bundle.replay_command(path, backend.name)}"
    return dataclasses.replace(verdict, reason=verdict.reason + where, bundle=str(path))


def _judge(
    backend: str, case: Case, check: str, comparisons: tuple[Comparison, ...], ctx: Context
) -> Verdict:
    """Apply the ledger: covered failures inside their band are xfailed; a covered pass is xpassed."""
    failing = [c for c in comparisons if not c.passed]
    stale = [c for c in comparisons if c.passed and ctx.ledger.find(backend, case, check, c.output)]
    if stale:
        entry = ctx.ledger.find(backend, case, check, stale[0].output)
        assert entry is not None
        return Verdict(
            "xpassed", messages.stale(backend, case, check, stale[0], entry, ctx.reproduce), comparisons
        )
    if not failing:
        return Verdict("passed", "", comparisons)
    covered = [(c, ctx.ledger.find(backend, case, check, c.output)) for c in failing]
    if all(entry is not None and c.worst_ratio <= entry.band[1] for c, entry in covered):
        reasons = "; ".join(f"{c.output}: {e.reason} (ledger deviation[{e.index}])" for c, e in covered if e)
        return Verdict("xfailed", reasons, comparisons)
    text = "\n\n".join(
        messages.failure(backend, case, check, c, entry, ctx.reproduce) for c, entry in covered
    )
    return Verdict("failed", text, comparisons)


def _forward(backend: Backend, case: Case, caps: Capabilities, ctx: Context) -> Verdict:
    return _compared(backend, case, ctx, "forward", forward_outputs(case), grad=False)


def _training(backend: Backend, case: Case, caps: Capabilities, ctx: Context) -> Verdict:
    return _compared(backend, case, ctx, "training", training_outputs(case), grad=False)


def _backward(backend: Backend, case: Case, caps: Capabilities, ctx: Context) -> Verdict:
    return _compared(backend, case, ctx, "backward", grad_outputs(case), grad=True)


def _inputs_unchanged(backend: Backend, case: Case, caps: Capabilities, ctx: Context) -> Verdict:
    grad = "backward" in caps.features
    run = _run(backend, case, ctx, grad)
    pristine, _ = materials(case)
    changed = [messages.bits_changed(name, pristine[name], after) for name, after in run.inputs.items()]
    problems = [text for text in changed if text]
    if problems:
        text = messages.header(backend.name, case, "inputs_unchanged") + "\n".join(problems)
        return Verdict("failed", f"{text}\nreproduce: {ctx.reproduce}", warnings=run.warnings, info=run.info)
    return Verdict("passed", warnings=run.warnings, info=run.info)


def _determinism(backend: Backend, case: Case, caps: Capabilities, ctx: Context) -> Verdict:
    grad = "backward" in caps.features
    run = _run(backend, case, ctx, grad, calls=2)
    first, second = run.outputs
    problems = [
        messages.bits_changed(name, first[name], second[name], what="between two calls") for name in first
    ]
    problems = [text for text in problems if text]
    if problems:
        text = messages.header(backend.name, case, "determinism") + "\n".join(problems)
        return Verdict("failed", f"{text}\nreproduce: {ctx.reproduce}", warnings=run.warnings, info=run.info)
    return Verdict("passed", warnings=run.warnings, info=run.info)


Check = Callable[[Backend, Case, Capabilities, Context], Verdict]
CHECKS: dict[str, Check] = {
    "forward": _forward,
    "backward": _backward,
    "training": _training,
    "inputs_unchanged": _inputs_unchanged,
    "determinism": _determinism,
}
# Which cases a check applies to at all (not applicable means not generated, unlike unsupported).
APPLIES: dict[str, Callable[[Case], bool]] = {
    "forward": lambda case: True,
    "backward": lambda case: True,
    "training": lambda case: case.training,
    "inputs_unchanged": lambda case: True,
    "determinism": lambda case: True,
}
NEEDS_GRAD: dict[str, bool] = {"backward": True}


def run_check(check: str, backend: Backend, caps: Capabilities, case: Case, ctx: Context) -> Result:
    """Run one check and always return a Result; adapter faults become ``error`` results."""
    start = time.perf_counter()
    why = caps.why_not(case, grad=NEEDS_GRAD.get(check, False))
    if why is not None:
        verdict = Verdict("unsupported", why)
    else:
        verdict = _guarded(CHECKS[check], backend, case, caps, ctx)
    return Result(
        backend=backend.name,
        case=case.to_dict(),
        check=check,
        outcome=verdict.outcome,
        reason=verdict.reason,
        comparisons=tuple(c.to_dict() for c in verdict.comparisons),
        duration_s=time.perf_counter() - start,
        reproduce=ctx.reproduce,
        extra=_extra(verdict),
    )


def _extra(verdict: Verdict) -> dict[str, object]:
    extra: dict[str, object] = {}
    if verdict.warnings:
        extra["warnings"] = list(verdict.warnings)
    if verdict.info:
        extra["info"] = dict(verdict.info)
    if verdict.bundle:
        extra["bundle"] = verdict.bundle
    return extra


def _guarded(fn: Check, backend: Backend, case: Case, caps: Capabilities, ctx: Context) -> Verdict:
    try:
        return fn(backend, case, caps, ctx)
    except Unsupported as exc:
        return Verdict("unsupported", f"prepare() raised Unsupported: {exc}")
    except AdapterError as exc:
        return Verdict("error", f"{backend.name} {case.id}: {exc}\nreproduce: {ctx.reproduce}")


def expected_outputs(case: Case) -> Mapping[str, np.ndarray]:
    return materials(case)[1]
