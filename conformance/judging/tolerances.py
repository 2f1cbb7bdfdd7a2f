"""The tolerance matrix: rules keyed by op, output, dtype and dist, most specific wins.

Rules never name a backend. ``atol`` is relative to the RMS of the expected tensor (see
docs/tolerances.md), so one rule serves every input scale; ``rtol`` is relative to each element.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.judging import tomlfile
from conformance.model.case import DISTS, OPS
from conformance.model.dtypes import DTYPES

KEYS: tuple[str, ...] = ("op", "output", "dtype", "dist")
OUTPUTS: tuple[str, ...] = (
    "y",
    "residual_out",
    "dresidual",
    "running_mean",
    "running_var",
    "dx",
    "dweight",
    "dbias",
    "mean",
    "rstd",
)
_ALLOWED: dict[str, tuple[str, ...]] = {"op": OPS, "output": OUTPUTS, "dtype": DTYPES, "dist": DISTS}
_FIELDS = set(KEYS) | {"rtol", "atol", "cond", "why"}


class ToleranceError(ValueError):
    """The tolerance file is malformed; the message names the file, the rule and the field."""


@dataclass(frozen=True)
class Rule:
    """One row of the matrix; ``None`` keys match anything."""

    index: int
    op: str | None
    output: str | None
    dtype: str | None
    dist: str | None
    rtol: float
    atol: float
    cond: float
    why: str

    @property
    def keys(self) -> tuple[str | None, ...]:
        return (self.op, self.output, self.dtype, self.dist)

    @property
    def specificity(self) -> int:
        return sum(k is not None for k in self.keys)

    def matches(self, query: tuple[str, ...]) -> bool:
        return all(k is None or k == q for k, q in zip(self.keys, query, strict=True))

    @property
    def source(self) -> str:
        named = " ".join(f"{n}={k}" for n, k in zip(KEYS, self.keys, strict=True) if k is not None)
        return f"rule[{self.index}] {named or '(catch-all)'}"


@dataclass(frozen=True)
class Tolerance:
    """The tolerance applied to one output, with where it came from and why.

    ``cond`` multiplies the case's mean error u_s * kappa (conformance.judging.conditioning) into atol.
    """

    rtol: float
    atol: float
    cond: float
    source: str
    why: str
    rule: int | None = None  # the rule's index in its file
    keys: Mapping[str, str] = field(default_factory=dict)  # the keys the rule names (op, output, ...)
    file: str = ""  # the tolerance file's name


@dataclass(frozen=True)
class ToleranceTable:
    """All rules of one file plus the file's identity (hash) for the results header."""

    path: str
    sha256: str
    rules: tuple[Rule, ...]
    # Built from ``rules``: which rules match each key value, and each query's answer once looked up.
    # Every check looks up its outputs' tolerances; a run asks the same few queries thousands of times.
    _index: _Index = field(init=False, repr=False, compare=False)
    _answers: dict[tuple[str, ...], Tolerance] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", _Index.of(self.rules))

    def lookup(self, op: str, output: str, dtype: str, dist: str) -> Tolerance:
        query = (op, output, dtype, dist)
        known = self._answers.get(query)
        if known is not None:
            return known
        candidates = self._index.candidates(query)
        if not candidates:
            raise ToleranceError(
                f"{self.path}: no rule matches op={op} output={output} dtype={dtype} dist={dist}"
            )
        best = max(candidates, key=lambda r: r.specificity)
        name = Path(self.path).name
        keys = {n: k for n, k in zip(KEYS, best.keys, strict=True) if k is not None}
        answer = Tolerance(
            best.rtol, best.atol, best.cond, f"{name} {best.source}", best.why, best.index, keys, name
        )
        self._answers[query] = answer
        return answer


