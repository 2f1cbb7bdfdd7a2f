"""What changed between two runs: new failures, fixed cases, error growth, speed beyond the noise.

Results join on (backend, case id, check) and comparisons also on the output; benchmarks join on
(backend, case id, check). A regression is a new failure, a worst_ratio that grew by more than
``growth`` (and reached ``min_ratio``), or a benchmark slower by more than its measured noise.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from conformance.results.benchjson import Benchmark
from conformance.results.header import Header
from conformance.results.result import Result
from conformance.results.runs import BAD_OUTCOMES, GOOD_OUTCOMES

Key = tuple[str, str, str]


@dataclass(frozen=True)
class Thresholds:
    """``growth``: worst_ratio factor; ``min_ratio``: ignore growth below it; ``speed``: least relative
    change in median time that counts, raised to the two runs' summed relative IQR where that is larger."""

    growth: float = 2.0
    min_ratio: float = 0.1
    speed: float = 0.05


@dataclass(frozen=True)
class Change:
    backend: str
    case_id: str
    check: str
    before: str
    after: str
    reason: str


@dataclass(frozen=True)
class Growth:
    backend: str
    case_id: str
    check: str
    output: str
    before: float
    after: float

    @property
    def factor(self) -> float:
        return self.after / self.before if self.before > 0 else math.inf


@dataclass(frozen=True)
class Speed:
    backend: str
    case_id: str
    check: str
    before_s: float
    after_s: float
    noise: float
    # The kernels' time before and after where both runs measured it (GPU): says whether a change is the
    # kernels' or the host's.
    device_before_ms: float | None = None
    device_after_ms: float | None = None

    @property
    def change(self) -> float:
        """Relative change of the median time: +0.5 is 50% slower."""
        return self.after_s / self.before_s - 1.0


@dataclass(frozen=True)
class Diff:
    common: int
    only_base: int
    only_new: int
    new_failures: tuple[Change, ...]
    fixed: tuple[Change, ...]
    still_failing: int
    not_run: tuple[Change, ...]
    growth: tuple[Growth, ...]
    slower: tuple[Speed, ...] = ()
    faster: tuple[Speed, ...] = ()
    benchmarks_compared: int = 0
    # Passing outcomes that changed kind: xfailed -> passed (the deviation not seen here), passed ->
    # xfailed, and xfailed results that a model explains now and did not before. None is a regression.
    known: tuple[Change, ...] = ()

    @property
    def regression(self) -> bool:
        return bool(self.new_failures or self.growth or self.slower)


def _change(before: Result | None, after: Result) -> Change:
    outcome = before.outcome if before is not None else "absent"
    return Change(after.backend, after.case_id, after.check, outcome, after.outcome, after.summary)


def known(base: Mapping[Key, Result], new: Mapping[Key, Result]) -> list[Change]:
    """Changes among passing outcomes: a known deviation no longer seen, newly seen, or newly explained
    by a model (the change's ``after`` then reads ``xfailed (model NAME)``)."""
    found = []
    for k, after in sorted(new.items()):
        before = base.get(k)
        if before is None or before.outcome not in GOOD_OUTCOMES or after.outcome not in GOOD_OUTCOMES:
            continue
        then, now = _models(before), _models(after)
        if before.outcome != after.outcome or now != then:
            change = _change(before, after)
            label = f"{after.outcome} (model {', '.join(now)})" if now else after.outcome
            found.append(Change(change.backend, change.case_id, change.check, before.outcome, label, ""))
    return found


def _models(result: Result) -> tuple[str, ...]:
    return tuple(
        sorted({c.explained.model for c in result.comparisons if c.explained and c.explained.passed})
    )


def platform(header: Header) -> str:
    """Where a run ran, in one line: CPU and its features, the backends' devices, library versions."""
    env = header.environment
    features = " ".join(env.cpu_features) if env.cpu_features is not None else "not recorded"
    devices: dict[str, list[str]] = {}
    for name, info in sorted(header.backends.items()):
        if info.unavailable is None:
            devices.setdefault(f"{info.device} ({info.device_name or 'unnamed'})", []).append(name)
    where = "; ".join(f"{', '.join(names)} on {device}" for device, names in devices.items())
    versions = ", ".join(f"{n} {v}" for n, v in sorted(env.packages.items()) if v and n in _PLATFORM_PACKAGES)
    return f"{env.machine} {env.processor}, CPU features: {features}; {where}; {versions}"


# The library versions a platform line names (the ones kernels and rounding depend on).
_PLATFORM_PACKAGES = frozenset({"torch", "triton", "onnxruntime", "jax", "openvino", "numpy"})


def outcomes(
    base: Mapping[Key, Result], new: Mapping[Key, Result]
) -> tuple[list[Change], list[Change], int, list[Change]]:
    """(new failures, fixed, still failing, no longer run) between two keyed record sets."""
    new_failures, fixed, not_run, still = [], [], [], 0
    for k, after in sorted(new.items()):
        before = base.get(k)
        bad_now = after.outcome in BAD_OUTCOMES
        bad_then = before is not None and before.outcome in BAD_OUTCOMES
        if bad_now and bad_then:
            still += 1
        elif bad_now:
            new_failures.append(_change(before, after))
        elif bad_then and after.outcome in GOOD_OUTCOMES:
            fixed.append(_change(before, after))
        elif before is not None and before.outcome in GOOD_OUTCOMES and after.outcome not in GOOD_OUTCOMES:
            not_run.append(_change(before, after))
    return new_failures, fixed, still, not_run


