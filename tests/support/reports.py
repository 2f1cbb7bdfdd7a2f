"""Small hand-made results files for the report and CLI tests (no backend runs).

Records are written in the current schema by default; ``schema=1`` writes the form schema 1 files
had (no summary, ledger entry or rule fields: those lived only in the text), for the legacy reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conformance.results.schema import SCHEMA_VERSION
from conformance.results.text import summary_of

from support.suite import TESTS

EVIL = "layer_norm-<script>window.__pwned = 1</script>-x"
BENCH_SMALL = TESTS / "data" / "bench_small.json"
OUTPUTS = {
    "forward": ("y", "residual_out"),
    "backward": ("dx", "dweight", "dbias"),
    "training": ("running_mean", "running_var"),
}


def case(op: str = "layer_norm", dtype: str = "float32", eps: float = 1e-5, **extra: Any) -> dict[str, Any]:
    fields = {
        "op": op,
        "shape": [4, 8],
        "dtype": dtype,
        "eps": eps,
        "param_dtype": None,
        "norm_ndim": 1,
        "weight": True,
        "bias": op in ("layer_norm", "batch_norm"),
        "weight_offset": 0.0,
        "training": False,
        "momentum": 0.1,
        "dist": "normal",
        "seed": 0,
        **extra,
    }
    fields.setdefault("id", f"{op}-{dtype}-4x8-eps{eps!r}-{fields['dist']}")
    return fields


def comparison(
    output: str = "y", worst_ratio: Any = 0.25, ledger: int | None = None, schema: int = 2
) -> dict:
    index = [o for names in OUTPUTS.values() for o in names].index(output)
    source = f"rule[{index}] output={output}"
    current = {
        "ledger": ledger,
        "rule": index,
        "keys": {"output": output, "dtype": "float32"},
        "file": "tolerances.toml",
    }
    record = {
        "output": output,
        "numel": 32,
        "mismatched": 0 if worst_ratio != "inf" and float(worst_ratio) <= 1 else 3,
        "max_abs": 1e-7,
        "max_rel": 1e-7,
        "max_ulp": 1.0,
        "worst_ratio": worst_ratio,
        "worst_index": [0, 1],
        "tolerance": {
            "rtol": 2e-6,
            "atol": 2e-6,
            "cond": 16.0,
            "source": f"tolerances.toml {source} dtype=float32",
            "why": "float32 statistics: ~10 roundings",
        },
        "problem": "",
    }
    if schema == 1:
        return record
    return {
        **record,
        "ledger": current["ledger"],
        "tolerance": {**record["tolerance"], **{k: current[k] for k in ("rule", "keys", "file")}},
    }


def result(
    backend: str,
    the_case: dict[str, Any],
    check: str = "forward",
    outcome: str = "passed",
    ratios: tuple[Any, ...] = (0.25,),
    reason: str = "",
    ledger: int | None = None,
    schema: int = 2,
) -> dict[str, Any]:
    """``ledger``: the ledger entry the record's compared outputs cite (xfailed, xpassed)."""
    compared = outcome in ("passed", "failed", "xfailed", "xpassed")
    outputs = OUTPUTS.get(check, ("y",))
    record = {
        "kind": "result",
        "backend": backend,
        "case": the_case,
        "check": check,
        "outcome": outcome,
        "reason": reason,
        "comparisons": [comparison(outputs[i], r, ledger, schema) for i, r in enumerate(ratios)]
        if compared and check in OUTPUTS
        else [],
        "duration_s": 0.001,
        "reproduce": f"pytest 'conformance/suite/test_{check}.py::test_{check}[{backend}:{the_case['id']}]'",
    }
    return record if schema == 1 else {**record, "summary": summary_of(reason)}


CHECKS = ["forward", "backward", "training", "inputs_unchanged", "aliasing", "determinism"]


def header(schema: int = SCHEMA_VERSION, **extra: Any) -> dict[str, Any]:
    current = {"checks": CHECKS} if schema != 1 else {}
    return {
        "kind": "header",
        "schema": schema,
        **current,
        "time": "2026-01-01T00:00:00+00:00",
        "environment": {
            "machine": "x86_64",
            "platform": "Linux",
            "processor": "test cpu",
            "cpu_count": 2,
            "python": "3.11",
            "packages": {"numpy": "2.0", "torch": None},
            "git_commit": "abc123",
        },
        "profile": "smoke",
        "cases_file": None,
        "backends": {
            "alpha": {
                "ops": ["layer_norm"],
                "dtypes": ["float32"],
                "features": ["backward"],
                "device": "cpu",
            },
            "beta": {
                "ops": ["layer_norm", "rms_norm"],
                "dtypes": ["float32"],
                "features": [],
                "device": "cpu",
            },
        },
        "tolerances": {"path": "/nowhere/tolerances.toml", "sha256": "0" * 64},
        "ledger": {"path": "/nowhere/ledger.toml", "sha256": "1" * 64},
        "exitstatus": 1,
        **extra,
    }


