"""What the ledger checks share: the records a check verifies, their cases and inputs, opening and running
a backend by name, judging outputs with the suite's own comparison and tolerances, the causes more than one
check tests, and the verdict line every check prints.

Every check prints one line per (record, cause), ending in ``-> confirmed`` (the cause reproduces a
deviation the backend really shows), ``-> NOT confirmed`` or ``-> measured`` (figures only, no verdict).
The scripts import this module as ``common``: run as ``python scripts/ledger_checks/X.py`` their own
folder is the first entry of sys.path.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from conformance import oracle
from conformance.adapter import registry
from conformance.adapter.backend import Backend, Unsupported
from conformance.judging import tolerances
from conformance.judging.tolerances import ToleranceTable
from conformance.judging.verdict import compare_outputs
from conformance.model.case import Case
from conformance.model.dtypes import round_to
from conformance.model.geometry import geometry
from conformance.model.inputs import for_call, make_inputs
from conformance.results import records as results_records
from conformance.results.result import Result

Arrays = Mapping[str, np.ndarray]
Ratios = dict[str, float]
FAILING = ("failed", "xfailed")
# The checks that run the backward (their records' outputs include the gradients).
GRAD_CHECKS = ("backward", "determinism", "inputs_unchanged", "aliasing")
# The Keras backend each Keras adapter runs on.
KERAS_BACKENDS = {"keras": "torch", "keras-jax": "jax"}
K = TypeVar("K")
V = TypeVar("V")


# ---------------------------------------------------------------------------------------------- records
def records(
    paths: Iterable[str | Path],
    *,
    outcomes: Collection[str] = FAILING,
    backends: Callable[[str], bool] = lambda name: True,
    checks: Collection[str] | None = None,
    ops: Collection[str] | None = None,
) -> Iterator[Result]:
    """The result records of ``paths`` a check verifies, each (backend, case, check, opset) once: files of
    several shards or runs may repeat a record, and the same case at another opset is another graph."""
    seen: set[tuple[object, ...]] = set()
    for path in paths:
        for record in results_records.read_results(path).results:
            if record.outcome not in outcomes or not backends(record.backend):
                continue
            if (checks is not None and record.check not in checks) or (
                ops is not None and record.op not in ops
            ):
                continue
            key = (*record.key, info(record).get("opset"))
            if key not in seen:
                seen.add(key)
                yield record


def forward_records(
    paths: Iterable[str | Path], names: Collection[str], ops: Collection[str]
) -> Iterator[Result]:
    """The forward records of the backends ``names`` on ``ops`` that failed, xfailed or xpassed: an
    xpassed one shows whether a cause still reproduces what an entry lists."""
    outcomes = (*FAILING, "xpassed")
    return records(
        paths, outcomes=outcomes, backends=lambda name: name in names, checks=("forward",), ops=ops
    )


def info(record: Result) -> Mapping[str, Any]:
    """What the backend reported for the record's run (opset, graph, precision), {} where nothing."""
    found = record.extra.get("info")
    return found if isinstance(found, Mapping) else {}


def case_of(record: Result) -> Case:
    return Case.from_dict(dict(record.case))


def grad_of(record: Result) -> bool:
    return record.check in GRAD_CHECKS


def failing(record: Result) -> tuple[str, ...]:
    """The outputs the record judged beyond tolerance (NaN and inf ratios included)."""
    return tuple(c.output for c in record.comparisons if not c.worst_ratio <= 1)


def compared(record: Result) -> tuple[str, ...]:
    return tuple(c.output for c in record.comparisons)


def inputs_of(case: Case) -> dict[str, np.ndarray]:
    """Every input of the case, the cotangents included: ``run`` gives a backend what its call takes."""
    return make_inputs(case, grad=True)


# --------------------------------------------------------------------------------------------- backends
@functools.cache
def backend(name: str) -> Backend:
    """The registered backend ``name``, opened once per process (its caches of compiled graphs kept)."""
    return registry.entries()[name].load()


def run(chosen: Backend, case: Case, inputs: Arrays, *, grad: bool) -> dict[str, np.ndarray]:
    """One call of the backend on the case: the outputs, after the backend synchronized."""
    prepared = chosen.prepare(case, for_call(inputs, grad=grad), grad=grad)
    prepared()
    prepared.synchronize()
    return dict(prepared.outputs())


