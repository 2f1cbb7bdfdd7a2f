"""Reading the suite's TOML data files (tolerances, ledger) with one error shape: file and cause."""

from __future__ import annotations

import hashlib
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any


def builtin(name: str) -> Path:
    """A data file shipped beside this module (the built-in tolerance matrix and ledger)."""
    return Path(str(resources.files("conformance.judging").joinpath(name)))


def read(file: Path, what: str, error: type[Exception]) -> tuple[dict[str, Any], str]:
    """(parsed data, sha256 of the bytes); any read or parse problem raises ``error`` naming the file."""
    try:
        raw = file.read_bytes()
        data = tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{file}: cannot read {what}: {exc}") from exc
    return data, hashlib.sha256(raw).hexdigest()
