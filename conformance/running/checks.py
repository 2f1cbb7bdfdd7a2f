"""The checks run per backend x case, declared in one table: forward, backward, training,
inputs_unchanged, aliasing, determinism.

Each check turns one backend run into one Result; the pytest plugin only maps Results to test
outcomes (conformance.running.outcomes). Skips come from capabilities; ``Unsupported`` only from
``prepare()``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conformance import oracle
from conformance.adapter import memory
from conformance.adapter.backend import Backend, Capabilities, Outputs, Unsupported
from conformance.adapter.execute import AdapterError, CallTimeout, Execution, run_backend
from conformance.failures import bundle, shrink
from conformance.fingerprint import sums
from conformance.judging import messages, platform
from conformance.judging.ledger import Ledger
from conformance.judging.tolerances import ToleranceTable
from conformance.judging.verdict import Evidence, Verdict, compare_outputs, judge
from conformance.model.case import Case
from conformance.model.inputs import for_call, make_inputs
from conformance.model.outputs import forward_outputs, grad_outputs, output_shape, produced, training_outputs
from conformance.results import stored
from conformance.results.result import Result


@dataclass
class Phases:
    """Seconds one check spent per phase, added up as it runs: the figures ``normconf profile`` sums.

    ``compile_s`` is the part of ``prepare_s`` the adapter reports as compiling or exporting (its
    info's ``compile_s``: 0 when its graph came from a cache); a run that raised (Unsupported from
    prepare(), an adapter error) counts whole as prepare; judging is what the check's duration leaves
    after the others (comparison, ledger, messages, the results record).
    """

    prepare_s: float = 0.0
    compile_s: float = 0.0
    call_s: float = 0.0
    oracle_s: float = 0.0

    def ran(self, execution: Execution) -> None:
        self.prepare_s += execution.prepare_s
        self.call_s += execution.call_s
        compiled = execution.info.get("compile_s", 0.0)
        self.compile_s += float(compiled) if isinstance(compiled, int | float) else 0.0

    def to_dict(self, duration_s: float) -> dict[str, float]:
        spent = (self.prepare_s, self.call_s, self.oracle_s)
        return {
            "prepare_s": round(self.prepare_s - min(self.compile_s, self.prepare_s), 6),
            "compile_s": round(min(self.compile_s, self.prepare_s), 6),
            "call_s": round(self.call_s, 6),
            "oracle_s": round(self.oracle_s, 6),
            "judge_s": round(max(duration_s - sum(spent), 0.0), 6),
        }


@dataclass(frozen=True)
class CheckContext:
    """What a check needs besides the backend and the case."""

    tolerances: ToleranceTable
    ledger: Ledger
    timeout: float
    reproduce: str = ""
    save_failures: Path | None = None  # --save-failures: write a replayable bundle per failure
    phases: Phases = field(default_factory=Phases)  # filled in by the check that runs


@functools.lru_cache(maxsize=4)
def materials(case: Case) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs with dy, every oracle output) for a case; cached so checks of one case share them."""
    inputs = make_inputs(case, grad=True)
    return inputs, oracle.evaluate(case, inputs, grad=True)


def _materials(case: Case, ctx: CheckContext) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """materials(case), its time counted as the oracle's (the first check of a case pays for it)."""
    start = time.perf_counter()
    found = materials(case)
    ctx.phases.oracle_s += time.perf_counter() - start
    return found


def _execute(
    backend: Backend, case: Case, ctx: CheckContext, grad: bool, calls: int = 1, watch: bool = False
) -> Execution:
    inputs, _ = _materials(case, ctx)
    given = for_call(inputs, grad=grad)
    shapes = {name: output_shape(case, name) for name in produced(case, grad)}
    start = time.perf_counter()
    try:
        execution = run_backend(
            backend,
            case,
            given,
            grad=grad,
            calls=calls,
            expected_shapes=shapes,
            timeout=ctx.timeout,
            watch=watch,
        )
    except (Unsupported, AdapterError):
        # Unsupported comes from prepare() (an export the exporter refused, a session without a kernel):
        # a run that raised counts whole as prepare.
        ctx.phases.prepare_s += time.perf_counter() - start
        raise
    ctx.phases.ran(execution)
    return execution