@dataclass(frozen=True)
class _Index:
    """For each key, each named value's bitmask of the rules that match it (bit i: rule i), and the
    mask of the rules that leave the key open; a query's candidates are the AND of its four masks.

    Equivalent to testing every rule's ``matches``, at four dict lookups a query: the exhaustive tie
    check below asks every query of the key space once in each process that reads the file.
    """

    rules: tuple[Rule, ...]
    named: tuple[Mapping[str, int], ...]
    wild: tuple[int, ...]

    @classmethod
    def of(cls, rules: tuple[Rule, ...]) -> _Index:
        named: list[dict[str, int]] = []
        wilds: list[int] = []
        for position in range(len(KEYS)):
            wild = sum(1 << bit for bit, rule in enumerate(rules) if rule.keys[position] is None)
            masks: dict[str, int] = {}
            for bit, rule in enumerate(rules):
                key = rule.keys[position]
                if key is not None:
                    masks[key] = masks.get(key, wild) | 1 << bit
            named.append(masks)
            wilds.append(wild)
        return cls(rules, tuple(named), tuple(wilds))

    def mask(self, query: tuple[str, ...]) -> int:
        mask = -1
        for masks, wild, value in zip(self.named, self.wild, query, strict=True):
            mask &= masks.get(value, wild)
        return mask

    def matching(self, mask: int) -> list[Rule]:
        """The rules of ``mask``'s bits, in file order."""
        return [rule for bit, rule in enumerate(self.rules) if mask >> bit & 1]

    def candidates(self, query: tuple[str, ...]) -> list[Rule]:
        """The rules matching ``query``, in file order."""
        return self.matching(self.mask(query))


def default_path() -> Path:
    return tomlfile.builtin("tolerances.toml")


def read_tolerances(path: str | Path | None = None) -> ToleranceTable:
    """Read and validate a tolerance file (the built-in one by default)."""
    file = Path(path) if path is not None else default_path()
    data, sha256 = tomlfile.read(file, "tolerance file", ToleranceError)
    entries = data.get("rule")
    if not isinstance(entries, list) or not entries:
        raise ToleranceError(f"{file}: expected one or more [[rule]] tables")
    rules = tuple(_rule(file, i, entry) for i, entry in enumerate(entries))
    table = ToleranceTable(str(file), sha256, rules)
    _check_ties(file, table)
    return table


def _rule(file: Path, index: int, entry: Any) -> Rule:
    where = f"{file}: rule[{index}]"
    if not isinstance(entry, dict):
        raise ToleranceError(f"{where}: expected a table")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise ToleranceError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_FIELDS)}")
    keys = {name: _key(where, name, entry.get(name)) for name in KEYS}
    numbers = {name: _number(where, name, entry.get(name)) for name in ("rtol", "atol")}
    numbers["cond"] = _number(where, "cond", entry.get("cond", 0.0))
    why = entry.get("why")
    if not isinstance(why, str) or not why.strip():
        raise ToleranceError(f"{where}: why={why!r} is not allowed; allowed: a non-empty explanation")
    return Rule(
        index=index,
        op=keys["op"],
        output=keys["output"],
        dtype=keys["dtype"],
        dist=keys["dist"],
        rtol=numbers["rtol"],
        atol=numbers["atol"],
        cond=numbers["cond"],
        why=why.strip(),
    )


def _key(where: str, name: str, value: Any) -> str | None:
    if value is None or value == "*":
        return None
    if value not in _ALLOWED[name]:
        raise ToleranceError(
            f"{where}: {name}={value!r} is not allowed; allowed: *, {', '.join(_ALLOWED[name])}"
        )
    return str(value)


def _number(where: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ToleranceError(f"{where}: {name}={value!r} is not allowed; allowed: a finite number >= 0")
    return float(value)


def _check_ties(file: Path, table: ToleranceTable) -> None:
    """Every concrete query must have one most specific rule; two equally specific winners are ambiguous.

    The key space is small (ops x outputs x dtypes x dists), so it is checked exhaustively at load.
    """
    index = table._index
    # Queries matched by the same set of rules have the same winners: decide each set once.
    tied: dict[int, list[Rule]] = {}
    for query in itertools.product(OPS, OUTPUTS, DTYPES, DISTS):
        mask = index.mask(query)
        if mask not in tied:
            candidates = index.matching(mask)
            top = max((r.specificity for r in candidates), default=0)
            tied[mask] = [r for r in candidates if r.specificity == top]
        winners = tied[mask]
        if len(winners) > 1:
            named = " ".join(f"{n}={q}" for n, q in zip(KEYS, query, strict=True))
            raise ToleranceError(
                f"{file}: {winners[0].source} and {winners[1].source} tie for {named}; "
                "add a more specific rule or narrow one of them"
            )