def growth(base: Mapping[Key, Result], new: Mapping[Key, Result], t: Thresholds) -> list[Growth]:
    grown = []
    for k, after in sorted(new.items()):
        before = base.get(k)
        if before is None:
            continue
        then = {c.output: c.worst_ratio for c in before.comparisons}
        for comparison in after.comparisons:
            old, now = then.get(comparison.output, math.nan), comparison.worst_ratio
            if math.isnan(old) or old == math.inf:
                continue
            if (math.isnan(now) or now == math.inf) or (now >= t.min_ratio and now > t.growth * old):
                grown.append(Growth(*k, comparison.output, old, now))
    return grown


def speed(
    base: Mapping[Key, Benchmark], new: Mapping[Key, Benchmark], t: Thresholds
) -> tuple[list[Speed], list[Speed]]:
    """(slower, faster) benchmarks whose median moved by more than max(t.speed, summed noise)."""
    slower, faster = [], []
    for k, after in sorted(new.items()):
        before = base.get(k)
        if before is None or before.median_s <= 0:
            continue
        change = Speed(
            *k, before.median_s, after.median_s, before.noise + after.noise, before.device_ms, after.device_ms
        )
        limit = max(t.speed, change.noise)
        if change.change > limit:
            slower.append(change)
        elif change.change < -limit:
            faster.append(change)
    return slower, faster


def diff(
    base_records: Iterable[Result],
    new_records: Iterable[Result],
    thresholds: Thresholds = Thresholds(),
    base_bench: Mapping[Key, Benchmark] | None = None,
    new_bench: Mapping[Key, Benchmark] | None = None,
) -> Diff:
    base = {r.key: r for r in base_records}
    new = {r.key: r for r in new_records}
    new_failures, fixed, still, not_run = outcomes(base, new)
    slower, faster = speed(base_bench or {}, new_bench or {}, thresholds)
    return Diff(
        common=len(base.keys() & new.keys()),
        only_base=len(base.keys() - new.keys()),
        only_new=len(new.keys() - base.keys()),
        new_failures=tuple(new_failures),
        fixed=tuple(fixed),
        still_failing=still,
        not_run=tuple(not_run),
        growth=tuple(growth(base, new, thresholds)),
        slower=tuple(slower),
        faster=tuple(faster),
        benchmarks_compared=len((base_bench or {}).keys() & (new_bench or {}).keys()),
        known=tuple(known(base, new)),
    )


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def text(d: Diff, thresholds: Thresholds, limit: int = 50) -> list[str]:
    """The terminal form of a Diff, each list capped at ``limit`` lines."""
    out: list[str] = []

    def section(title: str, rows: list[str], count: int | None = None) -> None:
        out.append(f"{title} ({len(rows) if count is None else count}):")
        out.extend(f"  {row}" for row in rows[:limit])
        if len(rows) > limit:
            out.append(f"  ... and {len(rows) - limit} more")

    section(
        "new failures",
        [f"{c.backend} {c.case_id} [{c.check}] {c.before} -> {c.after}: {c.reason}" for c in d.new_failures],
    )
    section("fixed", [f"{c.backend} {c.case_id} [{c.check}] {c.before} -> {c.after}" for c in d.fixed])
    if d.known:
        moves = Counter((c.before, c.after) for c in d.known)
        section(
            "known deviations changed (no regression)",
            [f"{before} -> {after}: {n}" for (before, after), n in sorted(moves.items())]
            + [f"{c.backend} {c.case_id} [{c.check}] {c.before} -> {c.after}" for c in d.known],
            count=len(d.known),
        )
    section(
        f"error growth beyond {thresholds.growth:g}x (worst_ratio >= {thresholds.min_ratio:g})",
        [
            f"{g.backend} {g.case_id} [{g.check}] {g.output}: "
            f"worst_ratio {g.before:.3g} -> {g.after:.3g} ({g.factor:.3g}x)"
            for g in d.growth
        ],
    )
    if d.benchmarks_compared:
        section(
            f"slower beyond the noise (>= {thresholds.speed:.0%} or the runs' IQR)",
            [_speed_line(s) for s in d.slower],
        )
        section("faster beyond the noise", [_speed_line(s) for s in d.faster])
    if d.not_run:
        section(
            "no longer run",
            [f"{c.backend} {c.case_id} [{c.check}] {c.before} -> {c.after}: {c.reason}" for c in d.not_run],
        )
    return out


def _speed_line(s: Speed) -> str:
    line = (
        f"{s.backend} {s.case_id} [{s.check}]: median {s.before_s * 1e6:.4g} us -> {s.after_s * 1e6:.4g} us "
        f"({_pct(s.change)}, noise {s.noise:.0%})"
    )
    if s.device_before_ms is not None and s.device_after_ms is not None:
        host = (s.before_s * 1e3 - s.device_before_ms, s.after_s * 1e3 - s.device_after_ms)
        line += (
            f"; device {s.device_before_ms * 1e3:.4g} us -> {s.device_after_ms * 1e3:.4g} us, "
            f"host {host[0] * 1e3:.4g} us -> {host[1] * 1e3:.4g} us"
        )
    return line