def at_opset(name: str, opset: int | None) -> Backend:
    """The ONNX backend ``name`` building its graphs at ``opset`` (the opset a record was measured at)
    through the adapters' own opset methods, rather than through the environment they read by default."""
    from backends.onnx.export import OnnxExport
    from backends.onnx.graphs import OnnxRuntime

    chosen = backend(name)
    if opset is None or not isinstance(chosen, OnnxExport | OnnxRuntime):
        return chosen
    if (name, opset) not in _PINNED:
        # The exports' opset is target_opset(); ORT's graphs differ by opset for GroupNormalization only.
        method = "target_opset" if isinstance(chosen, OnnxExport) else "gn_opset"
        base = type(chosen)
        _PINNED[name, opset] = type(f"{base.__name__}At{opset}", (base,), {method: lambda self: opset})()
    return _PINNED[name, opset]


_PINNED: dict[tuple[str, int], Backend] = {}


@contextmanager
def replaced(table: dict[K, V], changes: Mapping[K, V]) -> Iterator[None]:
    """``table`` (a dict or a module's namespace) with the entries ``changes`` names replaced for the
    duration of the block, restored after it whatever happens."""
    original = {key: table[key] for key in changes}
    table.update(changes)
    try:
        yield
    finally:
        table.update(original)


# ---------------------------------------------------------------------------------------------- judging
@functools.cache
def table() -> ToleranceTable:
    return tolerances.read_tolerances()


def expected(case: Case, inputs: Arrays, **changes: Any) -> dict[str, np.ndarray]:
    """The oracle's outputs (gradients included) of ``case``, with ``changes`` to its fields if given."""
    return oracle.evaluate(dataclasses.replace(case, **changes), inputs, grad="dy" in inputs)


def ratios(case: Case, inputs: Arrays, reference: Arrays, actual: Arrays, names: Iterable[str]) -> Ratios:
    """worst_ratio of each named output of ``actual`` against ``reference`` under the case's tolerances."""
    found = compare_outputs(case, inputs, reference, actual, tuple(names), table())
    return {c.output: round(float(c.worst_ratio), 3) for c in found}


def passes(found: Ratios, names: Iterable[str] | None = None) -> bool:
    return all(found[name] <= 1 for name in (found if names is None else names))


def explains(before: Ratios, after: Ratios, names: Iterable[str] | None = None) -> bool:
    """A cause explains a deviation when an output fails against the oracle (``before``) and every one
    passes against the oracle recomputed with the cause (``after``): a cause of no deviation is none."""
    names = tuple(before if names is None else names)
    return bool(names) and not passes(before, names) and passes(after, names)


# ----------------------------------------------------------------------------------------------- output
@dataclass(frozen=True)
class Finding:
    """One cause tried on one record: ``confirmed`` True, False, or None where only figures are printed."""

    record: Result
    cause: str
    confirmed: bool | None
    detail: str

    def line(self) -> str:
        verdict = {True: "confirmed", False: "NOT confirmed", None: "measured"}[self.confirmed]
        r = self.record
        return f"{r.backend:16s} {r.check:9s} {r.case_id:62s} {self.cause}: {self.detail} -> {verdict}"


def report(findings: Iterable[Finding]) -> list[Finding]:
    """Print each finding's line as it comes, then how many of the verdicts confirm their cause."""
    shown = []
    for finding in findings:
        print(finding.line(), flush=True)
        shown.append(finding)
    judged = [f for f in shown if f.confirmed is not None]
    print(f"{sum(bool(f.confirmed) for f in judged)}/{len(judged)} confirmed")
    return shown


# ------------------------------------------------------------------------------ causes several checks test
def without_group_variance_path(case: Case, inputs: Arrays) -> np.ndarray:
    """GroupNorm / InstanceNorm dx with the variance path dropped, rstd * (g - mean g) per group (g = dy * w):
    what is left where the derivative of rsqrt(v) underflows (|x| ~ 5e17 in float32, 1e150 in float64)."""
    geo = geometry(case)
    x = inputs["x"].astype(np.float64).reshape(geo.shape)
    w = inputs["weight"].astype(np.float64).reshape(geo.param_shape) if case.weight else 1.0
    g = inputs["dy"].astype(np.float64).reshape(geo.shape) * w
    var = x.var(axis=geo.group_axes, keepdims=True)
    dx: np.ndarray = (g - g.mean(axis=geo.group_axes, keepdims=True)) / np.sqrt(var + case.eps)
    return dx.reshape(case.shape)


