"""Failure messages: what was expected, what came back, where, under which rule, how to rerun."""

from __future__ import annotations

import math

import numpy as np

from conformance.judging.ledger import Deviation
from conformance.model.case import Case
from conformance.results.result import ComparisonRecord, RoundingRecord


def header(backend: str, case: Case, check: str) -> str:
    return f"{backend} {case.id} [{check}]\n"


def _figures(c: ComparisonRecord) -> str:
    tol = c.tolerance
    where = f"index {c.worst_index}" if c.worst_index else "whole tensor"
    return (
        f"  worst at {where}: actual {c.actual_at_worst!r}, expected {c.expected_at_worst!r}, "
        f"worst_ratio {c.worst_ratio:.4g}\n"
        f"  mismatched {c.mismatched} of {c.numel}; max_abs {c.max_abs:.4g}, max_rel {c.max_rel:.4g}, "
        f"max_ulp {c.max_ulp:.4g}\n"
        f"  tolerance {tol.source}: |a - e| <= atol*scale + min(cond*mean_error, mean_cap)*sensitivity "
        f"+ rtol*|e| with rtol={tol.rtol:.3g}, atol={tol.atol:.3g}, scale={c.scale:.4g}, cond={tol.cond:g}, "
        f"mean_error={c.mean_error:.3g}, mean_cap={c.mean_cap:.3g}, sensitivity={c.sensitivity:.3g} "
        f"-> atol_effective={c.tolerance.atol_effective:.3g}\n"
        f"  why: {tol.why}\n"
        f"  mismatch fraction {c.mismatch_fraction:.3g} (share off the correctly rounded answer)"
        + (f"; {rounding(c.rounding)}" if c.rounding is not None else "")
        + "\n"
    )


def rounding(r: RoundingRecord) -> str:
    """The rounding statistic in one line: both means with their standard errors and the limit."""
    judged = (
        f"round-to-nearest stays within +-{r.limit:.3g} at that count" if r.judged else "too few to judge"
    )
    return (
        f"rounding bias {r.bias:+.3f} ulp toward zero when negative (+-{r.bias_se:.2g}), "
        f"drift {r.drift:+.3f} ulp toward -inf when negative (+-{r.drift_se:.2g}) "
        f"over {r.n} elements within one ulp; {judged}"
    )


def failure(
    backend: str, case: Case, check: str, c: ComparisonRecord, entry: Deviation | None, reproduce: str
) -> str:
    if c.problem:
        head = f"output {c.output!r}: {c.problem}\n"
    elif c.worst_ratio > 1.0:
        head = f"output {c.output!r} out of tolerance\n" + _figures(c)
    else:
        head = f"output {c.output!r} rounds with a bias: within tolerance, but its errors lean one way\n"
        head += _figures(c)
    if entry is not None and entry.model:
        head += _unexplained(entry, c)
    elif entry is not None:
        if entry.measure == "rounding":
            size = c.rounding.size if c.rounding is not None else float("nan")
            head += (
                f"  ledger deviation[{entry.index}] covers this output's rounding bias up to "
                f"{entry.band[1]:g} "
                f"ulp within tolerance, measured {size:.3g} ulp at worst_ratio {c.worst_ratio:.4g}: "
                "it is beyond what the entry describes\n"
            )
        else:
            head += (
                f"  ledger deviation[{entry.index}] covers this output up to worst_ratio {entry.band[1]:g}, "
                f"measured {c.worst_ratio:.4g}: the deviation grew beyond its recorded band\n"
            )
    return header(backend, case, check) + head + f"  reproduce: {reproduce}"


def _unexplained(entry: Deviation, c: ComparisonRecord) -> str:
    """Why a model entry's model did not explain the output."""
    x = c.explained
    if x is None:
        found = "the model was not evaluated (no outputs to judge)"
    elif not math.isfinite(x.model_ratio) and not math.isfinite(x.worst_ratio):
        found = f"the model does not produce {c.output!r}"
    else:
        found = (
            f"against the model's answer the output is at worst_ratio {x.worst_ratio:.4g} (the model "
            f"itself at {x.model_ratio:.4g} from the oracle)"
        )
    return (
        f"  ledger deviation[{entry.index}] names model {entry.model}, which does not explain this output: "
        f"{found}\n"
    )


def stale(backend: str, case: Case, check: str, c: ComparisonRecord, entry: Deviation, reproduce: str) -> str:
    return (
        header(backend, case, check)
        + f"ledger deviation[{entry.index}] expects output {c.output!r} to fail ({entry.reason}), "
        f"but it passed with worst_ratio {c.worst_ratio:.4g}: remove or narrow the entry (strict xfail)\n"
        + f"  reproduce: {reproduce}"
    )


def bits_changed(name: str, before: np.ndarray, after: np.ndarray, what: str = "by the call") -> str:
    """Empty when the two arrays hold the same bits; else where they first differ."""
    a = np.ascontiguousarray(before)
    b = np.ascontiguousarray(after)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{name}: changed {what} from {a.dtype}{a.shape} to {b.dtype}{b.shape}"
    width = a.dtype.itemsize
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    differ = a.view(view) != b.view(view)
    if not differ.any():
        return ""
    first = tuple(int(i) for i in np.argwhere(differ)[0])
    return (
        f"{name}: {int(differ.sum())} of {a.size} elements changed {what}; "
        f"first at {first}: {a[first]!r} -> {b[first]!r}"
    )
