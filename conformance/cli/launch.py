"""``normconf run``'s engine: pytest in a subprocess, followed through the progress plugin.

pytest's own output goes to a log file in the output folder; the terminal shows a progress bar
(or, in CI and when not a terminal, a plain line every tenth of the run) and the summary table.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from conformance.cli.progress import ENV

# The conformance package: `normconf run` points pytest at it wherever it is installed.
SUITE = Path(__file__).resolve().parents[1]
BENCH = SUITE / "bench"
SHOWN = ("passed", "failed", "xfailed", "unsupported", "skipped", "error")


@dataclass
class Display:
    """Progress shown as an updating bar (``bar``) or as plain lines at each tenth (``lines``)."""

    out: TextIO
    bar: bool
    total: int = 0
    done: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    start: float = field(default_factory=time.monotonic)
    shown_tenth: int = -1

    def event(self, event: dict[str, object]) -> None:
        if "total" in event:
            self.total = int(str(event["total"]))
            self.line(f"normconf: {self.total} tests")
        elif "done" in event:
            self.done += 1
            self.counts[str(event.get("outcome", "?"))] += 1
            self.update()

    def status(self) -> str:
        counts = " ".join(f"{o} {self.counts[o]}" for o in SHOWN if self.counts[o])
        pct = f" {100 * self.done // self.total}%" if self.total else ""
        return f"{self.done}/{self.total or '?'}{pct}  {counts}  {time.monotonic() - self.start:.0f}s"

    def update(self) -> None:
        if self.bar:
            width = 30
            filled = width * self.done // self.total if self.total else 0
            self.out.write(f"\r[{'#' * filled}{'-' * (width - filled)}] {self.status()}\x1b[K")
            self.out.flush()
            return
        tenth = 10 * self.done // self.total if self.total else -1
        if tenth > self.shown_tenth or (not self.total and self.done % 500 == 0):
            self.shown_tenth = tenth
            self.line(f"normconf: {self.status()}")

    def line(self, text: str) -> None:
        if self.bar:
            self.out.write("\r\x1b[K")
        self.out.write(text + "\n")
        self.out.flush()

    def finish(self) -> None:
        if self.bar and self.done:
            self.out.write("\n")
        elif not self.bar and self.shown_tenth < 10 and self.done:
            self.line(f"normconf: {self.status()}")


def use_bar(out: TextIO) -> bool:
    """A bar on an interactive terminal; plain lines in CI (the CI variable) or when redirected."""
    return out.isatty() and not os.environ.get("CI")


def _own_environment() -> dict[str, str]:
    """This process's environment without what a surrounding pytest-xdist worker set: the child is
    its own session (pytest-benchmark, for one, turns itself off where it sees an xdist worker)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}


def run_pytest(args: Sequence[str], log: Path, on_event: Callable[[dict[str, object]], None]) -> int:
    """Run ``python -m pytest ARGS -p conformance.cli.progress``, pytest's output into ``log``."""
    command = [sys.executable, "-m", "pytest", *args, "-p", "conformance.cli.progress"]
    log.parent.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as events, log.open("w") as sink:
        sink.write("$ " + shlex.join(command) + "\n")
        sink.flush()
        try:
            process = subprocess.Popen(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**_own_environment(), ENV: str(write_fd)},
                pass_fds=(write_fd,),
            )
        finally:
            # Only the child writes; the pipe ends (EOF) when pytest and anything it spawned exit.
            os.close(write_fd)
        try:
            for raw in events:
                try:
                    on_event(json.loads(raw))
                except json.JSONDecodeError:
                    continue
        except BaseException:
            # Our reader went away (a closed pipe, ^C): end pytest rather than leave it running.
            process.terminate()
            process.wait()
            raise
        return process.wait()


def failed_start(status: int, log: Path) -> int:
    """pytest stopped before running anything: its error lines from the log; 2 for a usage error."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    errors = [line for line in lines if "error" in line.lower()] or lines[-15:]
    for line in errors[-15:]:
        print(line, file=sys.stderr)
    print(f"normconf: pytest exited with status {status} and wrote no results; see {log}", file=sys.stderr)
    return 2 if status in (4, 5) else 1
