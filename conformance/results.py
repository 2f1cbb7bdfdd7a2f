"""Results records (JSON Lines, SCHEMA_VERSION 1): one header, then one record per backend x case x check.

Additive record kinds share the file: ``fingerprint`` (backend x question) and ``property`` (backend x
metamorphic property); ``read`` returns only the results, ``read_fingerprints``/``read_properties`` the rest.

Files are written atomically: records are collected in the one process that writes (the xdist
controller) and the file appears complete, via a temporary file and ``os.replace``, or not at all.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
OUTCOMES: tuple[str, ...] = ("passed", "failed", "skipped", "unsupported", "xfailed", "xpassed", "error")
PACKAGES: tuple[str, ...] = (
    "normconf",
    "numpy",
    "ml_dtypes",
    "pytest",
    "pytest-xdist",
    "torch",
    "triton",
    "onnx",
    "onnxruntime",
    "jax",
)


@dataclass(frozen=True)
class Result:
    """The outcome of one check of one case on one backend."""

    backend: str
    case: Mapping[str, Any]
    check: str
    outcome: str
    reason: str = ""
    comparisons: tuple[Mapping[str, Any], ...] = ()
    duration_s: float = 0.0
    reproduce: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.outcome in OUTCOMES, self.outcome

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "result",
            "backend": self.backend,
            "case": dict(self.case),
            "check": self.check,
            "outcome": self.outcome,
            "reason": self.reason,
            "comparisons": [dict(c) for c in self.comparisons],
            "duration_s": round(self.duration_s, 6),
            "reproduce": self.reproduce,
            **({"extra": dict(self.extra)} if self.extra else {}),
        }


def package_versions() -> dict[str, str | None]:
    """Installed versions read from metadata, so no backend library is imported to learn them."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def environment(cwd: Path) -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "platform": platform.platform(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "git_commit": git_commit(cwd),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def header(cwd: Path, **extra: Any) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {"kind": "header", "schema": SCHEMA_VERSION, "time": now, "environment": environment(cwd), **extra}


def write_atomic(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write JSON Lines so that ``path`` holds either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            for record in records:
                out.write(json.dumps(record, allow_nan=False) + "\n")
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


class SchemaError(ValueError):
    """A results file is unreadable, corrupt, or of another schema version."""


def read(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, result records) of one results file, validated against this schema version."""
    header, records = read_all(path)
    return header, [r for r in records if r.get("kind") == "result"]


def read_fingerprints(path: str | Path) -> list[dict[str, Any]]:
    """The ``kind: "fingerprint"`` records (one per backend x question) of a results file."""
    return [r for r in read_all(path)[1] if r.get("kind") == "fingerprint"]


def read_properties(path: str | Path) -> list[dict[str, Any]]:
    """The ``kind: "property"`` records (one per backend x metamorphic property) of a results file."""
    return [r for r in read_all(path)[1] if r.get("kind") == "property"]


def read_all(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, every other record of any kind), validated against this schema version."""
    file = Path(path)
    try:
        lines = file.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{file}: cannot read results: {exc}") from exc
    try:
        records = [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{file}: corrupt results line: {exc}") from exc
    bad = next((i for i, r in enumerate(records) if not isinstance(r, dict)), None)
    if bad is not None:
        raise SchemaError(f"{file}: corrupt results line {bad + 1}: expected a JSON object")
    if not records or records[0].get("kind") != "header":
        raise SchemaError(f"{file}: first record must be the header")
    schema = records[0].get("schema")
    if schema != SCHEMA_VERSION:
        raise SchemaError(f"{file}: schema={schema!r} is not allowed; allowed: {SCHEMA_VERSION}")
    return records[0], records[1:]