@dataclass(frozen=True)
class _Shared:
    """The execution a case's checks share: one per backend, case and grad, made by the first check
    that needs it (kept by the checks' order: a backend's checks of one case run consecutively).

    Where determinism runs with that grad (the backend's backward capability decides), it makes two
    calls and watches the buffers, so backward, inputs_unchanged, aliasing and determinism read one
    prepare and two calls instead of five calls; forward and training read one call. The outputs
    each check judges are the same calls' outputs a check of its own would make: the first call's
    for the comparisons, both for determinism.
    """

    backend: Backend
    key: tuple[object, ...]
    execution: Execution | None
    refused: Unsupported | None = None  # prepare() raised Unsupported: it is asked the same again
    # The checks that read it: a check asking again (another run over the same case) runs afresh.
    used: set[str] = field(default_factory=set)


# The last executions made; two: a case's forward (grad=False) and gradient (grad=True) runs.
_SHARED: list[_Shared] = []


def _run(
    check: str,
    backend: Backend,
    case: Case,
    caps: Capabilities,
    ctx: CheckContext,
    grad: bool,
    calls: int = 1,
    watch: bool = False,
) -> Execution:
    """An execution with at least ``calls`` calls (and the buffers watched where asked): the shared
    one where it covers that, else the check's own. A shared run that failed (an adapter error, a
    timeout) is not reused: each check then makes its own run, so a fault in a second call is
    charged to determinism alone, as a check of its own would find it."""
    full = grad == ("backward" in caps.features)
    wanted_calls, wanted_watch = (2, True) if full else (1, False)
    if calls > wanted_calls or (watch and not wanted_watch):
        return _execute(backend, case, ctx, grad, calls=calls, watch=watch)
    key = (backend.name, case, grad, wanted_calls, wanted_watch, ctx.timeout)
    for shared in _SHARED:
        if shared.backend is backend and shared.key == key and check not in shared.used:
            shared.used.add(check)
            if shared.refused is not None:
                raise shared.refused
            if shared.execution is None:
                return _execute(backend, case, ctx, grad, calls=calls, watch=watch)
            return shared.execution
    try:
        execution = _execute(backend, case, ctx, grad, calls=wanted_calls, watch=wanted_watch)
    except Unsupported as exc:
        _remember(_Shared(backend, key, None, exc, {check}))
        raise
    except AdapterError:
        _remember(_Shared(backend, key, None, None, {check}))
        return _execute(backend, case, ctx, grad, calls=calls, watch=watch)
    _remember(_Shared(backend, key, execution, None, {check}))
    return execution


def _remember(shared: _Shared) -> None:
    _SHARED.append(shared)
    del _SHARED[:-2]


def _compared(
    spec: CheckSpec, backend: Backend, case: Case, caps: Capabilities, ctx: CheckContext
) -> Verdict:
    """Compare the spec's outputs with the oracle's, then apply the ledger."""
    execution = _run(spec.name, backend, case, caps, ctx, spec.grad)
    inputs, expected = _materials(case, ctx)
    actual = execution.outputs[0]
    comparisons = compare_outputs(case, inputs, expected, actual, spec.outputs(case), ctx.tolerances)
    evidence = Evidence(inputs, expected, actual, ctx.tolerances)
    where = platform.here(caps.device)
    verdict = judge(
        backend.name, case, spec.name, comparisons, ctx.ledger, ctx.reproduce, execution.info, where, evidence
    )
    # Which sum an add op normalized, said once per case: by its forward result.
    read = sums.sum_read(case, inputs, actual["y"]) if spec.name == "forward" else {}
    info = {**execution.info, **read}
    verdict = dataclasses.replace(verdict, warnings=execution.warnings, info=info)
    if verdict.outcome in ("failed", "xfailed"):
        # What re-judging (normconf judge) compares again under later tolerances and ledgers.
        stored_outputs = stored.encode(actual, spec.outputs(case))
        verdict = dataclasses.replace(verdict, outputs=stored_outputs or "")
    if ctx.save_failures is not None and verdict.outcome in ("failed", "xfailed"):
        verdict = _saved(backend, case, spec.name, spec.grad, ctx, actual, verdict)
    return verdict


