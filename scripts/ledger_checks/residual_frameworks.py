"""Verify the suspected cause of every flax / keras / keras-jax failure of the fused residual ops
(add_rms_norm, add_layer_norm) in a results file by recomputing with that cause.

Usage (from /work/main), once per backend, in process (the script sets KERAS_BACKEND itself):

  .venv/bin/python scripts/ledger_checks/residual_frameworks.py RESULTS.jsonl flax
  .venv/bin/python scripts/ledger_checks/residual_frameworks.py RESULTS.jsonl keras
  .venv/bin/python scripts/ledger_checks/residual_frameworks.py RESULTS.jsonl keras-jax
  ... RESULTS.jsonl flax --excess-precision-off    (also keras-jax)

It reads the failed records and the xfailed ones whose ledger entries cite this script, so a run with
the shipped ledger, or with these entries in it, will do.

Causes, tried in order; the first under which every failing output passes is printed:
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
import json
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from conformance import oracle
from conformance.adapter.backend import Unsupported
from conformance.judging import tolerances
from conformance.judging.verdict import compare_outputs
from conformance.model.case import Case
from conformance.model.dtypes import round_to
from conformance.model.inputs import make_inputs

KERAS_BACKENDS = {"keras": "torch", "keras-jax": "jax"}
OFF = "--xla_allow_excess_precision=false"
ADD_OPS = ("add_rms_norm", "add_layer_norm")
Arrays = Mapping[str, np.ndarray]
Ratios = dict[str, float]
# (case, inputs, the adapter's outputs, the failing outputs, grad) -> (ratios under the cause, explained)
Cause = Callable[[Case, Arrays, Arrays, Collection[str], bool], tuple[Ratios, bool]]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("backend", choices=("flax", *KERAS_BACKENDS))
    parser.add_argument("--excess-precision-off", action="store_true", help=f"rerun with XLA_FLAGS={OFF}")
    return parser.parse_args()


def environment(args: argparse.Namespace) -> None:
    """Before anything imports keras or starts XLA (the backends are imported after it): both read
    their settings once."""
    if args.backend in KERAS_BACKENDS:
        os.environ["KERAS_BACKEND"] = KERAS_BACKENDS[args.backend]
    if args.excess_precision_off:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {OFF}".strip()


def passes(ratios: Ratios, failing: Collection[str]) -> bool:
    return all(ratios[o] <= 1 for o in failing)


class Checker:
    """Reruns one backend's cases and compares them with the oracle under each suspected cause."""

    def __init__(self, name: str) -> None:
        from backends.flax import linen as flax_linen
        from backends.keras import layers as keras_layers

        self.table = tolerances.read_tolerances()
        made: dict[str, Callable[[], Any]] = {
            "flax": flax_linen.FlaxLinen,
            "keras": keras_layers.KerasTorch,
            "keras-jax": keras_layers.KerasJax,
        }
        self.backend = made[name]()
        causes: dict[str, dict[str, Cause]] = {
            "flax": {"exact_sum": self.exact_sum, "one_pass": self.one_pass, "one_pass+exact_sum": self.both},
            "keras": {"float64": self.float64},
            "keras-jax": {"exact_sum": self.exact_sum, "float64": self.float64},
        }
        self.causes = causes[name]

    def outputs(self, case: Case, inputs: Arrays, grad: bool, backend: Any = None) -> dict[str, np.ndarray]:
        given = inputs if grad else {k: v for k, v in inputs.items() if k not in ("dy", "dresidual_out")}
        prepared = (backend or self.backend).prepare(case, given, grad=grad)
        prepared()
        prepared.synchronize()
        return dict(prepared.outputs())

    def ratios(
        self, case: Case, inputs: Arrays, expected: Arrays, actual: Arrays, names: Collection[str]
    ) -> Ratios:
        found = compare_outputs(case, inputs, expected, actual, tuple(names), self.table)
        return {c.output: round(float(c.worst_ratio), 3) for c in found}

    def oracle(self, case: Case, inputs: Arrays, norm_input: str | None = None) -> dict[str, np.ndarray]:
        return oracle.evaluate(replace(case, norm_input=norm_input or case.norm_input), inputs, grad=True)

    # ------------------------------------------------------------------ the causes
    def exact_sum(
        self, case: Case, inputs: Arrays, actual: Arrays, failing: Collection[str], grad: bool
    ) -> tuple[Ratios, bool]:
        fixed = self.ratios(case, inputs, self.oracle(case, inputs, "exact"), actual, failing)
        return fixed, passes(fixed, failing)

    def _two_pass(self, case: Case, inputs: Arrays, grad: bool) -> dict[str, np.ndarray]:
        from backends.flax import linen as flax_linen

        original = dict(flax_linen.MODULES)

        def two_pass(op: str) -> Callable[[Any], Any]:
            return lambda spec: original[op](spec).clone(use_fast_variance=False)

        try:
            flax_linen.MODULES.update({op: two_pass(op) for op in ADD_OPS})
            return self.outputs(case, inputs, grad, flax_linen.FlaxLinen())  # a fresh executable cache
        finally:
            flax_linen.MODULES.update(original)

    def one_pass(
        self, case: Case, inputs: Arrays, actual: Arrays, failing: Collection[str], grad: bool
    ) -> tuple[Ratios, bool]:
        fixed = self.ratios(
            case, inputs, self.oracle(case, inputs), self._two_pass(case, inputs, grad), failing
        )
        return fixed, passes(fixed, failing)

    def both(
        self, case: Case, inputs: Arrays, actual: Arrays, failing: Collection[str], grad: bool
    ) -> tuple[Ratios, bool]:
        out = self._two_pass(case, inputs, grad)
        fixed = self.ratios(case, inputs, self.oracle(case, inputs, "exact"), out, failing)
        return fixed, passes(fixed, failing)

    def float64(
        self, case: Case, inputs: Arrays, actual: Arrays, failing: Collection[str], grad: bool
    ) -> tuple[Ratios, bool]:
        if case.dtype != "float64":
            return {}, False
        narrow = replace(case, dtype="float32")
        narrow_inputs = {k: round_to(v, "float32") for k, v in inputs.items()}
        try:
            out = self.outputs(narrow, narrow_inputs, grad)
        except Unsupported:  # Gemma's 1 + w, exact in float64, is not in float32: no float32 twin
            out = {}
        if out and all(np.array_equal(actual[o], out[o].astype(np.float64), equal_nan=True) for o in failing):
            return {o: 0.0 for o in failing}, True
        read = {k: v.astype(np.float32) for k, v in actual.items()}
        as32 = self.ratios(narrow, narrow_inputs, self.oracle(narrow, narrow_inputs), read, failing)
        return as32, passes(as32, failing)


