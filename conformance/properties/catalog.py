"""Metamorphic properties: relations between a backend's outputs on related inputs.

Each property turns an ``Example`` (a handful of small integers and names, which Hypothesis draws and
shrinks) into related inputs, runs the backend on each, and checks the relation. Two outputs that are
each within tolerance of their exact answers are within the sum of their allowances (plus the gap
between the exact answers, 0 for an exact relation) of each other, so the tolerance matrix decides;
whether the related outputs are also identical bit for bit is recorded (batch invariance).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from conformance import oracle
from conformance.adapter.backend import Backend
from conformance.adapter.execute import run_backend
from conformance.judging import allowance
from conformance.judging.tolerances import ToleranceTable
from conformance.model.case import GROUP_NORM, GROUP_OPS, INSTANCE_NORM, Case
from conformance.model.dtypes import round_to
from conformance.model.geometry import geometry
from conformance.model.inputs import PER_ROW, for_call, make_inputs
from conformance.model.outputs import output_dtype, output_shape, produced

Arrays = dict[str, np.ndarray]
EPSILONS: tuple[float, ...] = (1e-6, 1e-5, 1e-3)


@dataclass(frozen=True)
class Example:
    """What a property is evaluated on; ``knob`` and ``flag`` mean what each property says.

    LN/RMS cases are ``rows`` x ``features``. GroupNorm/InstanceNorm cases are (rows, C, features):
    ``rows`` samples of ``groups`` groups of ``width`` channels (InstanceNorm: one channel per group,
    ``width`` unused) holding ``features`` spatial values each.
    """

    op: str
    dtype: str
    rows: int
    features: int
    seed: int
    eps: float
    knob: int = 0
    flag: bool = False
    groups: int = 1
    width: int = 1

    def case(self, **changes: object) -> Case:
        fields: dict[str, object] = {
            "op": self.op,
            "shape": (self.rows, self.features),
            "dtype": self.dtype,
            "eps": self.eps,
            "seed": self.seed,
        }
        if self.op == GROUP_NORM:
            fields.update(shape=(self.rows, self.groups * self.width, self.features), num_groups=self.groups)
        elif self.op == INSTANCE_NORM:
            fields.update(shape=(self.rows, self.groups, self.features))
        return Case(**{**fields, **changes})  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PropertyContext:
    tolerances: ToleranceTable
    timeout: float
    grad: bool  # the backend declares backward


@dataclass(frozen=True)
class Evaluation:
    """One backend call on explicit inputs, with the oracle's answer and each element's allowance."""

    case: Case
    actual: Arrays
    expected: Arrays
    allowance: Arrays
    info: Mapping[str, object] = field(default_factory=dict)  # the call's Prepared.info()


@dataclass(frozen=True)
class Outcome:
    """One example's verdict: worst |a1 - a2| / (allowances + exact gap), and whether bits agree."""

    worst_ratio: float
    bitwise: bool
    detail: str = ""
    output: str = "y"
    # What the backend recorded for the example's calls: ledger entries may require it (ledger info).
    info: Mapping[str, object] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.worst_ratio <= 1.0


class Violation(AssertionError):
    """A property failed on an example (Hypothesis shrinks it, then this carries the minimal one)."""

    def __init__(self, example: Example, outcome: Outcome) -> None:
        super().__init__(f"{outcome.detail} (worst_ratio {outcome.worst_ratio:.4g}) on {example}")
        self.example = example
        self.outcome = outcome


def evaluate(
    backend: Backend,
    case: Case,
    inputs: Mapping[str, np.ndarray],
    ctx: PropertyContext,
    grad: bool = False,
    *,
    price: bool = True,
) -> Evaluation:
    """Run ``backend`` on ``inputs`` (validated, under the deadline); with ``price``, also the oracle's
    answer and every element's allowance."""
    given = for_call(inputs, grad=grad)
    shapes = {name: output_shape(case, name) for name in produced(case, grad)}
    result = run_backend(
        backend, case, given, grad=grad, calls=1, expected_shapes=shapes, timeout=ctx.timeout
    )
    if not price:
        return Evaluation(case, result.outputs[0], {}, {}, result.info)
    expected = oracle.evaluate(case, given, grad=grad)
    allowance = {name: allowance_of(case, name, given, expected, ctx.tolerances) for name in shapes}
    return Evaluation(case, result.outputs[0], expected, allowance, result.info)


