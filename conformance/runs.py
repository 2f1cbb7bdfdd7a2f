"""Results files grouped into runs: the shards of one run merge, other files stay separate runs.

Files whose headers carry ``shard`` with the same count, profile or cases file, tolerance and
ledger hashes and git commit are shards of one run (machines may differ); every other file is a
run of its own. Each run gets a short label for the report and the comparison.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.results import OUTCOMES, SchemaError, read

BAD_OUTCOMES: frozenset[str] = frozenset({"failed", "error", "xpassed"})
GOOD_OUTCOMES: frozenset[str] = frozenset({"passed", "xfailed"})
# Worst first: a group of results shows the first outcome of this list that occurs in it.
SEVERITY: tuple[str, ...] = ("error", "failed", "xpassed", "xfailed", "passed", "unsupported", "skipped")


@dataclass(frozen=True)
class ResultsFile:
    path: Path
    header: Mapping[str, Any]
    records: tuple[Mapping[str, Any], ...]

    @property
    def shard(self) -> tuple[int, int] | None:
        raw = self.header.get("shard")
        if (
            isinstance(raw, Mapping)
            and isinstance(raw.get("index"), int)
            and isinstance(raw.get("count"), int)
        ):
            return raw["index"], raw["count"]
        return None

    def run_key(self) -> tuple[Any, ...]:
        h = self.header
        return (
            self.shard[1] if self.shard else None,
            h.get("profile"),
            h.get("cases_file"),
            (h.get("tolerances") or {}).get("sha256"),
            (h.get("ledger") or {}).get("sha256"),
            (h.get("environment") or {}).get("git_commit"),
        )


@dataclass(frozen=True)
class Run:
    """One logical run: a single results file, or the shards of one run."""

    label: str
    files: tuple[ResultsFile, ...]

    @property
    def header(self) -> Mapping[str, Any]:
        return self.files[0].header

    @property
    def records(self) -> list[Mapping[str, Any]]:
        return [r for f in self.files for r in f.records]

    @property
    def backends(self) -> list[str]:
        names = {str(r["backend"]) for r in self.records}
        for f in self.files:
            names |= set(f.header.get("backends") or {})
        return sorted(names)

    def by_key(self) -> dict[tuple[str, str, str], Mapping[str, Any]]:
        """Records by (backend, case id, check)."""
        return {key(r): r for r in self.records}


def key(record: Mapping[str, Any]) -> tuple[str, str, str]:
    return str(record["backend"]), str(record["case"].get("id", "?")), str(record["check"])


def worst(outcomes: Iterable[str]) -> str:
    present = set(outcomes)
    return next((o for o in SEVERITY if o in present), "skipped")


def load(paths: Sequence[str | Path]) -> list[Run]:
    """Read and group results files; raises ``results.SchemaError`` naming the file at fault."""
    files = []
    for path in paths:
        header, records = read(path)
        for index, record in enumerate(records):
            _check(Path(path), index, record)
        files.append(ResultsFile(Path(path), header, tuple(records)))
    return group(files)


def _check(path: Path, index: int, record: Mapping[str, Any]) -> None:
    """A result record has the fields every report and comparison reads, with the right types."""
    where = f"{path}: result {index + 1}"
    for name in ("backend", "check", "outcome"):
        if not isinstance(record.get(name), str):
            raise SchemaError(f"{where}: {name}={record.get(name)!r} is not allowed; allowed: a string")
    if record["outcome"] not in OUTCOMES:
        raise SchemaError(
            f"{where}: outcome={record['outcome']!r} is not allowed; allowed: {', '.join(OUTCOMES)}"
        )
    case = record.get("case")
    if not isinstance(case, Mapping) or not isinstance(case.get("id"), str):
        raise SchemaError(f"{where}: case={case!r} is not allowed; allowed: an object with a string id")
    if not isinstance(record.get("comparisons", []), list):
        raise SchemaError(f"{where}: comparisons must be a list")


def group(files: Sequence[ResultsFile]) -> list[Run]:
    groups: list[list[ResultsFile]] = []
    for f in files:
        home = next((g for g in groups if _joins(g, f)), None)
        if home is None:
            groups.append([f])
        else:
            home.append(f)
    labels = _labels([g[0].path for g in groups])
    return [
        Run(label, tuple(sorted(g, key=lambda f: f.shard or (0, 0))))
        for label, g in zip(labels, groups, strict=True)
    ]


def _joins(group: list[ResultsFile], f: ResultsFile) -> bool:
    if f.shard is None or group[0].shard is None or group[0].run_key() != f.run_key():
        return False
    return all(g.shard is not None and g.shard[0] != f.shard[0] for g in group)


def _labels(paths: list[Path]) -> list[str]:
    """Short unique labels: file stems, with parent folders or a position only where needed."""
    for make in (
        lambda i, p: p.stem,
        lambda i, p: f"{p.parent.name}/{p.stem}",
        lambda i, p: f"{i + 1}:{p.stem}",
    ):
        labels = [make(i, p) for i, p in enumerate(paths)]
        if len(set(labels)) == len(labels):
            return labels
    raise AssertionError("positional labels are unique")