def _saved(
    backend: Backend, case: Case, check: str, grad: bool, ctx: CheckContext, actual: Outputs, verdict: Verdict
) -> Verdict:
    """Shrink the failure, write its bundle, and say where it is and how to replay it."""
    assert ctx.save_failures is not None
    inputs, expected = _materials(case, ctx)
    given = for_call(inputs, grad=grad)
    first = shrink.Attempt(case, dict(given), actual, expected, verdict.comparisons)
    names = tuple(c.output for c in verdict.comparisons)
    attempt = shrink.runner(backend, names, grad, ctx.tolerances, ctx.timeout)
    try:
        path = shrink.save(
            ctx.save_failures,
            backend.name,
            check,
            verdict.outcome,
            verdict.reason,
            first,
            attempt,
            grad=grad,
            tolerances=ctx.tolerances,
        )
    except OSError as exc:
        return dataclasses.replace(verdict, reason=f"{verdict.reason}\n  bundle: not saved: {exc}")
    where = f"\n  bundle: {path}\n  replay: {bundle.replay_command(path, backend.name)}"
    return dataclasses.replace(verdict, reason=verdict.reason + where, bundle=str(path))


def _bitwise(spec: CheckSpec, backend: Backend, case: Case, caps: Capabilities, ctx: CheckContext) -> Verdict:
    """Compare bits: the inputs before and after one call, or the outputs of ``spec.calls`` (two) calls."""
    execution = _run(spec.name, backend, case, caps, ctx, "backward" in caps.features, calls=spec.calls)
    if spec.calls == 1:
        pristine, _ = _materials(case, ctx)
        # An input an output declares as its buffer is written by design; the aliasing check judges it.
        written = set(caps.aliases.values())
        pairs = [
            (name, pristine[name], after) for name, after in execution.inputs.items() if name not in written
        ]
        what = "by the call" if len(execution.outputs) == 1 else f"by {len(execution.outputs)} calls"
        changed = [messages.bits_changed(name, before, after, what) for name, before, after in pairs]
    else:
        first, second = execution.outputs
        changed = [
            messages.bits_changed(name, first[name], second[name], what="between two calls") for name in first
        ]
    problems = [text for text in changed if text]
    if not problems:
        return Verdict("passed", warnings=execution.warnings, info=execution.info)
    text = messages.header(backend.name, case, spec.name) + "\n".join(problems)
    reason = f"{text}\nreproduce: {ctx.reproduce}"
    return Verdict("failed", reason, warnings=execution.warnings, info=execution.info)


def _aliasing(
    spec: CheckSpec, backend: Backend, case: Case, caps: Capabilities, ctx: CheckContext
) -> Verdict:
    """No output shares memory with an input or another output, and no input is written, unless the
    backend declares it (Capabilities.aliases); a declared in-place input must hold its output."""
    grad = "backward" in caps.features
    execution = _run(spec.name, backend, case, caps, ctx, grad, watch=True)
    watch = execution.watch
    assert watch is not None, "run_backend(watch=True) records the buffers"
    found = memory.problems(watch, caps.aliases, execution.inputs, execution.outputs[0])
    evidence = "buffers()" if watch.reported else "the NumPy inputs and the arrays outputs() returned"
    info = {**execution.info, "memory_evidence": evidence}
    if not found:
        return Verdict("passed", warnings=execution.warnings, info=info)
    text = messages.header(backend.name, case, spec.name) + "\n".join(found)
    text += f"\n  memory seen through {evidence}"
    return Verdict("failed", f"{text}\nreproduce: {ctx.reproduce}", warnings=execution.warnings, info=info)


