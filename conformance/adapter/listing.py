"""What is registered, and whether it can run: ``normconf backends`` (one line per backend; ``-v`` for
every capability and note; ``--json``) and pytest's ``--list-backends`` (the verbose form)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.adapter.backend import Capabilities
from conformance.adapter.opening import Absent, open_backend
from conformance.adapter.registry import Entry


@dataclass(frozen=True)
class Listed:
    """One backend as opened for a listing: its capabilities, or why it cannot run."""

    entry: Entry
    capabilities: Capabilities | None
    why_not: str = ""  # "" when available
    broken: bool = False

    @property
    def status(self) -> str:
        if self.capabilities is not None:
            return "available"
        return "broken" if self.broken else "unavailable"


def survey(entries: dict[str, Entry]) -> list[Listed]:
    listed = []
    for entry in entries.values():
        opened = open_backend(entry)
        if isinstance(opened, Absent):
            listed.append(Listed(entry, None, opened.detail, opened.broken))
        else:
            listed.append(Listed(entry, opened[1]))
    return listed


def describe(item: Listed) -> list[str]:
    """Every line pytest's ``--list-backends`` and ``normconf backends -v`` print for one backend."""
    entry, caps = item.entry, item.capabilities
    lines = [f"{entry.name}", f"  origin: {entry.origin}"]
    if entry.opt_in:
        lines.append(f"  selected by: --backend {entry.group} (not by all)")
    if caps is None:
        return [*lines, f"  available: {'no, broken' if item.broken else 'no'} ({item.why_not})"]
    lines.append(f"  available: yes, device {caps.device} ({caps.device_name or 'unnamed'})")
    lines.append(f"  ops: {', '.join(sorted(caps.ops))}")
    lines.append(f"  dtypes: {', '.join(sorted(caps.dtypes))}")
    lines.append(f"  features: {', '.join(sorted(caps.features)) or '(none)'}")
    if caps.limits:
        lines.append(f"  limits: {', '.join(f'{k}={v}' for k, v in caps.limits.items())}")
    for key, note in caps.notes.items():
        lines.append(f"  {key}: {note}")
    return lines


def _row(item: Listed) -> list[str]:
    caps = item.capabilities
    size = f"{len(caps.ops)} ops, {len(caps.dtypes)} dtypes" if caps is not None else "-"
    origin = item.entry.origin + (f" (opt-in: --backend {item.entry.group})" if item.entry.opt_in else "")
    return [item.entry.name, item.status, size, origin + (f": {item.why_not}" if item.why_not else "")]


def short(listed: list[Listed]) -> list[str]:
    """One aligned line per backend: name, status, ops and dtypes, origin (and why it cannot run)."""
    rows = [["backend", "status", "supports", "origin"], *map(_row, listed)]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[3]]) for row in rows
    ]


def as_json(item: Listed) -> dict[str, Any]:
    caps = item.capabilities
    found: dict[str, Any] = {
        "name": item.entry.name,
        "origin": item.entry.origin,
        "opt_in": item.entry.opt_in,
        "status": item.status,
        "why_not": item.why_not or None,
    }
    if caps is not None:
        found |= {
            "device": caps.device,
            "device_name": caps.device_name,
            "ops": sorted(caps.ops),
            "dtypes": sorted(caps.dtypes),
            "features": sorted(caps.features),
            "limits": dict(caps.limits),
            "notes": dict(caps.notes),
        }
    return found


def render(entries: dict[str, Entry], *, verbose: bool = True) -> str:
    if not entries:
        return "no normconf backends registered"
    listed = survey(entries)
    if not verbose:
        return "\n".join(short(listed))
    return "\n".join(line for item in listed for line in describe(item))
