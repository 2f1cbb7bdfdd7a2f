"""Results records (JSON Lines, SCHEMA_VERSION 2): one header, then one record per backend x case x check.

Additive record kinds share the file: ``fingerprint`` (backend x question) and ``property`` (backend x
metamorphic property). Every record kind has its module (``result``, ``fingerprints``, ``properties``,
``header``) and is a frozen dataclass that is both written (``to_dict``) and read back (``from_dict``),
so writers and readers share one definition; this module reads and writes whole files:
``read_results`` returns one as typed records. Files of schema 1 are read through
``conformance.results.legacy``, which upgrades them to this schema's form.

Files are written atomically: records are collected in the one process that writes (the xdist
controller) and the file appears complete, via a temporary file and ``os.replace``, or not at all.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.results import legacy
from conformance.results.fingerprints import FingerprintRecord
from conformance.results.header import Header
from conformance.results.properties import PropertyRecord
from conformance.results.result import Result
from conformance.results.schema import READABLE, SchemaError

Record = Result | FingerprintRecord | PropertyRecord


# Each record kind a results file holds (besides the header); a reader skips kinds it does not know,
# so files of a later minor addition still render.
KINDS: dict[str, type[Result] | type[FingerprintRecord] | type[PropertyRecord]] = {
    "result": Result,
    "fingerprint": FingerprintRecord,
    "property": PropertyRecord,
}


def from_dict(raw: Mapping[str, Any]) -> Record | None:
    """Any non-header record by its ``kind``; None for a kind this reader does not know."""
    kind = KINDS.get(str(raw.get("kind")))
    return None if kind is None else kind.from_dict(raw)


@dataclass(frozen=True)
class ResultsFile:
    """One results file read back: its header and its records of each kind."""

    path: Path
    header: Header
    results: tuple[Result, ...]
    fingerprints: tuple[FingerprintRecord, ...] = ()
    properties: tuple[PropertyRecord, ...] = ()

    @property
    def shard(self) -> tuple[int, int] | None:
        return self.header.shard


def write_atomic(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write JSON Lines so that ``path`` holds either the old file or the whole new one."""
    write_lines_atomic(path, map(line, records))


def line(record: Mapping[str, Any]) -> str:
    """One record as its JSON Lines line (strict JSON: no NaN or infinity)."""
    return json.dumps(record, allow_nan=False) + "\n"


def write_lines_atomic(path: Path, lines: Iterable[str]) -> None:
    """Write lines made by ``line`` so that ``path`` holds either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            for text in lines:
                out.write(text)
            out.flush()
            os.fsync(out.fileno())
        # mkstemp creates 0600; a results file is as readable as any file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def text(file: Path) -> str:
    """A results file's text; a gzip-compressed one (``.jsonl.gz``) is decompressed."""
    raw = file.read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


def _read(file: Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    """(header, every other record with its line in the file) in this schema's form."""
    try:
        lines = text(file).splitlines()
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise SchemaError(f"{file}: cannot read results: {exc}") from exc
    try:
        numbered = [(i + 1, json.loads(line)) for i, line in enumerate(lines) if line.strip()]
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{file}: corrupt results line: {exc}") from exc
    bad = next((i for i, (_, r) in enumerate(numbered) if not isinstance(r, dict)), None)
    if bad is not None:
        raise SchemaError(f"{file}: corrupt results line {bad + 1}: expected a JSON object")
    if not numbered or numbered[0][1].get("kind") != "header":
        raise SchemaError(f"{file}: first record must be the header")
    header, rest = numbered[0][1], numbered[1:]
    schema = header.get("schema")
    if schema not in READABLE:
        allowed = ", ".join(map(str, READABLE))
        raise SchemaError(f"{file}: schema={schema!r} is not allowed; allowed: {allowed}")
    if schema == 1:
        header, upgraded = legacy.upgrade(file, header, [r for _, r in rest])
        rest = [(line, r) for (line, _), r in zip(rest, upgraded, strict=True)]
    return header, rest


def read_raw(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, every other record) as JSON objects in this schema's form; schema 1 files are upgraded."""
    header, rest = _read(Path(path))
    return header, [r for _, r in rest]


def _typed(raw: Mapping[str, Any], where: str) -> Record | None:
    try:
        return from_dict(raw)
    except SchemaError as exc:
        raise SchemaError(f"{where}: {exc}") from exc


def read_results(path: str | Path) -> ResultsFile:
    """A results file as typed records; raises SchemaError naming the file and the record at fault."""
    file = Path(path)
    raw_header, rest = _read(file)
    typed = [_typed(r, f"{file}: line {line}") for line, r in rest]
    return ResultsFile(
        file,
        Header.from_dict(raw_header),
        tuple(r for r in typed if isinstance(r, Result)),
        tuple(r for r in typed if isinstance(r, FingerprintRecord)),
        tuple(r for r in typed if isinstance(r, PropertyRecord)),
    )
