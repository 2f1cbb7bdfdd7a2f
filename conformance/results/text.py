"""The one-line summary of a check's reason, shared by the writer and the schema 1 reader."""

from __future__ import annotations


def summary_of(reason: str) -> str:
    """The line after a ``backend case [check]`` heading, else the first non-blank line."""
    lines = [line for line in str(reason).splitlines() if line.strip()]
    return lines[1].strip() if len(lines) > 1 and lines[0].endswith("]") else (lines[0] if lines else "")