def flax_two_pass(case: Case, inputs: Arrays, *, grad: bool) -> dict[str, np.ndarray]:
    """The flax adapter's outputs with use_fast_variance=False on the case's module, the only change.

    FlaxLinen builds its modules through backends.flax.linen.MODULES, which the module-level step function
    reads when it compiles: the adapter takes no module factory, so the table is swapped for this run.
    """
    from backends.flax import linen as flax_linen

    def two_pass(spec: Any) -> Any:
        return original(spec).clone(use_fast_variance=False)

    original = flax_linen.MODULES[case.op]
    with replaced(flax_linen.MODULES, {case.op: two_pass}):
        # A fresh adapter: the shared one's executable cache holds the one-pass graphs.
        return run(flax_linen.FlaxLinen(), case, inputs, grad=grad)


def float64_as_float32(
    chosen: Backend, case: Case, inputs: Arrays, actual: Arrays, names: Collection[str], *, grad: bool
) -> tuple[str, bool]:
    """Whether float64 ``actual`` is the backend's float32 run of the inputs rounded to float32: bit for bit,
    or (XLA may order a float64-policy graph's float32 reductions its own way) read as float32 within the
    float32 case's tolerances against its oracle."""
    if case.dtype != "float64" or not names:
        return "not a float64 deviation", False
    narrow = dataclasses.replace(case, dtype="float32")
    narrow_inputs = {k: round_to(v, "float32") for k, v in inputs.items()}
    try:
        out = run(chosen, narrow, narrow_inputs, grad=grad)
    except Unsupported as why:  # Gemma's 1 + w, exact in float64, may not be in float32: no twin
        out, note = {}, f"no float32 twin ({why})"
    else:
        note = ""
    same = {
        o: bool(o in out and np.array_equal(actual[o], out[o].astype(np.float64), equal_nan=True))
        for o in names
    }
    if out and all(same.values()):
        return f"bit for bit the float32 run: {sorted(same)}", True
    read = {k: np.asarray(v).astype(np.float32) for k, v in actual.items()}
    as32 = ratios(narrow, narrow_inputs, expected(narrow, narrow_inputs), read, names)
    return f"{note or f'bit for bit {same}'}; read as float32 {as32}", passes(as32)


def plugin_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 bits by OpenVINO's CPU plugin's Convert,
    bfloat16_t::round_to_nearest_even = (bits + ((bits & 0x10000) >> 1)) >> 16 (truncating whenever the
    kept last bit is even)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded: np.ndarray = ((bits + ((bits & 0x10000) >> 1)) >> 16).astype(np.uint16)
    return rounded


def float32_twin(name: str, case: Case, inputs: Arrays, actual: Arrays, *, grad: bool) -> dict[str, bool]:
    """(openvino*) Whether each output is, bit for bit, the same graph's float32 twin (the case in float32
    on the inputs upcast exactly) rounded to the output's dtype as the plugin rounds: bfloat16 by its
    Convert (plugin_bf16), other dtypes to nearest."""
    twin = dataclasses.replace(case, dtype="float32", param_dtype=None, residual_dtype=None)
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, as in the plugin
        single = {k: v.astype(np.float32) for k, v in inputs.items()}
    reference = run(backend(name), twin, single, grad=grad)
    same = {}
    for output, value in actual.items():
        want = reference[output]
        if value.dtype.name == "bfloat16":
            same[output] = bool(np.array_equal(value.view(np.uint16), plugin_bf16(want)))
        else:
            same[output] = bool(np.array_equal(value, want.astype(value.dtype), equal_nan=True))
    return same


def keras_here(name: str) -> Backend:
    """The Keras adapter ``name`` (keras: the torch backend, keras-jax: JAX) running in this process, so
    that what a check changes in Keras reaches the run. Keras fixes its backend at its first import, from
    KERAS_BACKEND, so this is called before anything imports keras."""
    os.environ["KERAS_BACKEND"] = KERAS_BACKENDS[name]
    chosen = backend(name)
    if not getattr(chosen, "runs_here", lambda: False)():
        raise SystemExit(f"{name} would run in a child process: keras was imported for another backend")
    return chosen