def allowance_of(
    case: Case,
    output: str,
    inputs: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    table: ToleranceTable,
) -> np.ndarray:
    """The comparison's allowance (conformance.judging.allowance), element by element."""
    tol = table.lookup(case.op, output, output_dtype(case, output), case.dist)
    return allowance.elementwise(tol, allowance.factors(case, output, inputs, expected), expected[output])


def relate(
    output: str, first: Evaluation, second: Evaluation, pick: Callable[[np.ndarray], np.ndarray] = lambda a: a
) -> Outcome:
    """``first`` against ``pick`` of ``second`` (the relation mapped onto the first's layout)."""
    a1 = np.asarray(first.actual[output]).astype(np.float64)
    a2 = pick(np.asarray(second.actual[output]).astype(np.float64))
    gap = np.abs(first.expected[output] - pick(np.asarray(second.expected[output], dtype=np.float64)))
    allowed = first.allowance[output] + pick(second.allowance[output]) + np.nan_to_num(gap, nan=0.0)
    same = (a1 == a2) | (np.isnan(a1) & np.isnan(a2))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        ratio = np.where(same, 0.0, np.abs(a1 - a2) / allowed)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    worst = float(ratio.max()) if ratio.size else 0.0
    detail = ""
    if worst > 1.0:
        index = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
        detail = f"{output} at {index}: {a1[index]!r} vs {a2[index]!r}, allowed {allowed[index]:.3g}"
    return Outcome(worst, bool(np.all(same)), detail, output, {**second.info, **first.info})


def combine(outcomes: list[Outcome]) -> Outcome:
    worst = max(outcomes, key=lambda o: o.worst_ratio)
    bitwise = all(o.bitwise for o in outcomes)
    return Outcome(worst.worst_ratio, bitwise, worst.detail, worst.output, worst.info)


def _inputs(case: Case, grad: bool, x: np.ndarray | None = None) -> Arrays:
    """The case's own parameters (and dy), with ``x`` replaced by the property's values."""
    inputs = make_inputs(case, grad=grad)
    if x is not None:
        inputs["x"] = round_to(x, case.dtype)
    return inputs


def _grid(example: Example, spread: int = 8, step: float = 2.0**-3) -> np.ndarray:
    """Values step * m, |m| <= spread: exact in every dtype, also after shifts and power-of-two scalings."""
    rng = np.random.default_rng(example.seed)
    values: np.ndarray = step * rng.integers(-spread, spread + 1, size=(example.rows, example.features))
    return values


