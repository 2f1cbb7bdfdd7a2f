"""Verify the rsqrt-underflow entries of the fused residual ops (add_rms_norm, add_layer_norm) of
torch-nn, torch-functional, torch-compile, hf-*, keras, keras-jax and flax.

On `large` rows (|h| ~ 5e17 in float32 and bfloat16, 1e150 in float64) the derivative of rsqrt(v) that
autograd or the kernel forms (rstd**3, or -rsqrt(v) / (2 v) under JAX) underflows, and dL/dh loses the
variance-path term of the norm's gradient. For every failed or xfailed backward record of a `large`
add-op case in the given results files, rerun the backend and compare dx and dresidual with the oracle
and with dL/dh recomputed without that term:

    RMSNorm:   rstd * g + dresidual_out             (g = scale * dy)
    LayerNorm: rstd * (g - mean(g)) + dresidual_out

The cause is confirmed when the backend passes against the second (worst_ratio <= 1) and not the first.

Usage: .venv/bin/python scripts/ledger_checks/residual_rsqrt.py RESULTS.jsonl...   (from the repository root)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from conformance import oracle
from conformance.adapter import registry
from conformance.judging import tolerances
from conformance.judging.verdict import compare_outputs
from conformance.model import residual
from conformance.model.case import ADD_OPS, Case
from conformance.model.inputs import make_inputs

TABLE = tolerances.read_tolerances()
GRADS = ("dx", "dresidual")


def without_variance_term(case: Case, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dL/dh with the norm's gradient reduced to its rstd-scaled term (activation shape, float64)."""
    n = int(np.prod(case.param_shape))
    h = residual.normalized(case, inputs).reshape(-1, n)
    if case.op == "add_layer_norm":
        h = h - h.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt((h * h).mean(axis=1, keepdims=True) + case.eps)
    scale = np.asarray(inputs["weight"], np.float64).reshape(1, n) if case.weight else 1.0
    scale = scale + case.weight_offset
    g = np.asarray(inputs["dy"], np.float64).reshape(-1, n) * scale
    if case.op == "add_layer_norm":
        g = g - g.mean(axis=1, keepdims=True)
    dnorm = rstd * g
    return (dnorm + np.asarray(inputs["dresidual_out"], np.float64).reshape(-1, n)).reshape(case.shape)


def main(paths: list[str]) -> None:
    backends = registry.entries()
    seen: set[tuple[str, str]] = set()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            if (
                r.get("kind") != "result"
                or r["check"] != "backward"
                or r["outcome"] not in ("failed", "xfailed")
            ):
                continue
            case = Case.from_dict(r["case"])
            if case.op not in ADD_OPS or case.dist != "large" or (r["backend"], case.id) in seen:
                continue
            seen.add((r["backend"], case.id))
            inputs = make_inputs(case, grad=True)
            prepared = backends[r["backend"]].load().prepare(case, inputs, grad=True)
            prepared()
            actual = dict(prepared.outputs())
            expected = oracle.evaluate(case, inputs, grad=True)
            oracle_ratio = {
                c.output: c.worst_ratio for c in compare_outputs(case, inputs, expected, actual, GRADS, TABLE)
            }
            dropped = without_variance_term(case, inputs)
            variant = {**expected, "dx": dropped, "dresidual": dropped}
            variant_ratio = {
                c.output: c.worst_ratio for c in compare_outputs(case, inputs, variant, actual, GRADS, TABLE)
            }
            confirmed = all(v <= 1.0 for v in variant_ratio.values()) and any(
                v > 1 for v in oracle_ratio.values()
            )
            fmt = lambda d: " ".join(f"{k} {v:.3g}" for k, v in d.items())  # noqa: E731
            print(
                f"{r['backend']:16s} {case.id:52s} oracle: {fmt(oracle_ratio)} | without the variance term: "
                f"{fmt(variant_ratio)} | {'confirmed' if confirmed else 'NOT confirmed'}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
