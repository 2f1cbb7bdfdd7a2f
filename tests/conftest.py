"""Fixtures shared by every test folder. Helpers live in tests/support, the fake backends in tests/fakes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from conformance.adapter import cache

from support.suite import SuiteRun, run_suite

# The tests are hermetic: no graph cache carries exports or compiles from one test (or run) to the
# next; the tests of the cache give theirs a folder of their own.
os.environ[cache.VARIABLE] = cache.OFF


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "heavy(seconds=0): takes tens of seconds on a 2-core machine (a subprocess run of the suite, a"
        " build, a walk of a whole profile); run first, the longest (its seconds there) first, so a"
        " parallel run does not end on one worker finishing it",
    )
    # make test and tox deal these tests out by module (the Makefile's TEST_DIST: xdist's loadfile in
    # collection order): a module's fixtures are built on one worker, the heavy tests' modules first.


def _heaviness(item: pytest.Item) -> tuple[bool, float]:
    marker = item.get_closest_marker("heavy")
    if marker is None:
        return True, 0.0
    return False, -float(marker.args[0] if marker.args else 0.0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heavy tests first, longest first; the others in their collected order (a stable sort)."""
    items.sort(key=_heaviness)


@pytest.fixture
def suite(tmp_path: Path) -> Any:
    def run(*args: str, **kwargs: Any) -> SuiteRun:
        return run_suite(tmp_path, *args, **kwargs)

    return run