Check = Callable[["CheckSpec", Backend, Case, Capabilities, CheckContext], Verdict]


def _always(case: Case) -> bool:
    return True


def _training_case(case: Case) -> bool:
    return case.training


def _nothing(case: Case) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class CheckSpec:
    """One check: its name, how it runs, the outputs it compares with the oracle (none for the bitwise
    checks), which cases it applies to, whether it needs the backward capability, how many calls it
    makes. A check that does not apply to a case is not generated (unlike unsupported, which is
    reported)."""

    name: str
    run: Check
    outputs: Callable[[Case], tuple[str, ...]] = _nothing
    applies: Callable[[Case], bool] = _always
    grad: bool = False
    calls: int = 1


# The checks, in the order they run and are reported.
CHECKS: dict[str, CheckSpec] = {
    spec.name: spec
    for spec in (
        CheckSpec("forward", _compared, forward_outputs),
        CheckSpec("backward", _compared, grad_outputs, grad=True),
        CheckSpec("training", _compared, training_outputs, applies=_training_case),
        CheckSpec("inputs_unchanged", _bitwise),
        CheckSpec("aliasing", _aliasing),
        CheckSpec("determinism", _bitwise, calls=2),
    )
}
CHECK_NAMES: tuple[str, ...] = tuple(CHECKS)


def prepared_grad(check: str, caps: Capabilities) -> bool:
    """Whether ``check`` prepares its case with gradients: a comparison as its spec says; the bitwise
    checks and aliasing wherever the backend has a backward (they share the backward's execution)."""
    spec = CHECKS[check]
    return spec.grad if spec.run is _compared else "backward" in caps.features


def run_check(check: str, backend: Backend, caps: Capabilities, case: Case, ctx: CheckContext) -> Result:
    """Run one check and always return a Result; adapter faults become ``error`` results."""
    start = time.perf_counter()
    spec = CHECKS[check]
    why = caps.why_not(case, grad=spec.grad)
    ctx = dataclasses.replace(ctx, phases=Phases())
    verdict = Verdict("unsupported", why) if why is not None else _guarded(spec, backend, case, caps, ctx)
    duration = time.perf_counter() - start
    extra = _extra(verdict)
    if why is None:
        extra["phases"] = ctx.phases.to_dict(duration)
    return Result(
        backend=backend.name,
        case=case.to_dict(),
        check=check,
        outcome=verdict.outcome,
        reason=verdict.reason,
        comparisons=tuple(
            dataclasses.replace(c, ledger=verdict.ledger.get(c.output)) for c in verdict.comparisons
        ),
        duration_s=duration,
        reproduce=ctx.reproduce,
        extra=extra,
    )


def _extra(verdict: Verdict) -> dict[str, object]:
    extra: dict[str, object] = {}
    if verdict.warnings:
        extra["warnings"] = list(verdict.warnings)
    if verdict.info:
        extra["info"] = dict(verdict.info)
    if verdict.bundle:
        extra["bundle"] = verdict.bundle
    if verdict.hung:
        extra["hung"] = verdict.hung
    if verdict.outputs:
        extra["outputs"] = verdict.outputs
    return extra


def _guarded(spec: CheckSpec, backend: Backend, case: Case, caps: Capabilities, ctx: CheckContext) -> Verdict:
    try:
        return spec.run(spec, backend, case, caps, ctx)
    except Unsupported as exc:
        return Verdict("unsupported", f"prepare() raised Unsupported: {exc}")
    except AdapterError as exc:
        reason = f"{backend.name} {case.id}: {exc}\nreproduce: {ctx.reproduce}"
        return Verdict("error", reason, hung=str(exc) if isinstance(exc, CallTimeout) else "")
