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


@pytest.fixture
def suite(tmp_path: Path) -> Any:
    def run(*args: str, **kwargs: Any) -> SuiteRun:
        return run_suite(tmp_path, *args, **kwargs)

    return run
