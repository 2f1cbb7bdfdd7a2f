"""User-supplied cases (``--cases FILE``): a JSON list or a TOML ``[[case]]`` array of Case fields."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from conformance.model.case import Case, CaseError


class CaseFileError(ValueError):
    """The cases file is unreadable or an entry is invalid; the message names file and entry."""


def read_cases(path: str | Path) -> list[Case]:
    file = Path(path)
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseFileError(f"--cases={file}: cannot read: {exc}") from exc
    entries = _parse(file, text)
    cases = [_case(file, i, entry) for i, entry in enumerate(entries)]
    if not cases:
        raise CaseFileError(f"--cases={file}: no cases in file")
    return list({c.id: c for c in cases}.values())


def _parse(file: Path, text: str) -> list[Any]:
    try:
        if file.suffix == ".toml":
            data: Any = tomllib.loads(text).get("case")
        elif file.suffix == ".json":
            data = json.loads(text)
        else:
            raise CaseFileError(
                f"--cases={file}: suffix {file.suffix!r} is not allowed; allowed: .json, .toml"
            )
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CaseFileError(f"--cases={file}: cannot parse: {exc}") from exc
    if not isinstance(data, list):
        want = "a [[case]] array" if file.suffix == ".toml" else "a JSON list of objects"
        raise CaseFileError(f"--cases={file}: expected {want}")
    return data


def _case(file: Path, index: int, entry: Any) -> Case:
    if not isinstance(entry, dict):
        raise CaseFileError(f"--cases={file}: entry {index}: expected a table/object of Case fields")
    try:
        return Case.from_dict(entry)
    except (CaseError, TypeError) as exc:
        raise CaseFileError(f"--cases={file}: entry {index}: {exc}") from exc
