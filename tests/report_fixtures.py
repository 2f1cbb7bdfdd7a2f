"""Small hand-made results files for the report and CLI tests (no backend runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conformance.results import SCHEMA_VERSION

EVIL = "layer_norm-<script>window.__pwned = 1</script>-x"
BENCH_SMALL = Path(__file__).parent / "data" / "bench_small.json"
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


def comparison(output: str = "y", worst_ratio: Any = 0.25) -> dict:
    index = [o for names in OUTPUTS.values() for o in names].index(output)
    source = f"rule[{index}] output={output}"
    return {
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


def result(
    backend: str,
    the_case: dict[str, Any],
    check: str = "forward",
    outcome: str = "passed",
    ratios: tuple[Any, ...] = (0.25,),
    reason: str = "",
) -> dict[str, Any]:
    compared = outcome in ("passed", "failed", "xfailed", "xpassed")
    return {
        "kind": "result",
        "backend": backend,
        "case": the_case,
        "check": check,
        "outcome": outcome,
        "reason": reason,
        "comparisons": [comparison(OUTPUTS.get(check, ("y",))[i], r) for i, r in enumerate(ratios)]
        if compared and check in OUTPUTS
        else [],
        "duration_s": 0.001,
        "reproduce": f"pytest 'conformance/suite/test_{check}.py::test_{check}[{backend}:{the_case['id']}]'",
    }


def header(**extra: Any) -> dict[str, Any]:
    return {
        "kind": "header",
        "schema": SCHEMA_VERSION,
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


def write(path: Path, records: list[dict[str, Any]], **header_extra: Any) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in [header(**header_extra), *records]))
    return path


def standard_records() -> list[dict[str, Any]]:
    """Two backends, two ops: passes, one failure, one xfailed (ledger 0), one unsupported, the evil id."""
    ln = case()
    rms = case("rms_norm", bias=False)
    evil = case(id=EVIL)
    failure_text = (
        f"beta {ln['id']} [backward]\noutput 'dx' out of tolerance\n  worst at index (1, 2): <b>bold</b>\n"
        "  reproduce: pytest x"
    )
    return [
        result("alpha", ln),
        result("alpha", ln, "backward", ratios=(0.5, 0.1)),
        result("alpha", rms, outcome="unsupported", reason="op=rms_norm not in declared ops ['layer_norm']"),
        result("beta", ln),
        result("beta", ln, "backward", "failed", ratios=(3.5, 0.2), reason=failure_text),
        result("beta", rms, "forward", "xfailed", ratios=(2.0,), reason="y: known (ledger deviation[0])"),
        result(
            "beta", evil, "forward", "failed", ratios=("inf",), reason=f"beta {EVIL} [forward]\nbad <script>"
        ),
    ]


def ci_sized_records(
    backends: tuple[str, ...] = ("torch-eager", "torch-functional", "torch-nn"),
) -> list[dict]:
    """Records shaped like the ci profile over the CPU backends (every case x check), without running."""
    from conformance import checks, profiles

    records = []
    for i, c in enumerate(profiles.cases("ci")):
        for backend in backends:
            for check in checks.CHECK_NAMES:
                if not checks.APPLIES[check](c):
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
