"""Running ``pytest conformance`` in a subprocess, as a user would, with the fakes of tests/fakes loadable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The repository root, and tests/ (the folder that holds the fakes and support packages).
ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


@dataclass
class SuiteRun:
    returncode: int
    output: str
    results: Path

    @property
    def header(self) -> dict[str, Any]:
        return json.loads(self.results.read_text().splitlines()[0])

    @property
    def all_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.results.read_text().splitlines()[1:]]

    @property
    def records(self) -> list[dict[str, Any]]:
        """The per-case check results (``kind: "result"``)."""
        return self.kind("result")

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.all_records if r.get("kind") == kind]

    def outcomes(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self.records:
            counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
        return counts


def run_suite(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> SuiteRun:
    """Run ``python -m pytest conformance <args>`` from the repository root with the fakes loadable."""
    results = tmp_path / "results.jsonl"
    extra = dict(env or {})
    paths = [extra.pop("PYTHONPATH", ""), str(TESTS), os.environ.get("PYTHONPATH", "")]
    full_env = {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "conformance",
        "-p",
        "fakes.core",
        "-p",
        "no:cacheprovider",
    ]
    if not any(a.startswith("--results") for a in args):
        command += ["--results", str(results)]
    done = subprocess.run(
        [*command, *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return SuiteRun(done.returncode, done.stdout + done.stderr, results)