def write(
    path: Path, records: list[dict[str, Any]], schema: int = SCHEMA_VERSION, **header_extra: Any
) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in [header(schema, **header_extra), *records]))
    return path


def standard_records(schema: int = SCHEMA_VERSION) -> list[dict[str, Any]]:
    """Two backends, two ops: passes, one failure, one xfailed (ledger 0), one unsupported, the evil id."""
    ln = case()
    rms = case("rms_norm", bias=False)
    evil = case(id=EVIL)
    failure_text = (
        f"beta {ln['id']} [backward]\noutput 'dx' out of tolerance\n  worst at index (1, 2): <b>bold</b>\n"
        "  reproduce: pytest x"
    )
    unsupported = "op=rms_norm not in declared ops ['layer_norm']"
    return [
        result("alpha", ln, schema=schema),
        result("alpha", ln, "backward", ratios=(0.5, 0.1), schema=schema),
        result("alpha", rms, outcome="unsupported", reason=unsupported, schema=schema),
        result("beta", ln, schema=schema),
        result("beta", ln, "backward", "failed", ratios=(3.5, 0.2), reason=failure_text, schema=schema),
        result(
            "beta",
            rms,
            "forward",
            "xfailed",
            (2.0,),
            "y: known (ledger deviation[0])",
            ledger=0,
            schema=schema,
        ),
        result(
            "beta", evil, "forward", "failed", ("inf",), f"beta {EVIL} [forward]\nbad <script>", schema=schema
        ),
    ]


def ci_sized_records(
    backends: tuple[str, ...] = ("torch-eager", "torch-functional", "torch-nn"),
) -> list[dict]:
    """Records shaped like the ci profile over the CPU backends (every case x check), without running."""
    from conformance.model import profiles
    from conformance.running import checks

    records = []
    for i, c in enumerate(profiles.cases("ci")):
        for backend in backends:
            for check, spec in checks.CHECKS.items():
                if not spec.applies(c):
                    continue
                outcome = "failed" if (i * 7 + len(backend)) % 997 == 0 else "passed"
                reason = f"{backend} {c.id} [{check}]\noutput 'y' out of tolerance\n" + "  details\n" * 6
                ratios = (0.3, 0.01) if check in ("forward", "backward") else ()
                records.append(
                    result(
                        backend,
                        c.to_dict(),
                        check,
                        outcome,
                        ratios or (0.1,),
                        reason if outcome == "failed" else "",
                    )
                )
    return records


def fingerprint(
    backend: str, question: str, answer: str, reference: str, evidence: dict[str, float] | None = None
) -> dict[str, Any]:
    """A fingerprint record: ``answer`` matched, with the error under each hypothesis."""
    errors = evidence or {answer: 0.0, "other": 0.5}
    return {
        "kind": "fingerprint",
        "backend": backend,
        "question": question,
        "outcome": "answered",
        "answer": answer,
        "matched": True,
        "reference": reference,
        "evidence": errors,
        "metric": "rel",
        "noise": 1e-6,
        "probe": "probe-id",
        "probe_case": {},
        "reason": "",
        "duration_s": 0.01,
    }


def property_record(
    backend: str, name: str, outcome: str = "passed", counterexample: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "kind": "property",
        "backend": backend,
        "property": name,
        "outcome": outcome,
        "reason": "relation broken on the counterexample" if counterexample else "",
        "examples": 25,
        "worst_ratio": 3.5 if counterexample else 0.2,
        "bitwise": counterexample is None,
        "counterexample": counterexample,
        "duration_s": 0.5,
    }


def convention_records(eps_of_beta: str = "inside-sqrt") -> list[dict[str, Any]]:
    """alpha answers as the reference; beta puts eps outside the root (or as given) and fails a property."""
    return [
        fingerprint("alpha", "rms_norm.eps", "inside-sqrt", "inside-sqrt"),
        fingerprint(
            "beta", "rms_norm.eps", eps_of_beta, "inside-sqrt", {eps_of_beta: 0.0, "inside-sqrt": 0.3}
        ),
        fingerprint("alpha", "layer_norm.variance", "biased", "biased"),
        property_record("alpha", "row_independence"),
        property_record("beta", "row_independence", "failed", {"op": "rms_norm", "rows": 2, "features": 8}),
    ]