# ----------------------------------------------------------------------------- the properties
def shift_invariance(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """LN(x + c) = LN(x); x and c on a grid so x + c is exact in the dtype (knob: c in grid steps)."""
    case = example.case()
    x = _grid(example)
    shift = 2.0**-3 * example.knob
    base = evaluate(backend, case, _inputs(case, False, x), ctx)
    moved = evaluate(backend, case, _inputs(case, False, x + shift), ctx)
    return relate("y", moved, base)


def scale_invariance(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """N(a x; a^2 eps) = N(x; eps) for LN and RMSNorm, at a = 2^k and 2^-k (k = knob, exact scalings),
    or 3 times those with ``flag`` (inputs then round, and the exact gap is allowed for)."""
    case = example.case()
    x = _grid(example, spread=64, step=2.0**-4)
    inputs = _inputs(case, False, x)
    base = evaluate(backend, case, inputs, ctx)
    outcomes = []
    for exponent in (example.knob, -example.knob):
        a = (3.0 if example.flag else 1.0) * 2.0**exponent
        scaled_case = example.case(eps=example.eps * a * a)
        scaled = evaluate(backend, scaled_case, {**inputs, "x": round_to(a * x, case.dtype)}, ctx)
        outcomes.append(relate("y", scaled, base))
    return combine(outcomes)


def row_independence(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """Row ``knob`` gives the same output alone, in its batch, and among other rows at another position."""
    case = example.case()
    inputs = _inputs(case, False)
    row = example.knob % example.rows
    batch = evaluate(backend, case, inputs, ctx)
    alone_case = example.case(shape=(1, example.features))
    alone = evaluate(backend, alone_case, {**_params_of(inputs), **_rows(inputs, [row])}, ctx)
    others_case = example.case(shape=(example.rows + 3, example.features), seed=example.seed + 1)
    others = _inputs(others_case, False)
    others["x"] = others["x"].copy()
    others["x"][2] = inputs["x"][row]
    mixed = evaluate(backend, others_case, {**others, **_params_of(inputs)}, ctx)
    return combine(
        [
            relate("y", alone, batch, lambda a: a[row : row + 1]),
            relate("y", alone, mixed, lambda a: a[2:3]),
        ]
    )


def row_permutation(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """N(P x) = P N(x) for a row permutation P (with dy permuted alike, dx too)."""
    case = example.case()
    grad = ctx.grad
    inputs = _inputs(case, grad)
    order = np.random.default_rng(example.knob).permutation(example.rows)
    permuted = {**inputs, "x": inputs["x"][order]}
    for name in PER_ROW:
        if name in inputs and name != "x":
            permuted[name] = inputs[name][order]
    base = evaluate(backend, case, inputs, ctx, grad)
    moved = evaluate(backend, case, permuted, ctx, grad)
    outputs = ["y", "dx"] if grad else ["y"]
    return combine([relate(name, moved, base, lambda a: a[order]) for name in outputs])


def nonfinite_containment(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """A NaN or +-Inf in one element of row ``knob`` propagates and stays put: every output (y, and with
    a backward dx, dweight, dbias) is non-finite exactly where the oracle's is (a NaN never becomes 0 or
    a finite row), and every other row's y and dx are as they were without it."""
    case = example.case()
    grad = ctx.grad
    inputs = _inputs(case, grad)
    row, column = example.knob % example.rows, example.seed % example.features
    poison = (np.nan, np.inf, -np.inf)[example.knob % 3]
    spoiled = inputs["x"].copy()
    spoiled[row, column] = poison
    dirty_inputs = {**inputs, "x": spoiled}
    dirty = evaluate(backend, case, dirty_inputs, ctx, grad, price=False)
    given = for_call(dirty_inputs, grad=grad)
    with np.errstate(invalid="ignore", over="ignore"):  # the exact answer is NaN/Inf there
        exact = oracle.evaluate(case, given, grad=grad)
    source = f"x[{row}, {column}] = {poison!r}"
    outcomes = [_nonfinite_where(name, dirty.actual[name], exact[name], source) for name in dirty.actual]
    keep = [i for i in range(example.rows) if i != row]
    if keep:
        names = ("y", "dx") if grad else ("y",)
        # The kept rows' exact answers and allowances are the clean run's: their inputs are unchanged.
        clean = _select(evaluate(backend, case, inputs, ctx, grad), keep, names)
        for name in names:
            moved = dataclasses.replace(clean, actual={name: np.asarray(dirty.actual[name])[keep]})
            outcomes.append(relate(name, moved, clean))
    return combine(outcomes)


def _nonfinite_where(output: str, actual: np.ndarray, exact: np.ndarray, source: str) -> Outcome:
    """Non-finite at exactly the oracle's non-finite positions, finite everywhere else."""
    a = np.asarray(actual).astype(np.float64)
    wrong = np.isfinite(a) != np.isfinite(exact)
    if not wrong.any():
        return Outcome(0.0, True, "", output)
    index = tuple(int(i) for i in np.argwhere(wrong)[0])
    detail = (
        f"{output} at {index}: {a[index]!r} where the exact answer is {exact[index]!r} after {source} "
        f"({int(wrong.sum())} of {wrong.size} elements finite where they must not be, or the reverse)"
    )
    return Outcome(math.inf, False, detail, output)


def constant_rows(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """Constant LN rows: y = bias, dweight = 0, dx = (g - mean g) / sqrt(eps), the closed forms."""
    case = example.case(dist="constant")
    grad = ctx.grad
    rng = np.random.default_rng(example.seed)
    x = np.repeat(2.0**-3 * rng.integers(-64, 65, size=(example.rows, 1)), example.features, axis=1)
    result = evaluate(backend, case, _inputs(case, grad, x), ctx, grad)
    return combine([_against_oracle(result, name) for name in result.actual])


def feature_size_one(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """Rows of one element: LN gives y = bias and dx = 0; RMSNorm y = w x / sqrt(x^2 + eps)."""
    case = example.case(shape=(example.rows, 1))
    result = evaluate(backend, case, _inputs(case, ctx.grad), ctx, ctx.grad)
    return combine([_against_oracle(result, name) for name in result.actual])


# ----------------------------------------------------------------------------- GroupNorm, InstanceNorm
# A (sample, group) of x is one plain index of the geometry view (N, G, C/G, spatial) of x.
def _groupwise(case: Case, values: np.ndarray) -> np.ndarray:
    """``values`` (x-shaped) as the geometry view, whose first two axes index (sample, group)."""
    return np.asarray(values).reshape(geometry(case).shape)


def _target(case: Case, index: int) -> tuple[int, int]:
    """The (sample, group) a property changes, from a drawn integer."""
    samples, groups = geometry(case).shape[:2]
    return index % samples, (index // samples) % groups


def _group_grid(example: Example, case: Case, spread: int = 8, step: float = 2.0**-3) -> np.ndarray:
    """``_grid``'s values in the case's (N, C, spatial) shape."""
    rng = np.random.default_rng(example.seed)
    values: np.ndarray = step * rng.integers(-spread, spread + 1, size=case.shape)
    return values


def _only(result: Evaluation, take: Callable[[np.ndarray], np.ndarray]) -> Evaluation:
    """``result``'s y restricted to the elements ``take`` selects (of x's shape)."""
    pick: Callable[[Mapping[str, np.ndarray]], Arrays] = lambda d: {"y": take(np.asarray(d["y"]))}  # noqa: E731
    return Evaluation(
        result.case, pick(result.actual), pick(result.expected), pick(result.allowance), result.info
    )


def _other_groups(case: Case, sample: int, group: int) -> Callable[[np.ndarray], np.ndarray]:
    keep = np.ones(geometry(case).shape[:2], dtype=bool)
    keep[sample, group] = False
    return lambda a: _groupwise(case, a)[keep]


def group_shift_invariance(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """Adding c to one (sample, group) leaves every output unchanged: that group's, by shift
    invariance, and every other group's, by independence (c = knob grid steps; x + c exact)."""
    case = example.case()
    x = _group_grid(example, case)
    sample, group = _target(case, example.seed)
    moved_x = x.copy()
    _groupwise(case, moved_x)[sample, group] += 2.0**-3 * example.knob
    base = evaluate(backend, case, _inputs(case, False, x), ctx)
    moved = evaluate(backend, case, _inputs(case, False, moved_x), ctx)
    return relate("y", moved, base)


def group_scale_invariance(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """One (sample, group) scaled by a = 2^k and 2^-k (k = knob, exact) with eps scaled by a^2 gives
    that group the same output; the other groups see another eps, so only the scaled one is compared."""
    case = example.case()
    x = _group_grid(example, case, spread=64, step=2.0**-4)
    sample, group = _target(case, example.seed)
    inputs = _inputs(case, False, x)
    base = evaluate(backend, case, inputs, ctx)
    outcomes = []
    for exponent in (example.knob, -example.knob):
        a = 2.0**exponent
        scaled_x = x.copy()
        _groupwise(case, scaled_x)[sample, group] *= a
        # The same parameters: the scaled case's own inputs would be drawn for its other eps.
        scaled_case = example.case(eps=example.eps * a * a)
        scaled = evaluate(backend, scaled_case, {**inputs, "x": round_to(scaled_x, case.dtype)}, ctx)
        take: Callable[[np.ndarray], np.ndarray] = lambda v: _groupwise(case, v)[sample, group]  # noqa: E731
        outcomes.append(relate("y", _only(scaled, take), _only(base, take)))
    return combine(outcomes)


def _replaced(example: Example, case: Case, values: np.ndarray) -> np.ndarray:
    """Other values far from ``values``'s (32 times larger, offset by 3): a leak of statistics shows."""
    other = make_inputs(example.case(seed=example.seed + 1, dist="normal"))["x"].astype(np.float64)
    return round_to(32.0 * other.reshape(-1)[: values.size].reshape(values.shape) + 3.0, case.dtype)


def sample_independence(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """Changing sample ``knob`` leaves every other sample's output as it was."""
    case = example.case()
    inputs = _inputs(case, False)
    j = example.knob % example.rows
    changed = inputs["x"].copy()
    changed[j] = _replaced(example, case, changed[j])
    base = evaluate(backend, case, inputs, ctx)
    moved = evaluate(backend, case, {**inputs, "x": changed}, ctx)
    keep = [i for i in range(example.rows) if i != j]
    take: Callable[[np.ndarray], np.ndarray] = lambda a: a[keep]  # noqa: E731
    return relate("y", _only(moved, take), _only(base, take))


def group_independence(backend: Backend, example: Example, ctx: PropertyContext) -> Outcome:
    """Changing one (sample, group) (chosen by ``knob``) leaves every other group's output as it was."""
    case = example.case()
    inputs = _inputs(case, False)
    sample, group = _target(case, example.knob)
    changed = inputs["x"].copy()
    view = _groupwise(case, changed)
    view[sample, group] = _replaced(example, case, view[sample, group])
    base = evaluate(backend, case, inputs, ctx)
    moved = evaluate(backend, case, {**inputs, "x": changed}, ctx)
    take = _other_groups(case, sample, group)
    return relate("y", _only(moved, take), _only(base, take))


def _against_oracle(result: Evaluation, output: str) -> Outcome:
    exact = dataclasses.replace(
        result,
        actual={output: result.expected[output]},
        allowance={output: np.zeros_like(result.allowance[output])},
    )
    return relate(output, result, exact)


def _rows(inputs: Arrays, rows: list[int]) -> Arrays:
    return {k: v[rows] for k, v in inputs.items() if k in PER_ROW}


def _params_of(inputs: Arrays) -> Arrays:
    return {k: v for k, v in inputs.items() if k not in PER_ROW}


def _select(result: Evaluation, rows: list[int], names: tuple[str, ...] = ("y",)) -> Evaluation:
    take: Callable[[Mapping[str, np.ndarray]], Arrays] = lambda d: {n: np.asarray(d[n])[rows] for n in names}  # noqa: E731
    return Evaluation(
        result.case, take(result.actual), take(result.expected), take(result.allowance), result.info
    )


_GROUPED = ("group_norm", "instance_norm")


@dataclass(frozen=True)
class Property:
    """A property, the ops it holds for, and the ranges Hypothesis draws its example from."""

    name: str
    check: Callable[[Backend, Example, PropertyContext], Outcome]
    ops: tuple[str, ...]
    knob: tuple[int, int] = (0, 0)
    rows: tuple[int, int] = (1, 6)
    features: tuple[int, int] = (2, 48)
    relation: bool = True  # compares two backend runs (so bitwise agreement means something)
    weight: int = 1  # times the profile's example budget: batch invariance is only as good as its sample
    groups: tuple[int, int] = (1, 1)  # GN/IN: groups per sample (InstanceNorm: channels)
    width: tuple[int, int] = (1, 1)  # GroupNorm: channels per group

    @property
    def grouped(self) -> bool:
        """Whether examples are GN/IN shapes, drawn with ``groups`` and ``width``."""
        return bool(GROUP_OPS & set(self.ops))


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in (
        Property("shift_invariance", shift_invariance, ("layer_norm",), knob=(-64, 64)),
        Property("scale_invariance", scale_invariance, ("layer_norm", "rms_norm"), knob=(3, 10)),
        Property(
            "row_independence",
            row_independence,
            ("layer_norm", "rms_norm"),
            knob=(0, 7),
            rows=(2, 6),
            weight=4,
        ),
        Property("row_permutation", row_permutation, ("layer_norm", "rms_norm"), knob=(0, 1000), rows=(2, 6)),
        Property(
            "nonfinite_containment",
            nonfinite_containment,
            ("layer_norm", "rms_norm"),
            knob=(0, 17),
            rows=(2, 6),
        ),
        Property("constant_rows", constant_rows, ("layer_norm",), relation=False),
        Property(
            "feature_size_one", feature_size_one, ("layer_norm", "rms_norm"), features=(1, 1), relation=False
        ),
        # InstanceNorm needs two spatial values per instance; a few channels per group are enough.
        Property(
            "group_shift_invariance",
            group_shift_invariance,
            _GROUPED,
            knob=(-64, 64),
            rows=(1, 3),
            features=(2, 8),
            groups=(1, 4),
            width=(1, 3),
        ),
        Property(
            "group_scale_invariance",
            group_scale_invariance,
            _GROUPED,
            knob=(3, 10),
            rows=(1, 3),
            features=(2, 8),
            groups=(1, 4),
            width=(1, 3),
        ),
        Property(
            "sample_independence",
            sample_independence,
            _GROUPED,
            knob=(0, 7),
            rows=(2, 4),
            features=(2, 8),
            groups=(1, 4),
            width=(1, 3),
        ),
        Property(
            "group_independence",
            group_independence,
            _GROUPED,
            knob=(0, 15),
            rows=(1, 3),
            features=(2, 8),
            groups=(2, 4),
            width=(1, 3),
        ),
    )
}
