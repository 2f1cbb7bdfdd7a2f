"""Ledger files for the tests of ledger models: one entry naming a model, written where a run can read it."""

from __future__ import annotations

from pathlib import Path

ARGS = ("-p", "fakes.ledger", "--dtype", "float64", "--op", "batch_norm,layer_norm")
CHECKS = ("-k", "test_forward or test_backward")


def entry(backends: str, model: str = 'model = "eps_float32"', extra: str = "") -> str:
    return (
        f'[[deviation]]\nbackend = [{backends}]\ncheck = ["forward", "backward"]\n'
        f'output = ["y", "dx", "dweight"]\ndtype = "float64"\n{model}\n{extra}reason = "eps-float32"\n\n'
        '[reasons.eps-float32]\ntext = "eps is rounded to float32 before use"\n'
    )


def ledger_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "mine.toml"
    path.write_text(body)
    return str(path)
