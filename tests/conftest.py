"""Fixtures shared by every test folder. Helpers live in tests/support, the fake backends in tests/fakes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.suite import SuiteRun, run_suite


@pytest.fixture
def suite(tmp_path: Path) -> Any:
    def run(*args: str, **kwargs: Any) -> SuiteRun:
        return run_suite(tmp_path, *args, **kwargs)

    return run
