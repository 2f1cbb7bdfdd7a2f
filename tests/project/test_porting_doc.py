"""docs/porting.md's conventions table is what a fingerprint run of every backend gives on this machine.

The table is generated (``make porting``); this test regenerates it and compares, so the page cannot
drift from the adapters. It needs every framework backend installed (the ``frameworks`` extra).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.suite import ROOT

for module in ("jax", "flax", "keras", "openvino", "transformers", "onnxruntime", "triton", "torch"):
    pytest.importorskip(module)


@pytest.mark.heavy(180)
def test_the_conventions_table_is_regenerated_from_a_real_run() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/porting_table.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def test_the_table_markers_are_there_and_filled() -> None:
    page = (ROOT / "docs" / "porting.md").read_text(encoding="utf-8")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import porting_table
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    body = page.split(porting_table.BEGIN, 1)[1].split(porting_table.END, 1)[0]
    assert "| question |" in body and "hf-llama" in body and "flax" in body
