"""``--list-backends``: each backend's origin, availability (or why not) and capabilities."""

from __future__ import annotations

from conformance.adapter.backend import BackendUnavailable
from conformance.adapter.registry import BackendLoadError, Entry


def describe(entry: Entry) -> list[str]:
    lines = [f"{entry.name}", f"  origin: {entry.origin}"]
    try:
        caps = entry.load().capabilities()
    except (BackendLoadError, BackendUnavailable) as exc:
        return [*lines, f"  available: no ({exc})"]
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
