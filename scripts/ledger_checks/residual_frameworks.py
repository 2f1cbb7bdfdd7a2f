"""Verify the suspected cause of every flax / keras / keras-jax failure of the fused residual ops
(add_rms_norm, add_layer_norm) in a results file by recomputing with that cause.

Usage (from the repository root), once per backend, in process (the script sets KERAS_BACKEND itself):

  python scripts/ledger_checks/residual_frameworks.py RESULTS.jsonl flax
  python scripts/ledger_checks/residual_frameworks.py RESULTS.jsonl keras
  python scripts/ledger_checks/residual_frameworks.py RESULTS.jsonl keras-jax
  ... RESULTS.jsonl flax --excess-precision-off    (also keras-jax)

It reads the failed records and the xfailed ones whose ledger entries cite this script, so a run with
the shipped ledger, or with these entries in it, will do.

Causes, tried in order until one is confirmed (every failing output fails as it is and passes with it):
  exact_sum   (flax, keras-jax) XLA's default --xla_allow_excess_precision=true removes the rounding of
              the bfloat16/float16 h = x + residual where the add fuses into the norm's float32 upcast:
              the oracle recomputed with norm_input="exact" (the norm reads the unrounded sum; residual_out
              stays rounded) must pass. --excess-precision-off reruns the adapter in this process with
              XLA_FLAGS=--xla_allow_excess_precision=false and compares it with the case's own oracle: the
              cases exact_sum explains must then pass as they are (their "as-is" column)
  one_pass    (flax) linen.LayerNorm's default use_fast_variance=True (one-pass E[x^2] - E[x]^2): the
              adapter rerun with use_fast_variance=False (the only change), against the case's oracle
  one_pass+exact_sum   both at once: the two-pass rerun against the exact-sum oracle
  float64     (keras, keras-jax) Keras computes float64 in float32: the failing outputs must be bit for
              bit the adapter's run of the case as float32 on the inputs rounded to float32 (or, read as
              float32, pass the float32 case's tolerances against its oracle)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import common

from conformance.adapter.backend import Backend
from conformance.model.case import ADD_OPS, Case
from conformance.results import records as results_records
from conformance.results.result import Result

OFF = "--xla_allow_excess_precision=false"


class Rerun:
    """One record's case rerun on the backend, and its failing outputs judged as they are."""

    def __init__(self, chosen: Backend, record: Result) -> None:
        self.chosen, self.record = chosen, record
        self.case: Case = common.case_of(record)
        self.grad = common.grad_of(record)
        self.inputs = common.inputs_of(self.case)
        self.failing = common.failing(record)
        self.actual = common.run(chosen, self.case, self.inputs, grad=self.grad)
        self.as_is = self.judge(common.expected(self.case, self.inputs), self.actual)

    def judge(self, reference: common.Arrays, actual: common.Arrays) -> common.Ratios:
        return common.ratios(self.case, self.inputs, reference, actual, self.failing)

    def explained(self, fixed: common.Ratios) -> tuple[str, bool]:
        return f"as-is {self.as_is} with-cause {fixed}", common.explains(self.as_is, fixed)


def exact_sum(run: Rerun) -> tuple[str, bool]:
    """The adapter's outputs against the oracle of the unrounded sum."""
    return run.explained(run.judge(common.expected(run.case, run.inputs, norm_input="exact"), run.actual))


def one_pass(run: Rerun) -> tuple[str, bool]:
    """The two-pass rerun (use_fast_variance=False) against the case's oracle."""
    two_pass = common.flax_two_pass(run.case, run.inputs, grad=run.grad)
    return run.explained(run.judge(common.expected(run.case, run.inputs), two_pass))


def both(run: Rerun) -> tuple[str, bool]:
    """The two-pass rerun against the oracle of the unrounded sum."""
    two_pass = common.flax_two_pass(run.case, run.inputs, grad=run.grad)
    return run.explained(run.judge(common.expected(run.case, run.inputs, norm_input="exact"), two_pass))


def float64(run: Rerun) -> tuple[str, bool]:
    return common.float64_as_float32(run.chosen, run.case, run.inputs, run.actual, run.failing, grad=run.grad)


CAUSES: dict[str, dict[str, Callable[[Rerun], tuple[str, bool]]]] = {
    "flax": {"exact_sum": exact_sum, "one_pass": one_pass, "one_pass+exact_sum": both},
    "keras": {"float64": float64},
    "keras-jax": {"exact_sum": exact_sum, "float64": float64},
}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("backend", choices=tuple(CAUSES))
    parser.add_argument("--excess-precision-off", action="store_true", help=f"rerun with XLA_FLAGS={OFF}")
    return parser.parse_args()


def open_backend(name: str, excess_precision_off: bool) -> Backend:
    """The backend, in this process: XLA reads XLA_FLAGS once, when it starts, so it is set first."""
    if excess_precision_off:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {OFF}".strip()
    return common.keras_here(name) if name in common.KERAS_BACKENDS else common.backend(name)


def ours(record: Result, reasons: dict[int, str]) -> bool:
    """A failure, or a known deviation whose every entry cites this script (the other entries of the
    add ops, e.g. Keras' autocast float32 scale, have their own verification)."""
    if not common.failing(record):
        return False
    if record.outcome == "failed":
        return True
    return all(Path(__file__).name in reasons.get(i, "") for i in record.ledger_entries)


def reasons(path: str) -> dict[int, str]:
    """The reason of each ledger entry the run used, by index."""
    entries = results_records.read_results(path).header.ledger_entries or ()
    return {e.index: e.reason for e in entries}


def verify(chosen: Backend, record: Result, excess_precision_off: bool) -> Iterator[common.Finding]:
    run = Rerun(chosen, record)
    if excess_precision_off:
        # The flag removes the cause: the record's failing outputs must pass as they are.
        yield common.Finding(record, "excess_precision_off", common.passes(run.as_is), f"as-is {run.as_is}")
        return
    for cause, check in CAUSES[record.backend].items():
        detail, ok = check(run)
        yield common.Finding(record, cause, ok, detail)
        if ok:
            return


def findings(results: str, name: str, excess_precision_off: bool) -> Iterator[common.Finding]:
    chosen = open_backend(name, excess_precision_off)
    cited = reasons(results)
    for record in common.records([results], backends=lambda found: found == name, ops=ADD_OPS):
        if ours(record, cited):
            yield from verify(chosen, record, excess_precision_off)


def main() -> None:
    args = parse()
    common.report(findings(args.results, args.backend, args.excess_precision_off))


if __name__ == "__main__":
    main()
