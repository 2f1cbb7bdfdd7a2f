"""``--list-backends``: each backend's origin, availability (or why not) and capabilities."""

from __future__ import annotations

from conformance.adapter.opening import Absent, open_backend
from conformance.adapter.registry import Entry


def describe(entry: Entry) -> list[str]:
    lines = [f"{entry.name}", f"  origin: {entry.origin}"]
    if entry.opt_in:
        lines.append("  selected by: --backend frameworks (not by all)")
    opened = open_backend(entry)
    if isinstance(opened, Absent):
        return [*lines, f"  available: {'no, broken' if opened.broken else 'no'} ({opened.detail})"]
    caps = opened[1]
    lines.append(f"  available: yes, device {caps.device} ({caps.device_name or 'unnamed'})")
    lines.append(f"  ops: {', '.join(sorted(caps.ops))}")
    lines.append(f"  dtypes: {', '.join(sorted(caps.dtypes))}")
    lines.append(f"  features: {', '.join(sorted(caps.features)) or '(none)'}")
    if caps.limits:
        lines.append(f"  limits: {', '.join(f'{k}={v}' for k, v in caps.limits.items())}")
    for key, note in caps.notes.items():
        lines.append(f"  {key}: {note}")
    return lines


def render(entries: dict[str, Entry]) -> str:
    if not entries:
        return "no normconf backends registered"
    return "\n".join(line for entry in entries.values() for line in describe(entry))