def failing_outputs(record: Mapping[str, Any]) -> dict[str, float]:
    ratio = {c["output"]: c["worst_ratio"] for c in record["comparisons"]}
    return {o: float(r) for o, r in ratio.items() if r in ("inf", "nan") or float(r) > 1}


def ours(record: Mapping[str, Any], reasons: Mapping[int, str]) -> bool:
    """A failure, or a known deviation whose every entry cites this script (the other entries of the
    add ops, e.g. Keras' autocast float32 scale, have their own verification)."""
    if record["outcome"] == "failed":
        return True
    cited = {c.get("ledger") for c in record["comparisons"] if c.get("ledger") is not None}
    return record["outcome"] == "xfailed" and all(Path(__file__).name in reasons[i] for i in cited)


def main() -> None:
    args = parse()
    environment(args)
    checker = Checker(args.backend)
    records = [json.loads(line) for line in Path(args.results).read_text().splitlines()]
    header = next(r for r in records if r.get("kind") == "header")
    reasons = {e["index"]: e["reason"] for e in header["ledger"]["entries"]}
    explained = total = 0
    for r in records:
        if r.get("kind") != "result" or r["backend"] != args.backend or r["case"]["op"] not in ADD_OPS:
            continue
        failing = failing_outputs(r) if r.get("comparisons") else {}
        if not failing or not ours(r, reasons):
            continue
        case = Case.from_dict(r["case"])
        grad = r["check"] == "backward"
        inputs = make_inputs(case, grad=True)
        actual = checker.outputs(case, inputs, grad)
        as_is = checker.ratios(case, inputs, checker.oracle(case, inputs), actual, failing)
        tried: dict[str, Ratios] = {}
        verdict = "NOT EXPLAINED"
        if args.excess_precision_off:
            verdict = "PASSES" if passes(as_is, failing) else "STILL FAILS"
        else:
            for cause, check in checker.causes.items():
                tried[cause], ok = check(case, inputs, actual, failing, grad)
                if ok:
                    verdict = f"OK {cause}"
                    break
        total += 1
        explained += verdict.startswith(("OK", "PASSES"))
        print(f"{r['check']:8s} {case.id:62s} failing={failing} as-is={as_is} with-cause={tried} {verdict}")
    print(f"{explained}/{total} {'pass with ' + OFF if args.excess_precision_off else 'explained'}")


if __name__ == "__main__":
    main()
