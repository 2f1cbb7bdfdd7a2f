"""What every record kind of a results file shares: the schema version, the outcomes, the error a bad
file raises and the field readers that name the field at fault."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 2
# Versions ``read_results`` reads: the current one, and 1 through conformance.results.legacy.
READABLE: tuple[int, ...] = (1, 2)
OUTCOMES: tuple[str, ...] = ("passed", "failed", "skipped", "unsupported", "xfailed", "xpassed", "error")


class SchemaError(ValueError):
    """A results file is unreadable, corrupt, or of another schema version."""


def jsonable(value: float) -> float | str:
    """JSON has no inf/nan: non-finite figures are written as the strings "inf", "-inf", "nan"."""
    return value if math.isfinite(value) else str(value)


def figure(value: object) -> float:
    """A recorded figure as a float (non-finite values are stored as strings; absent is NaN)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def string_field(raw: Mapping[str, Any], name: str, default: str = "") -> str:
    value = raw.get(name, default)
    return default if value is None else str(value)


def optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def count_field(raw: Mapping[str, Any], name: str) -> int:
    """A recorded count (numel, mismatched, examples); 0 where it is absent or not a number."""
    value = figure(raw.get(name, 0))
    return int(value) if math.isfinite(value) else 0
