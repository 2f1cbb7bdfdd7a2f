"""A pytest plugin that ``normconf run`` loads (``-p conformance.cli.progress``) to follow a run.

In the process that sees every report (the xdist controller, or the single process) it writes one
JSON line per event to the file descriptor named by ``NORMCONF_PROGRESS_FD``: the number of tests
once collected, then each finished test's outcome. Without that variable it does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import pytest

from conformance.running.outcomes import SKIPPING
from conformance.running.plugin import recorded

ENV = "NORMCONF_PROGRESS_FD"


def pytest_configure(config: pytest.Config) -> None:
    fd = os.environ.get(ENV)
    if fd is not None and fd.isdigit() and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Progress(int(fd)), "normconf-progress")


class Progress:
    """Writes ``{"total": n}`` once and ``{"done": nodeid, "outcome": ...}`` per finished test."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.outcomes: dict[str, str] = {}
        self.announced = False

    def emit(self, event: dict[str, Any]) -> None:
        # The reader may have gone away (an interrupted CLI); the run itself must not fail for it.
        with contextlib.suppress(OSError):
            os.write(self.fd, (json.dumps(event) + "\n").encode())

    def total(self, count: int) -> None:
        if not self.announced:
            self.announced = True
            self.emit({"total": count})

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items:
            self.total(len(session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        # Every worker collects the whole (sharded) suite; the first one tells the total.
        self.total(len(ids))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if hasattr(report, "wasxfail"):
                outcome = "xfailed"
            elif report.failed and report.when == "setup":
                outcome = "error"
            else:
                outcome = _recorded(report) or report.outcome
            self.outcomes[report.nodeid] = outcome
        elif report.when == "teardown":
            outcome = self.outcomes.pop(report.nodeid, "error" if report.failed else "passed")
            self.emit({"done": report.nodeid, "outcome": outcome})


def _recorded(report: pytest.TestReport) -> str | None:
    """The suite's own outcome of a skipped test where it records one: "unsupported" (the backend
    declared it cannot run the case) is told apart from "skipped", as the summary table does."""
    if not report.skipped:
        return None
    record = recorded(report)
    if record is not None and record.get("outcome") in SKIPPING:
        return str(record["outcome"])
    return None
