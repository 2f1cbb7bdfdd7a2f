"""Platform conditions of known deviations: the device a backend ran on, the CPU's vector features and
the installed library versions, read from what results record (the header's environment, the backend's
capabilities), so a deviation measured on one machine is expected there and nowhere else."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from conformance.results import machine
from conformance.results.header import package_versions

DEVICES: tuple[str, ...] = ("cpu", "cuda", "rocm", "xpu", "mps")
_KEYS: tuple[str, ...] = ("device", "cpu", "not_cpu", "versions")


@dataclass(frozen=True)
class Platform:
    """Where one result was computed."""

    device: str = "cpu"
    cpu_features: frozenset[str] = frozenset()
    versions: Mapping[str, str | None] = field(default_factory=dict)

    def on(self, device: str) -> Platform:
        return Platform(device, self.cpu_features, self.versions)


@functools.cache
def here(device: str = "cpu") -> Platform:
    """This process's machine, for a backend on ``device`` (read once: versions come from metadata)."""
    return Platform(device, frozenset(machine.cpu_features()), package_versions())


@dataclass(frozen=True)
class Condition:
    """Where an entry applies: every part given must hold (an empty condition holds everywhere)."""

    devices: tuple[str, ...] = ()
    cpu: tuple[str, ...] = ()  # features the CPU must have
    not_cpu: tuple[str, ...] = ()  # features it must lack
    versions: tuple[tuple[str, str], ...] = ()  # (package, PEP 440 specifier)

    def holds(self, where: Platform) -> bool:
        if self.devices and where.device not in self.devices:
            return False
        if not set(self.cpu) <= where.cpu_features or set(self.not_cpu) & where.cpu_features:
            return False
        return all(_satisfies(where.versions.get(name), spec) for name, spec in self.versions)

    def __bool__(self) -> bool:
        return bool(self.devices or self.cpu or self.not_cpu or self.versions)

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {}
        for key, values in (("device", self.devices), ("cpu", self.cpu), ("not_cpu", self.not_cpu)):
            if values:
                record[key] = list(values)
        if self.versions:
            record["versions"] = dict(self.versions)
        return record


def _satisfies(version: str | None, spec: str) -> bool:
    """An absent package satisfies no version condition."""
    if version is None:
        return False
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def parse(where: str, raw: Any, error: type[Exception]) -> Condition:
    """A ``platform = { device = [...], cpu = [...], not_cpu = [...], versions = { pkg = "spec" } }``
    table; ``error`` names ``where`` (the file and entry), the field, the value and what is allowed."""
    if not isinstance(raw, Mapping):
        raise error(f"{where}: platform={raw!r} is not allowed; allowed: a table of {', '.join(_KEYS)}")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise error(f"{where}: platform field(s) {unknown} are not allowed; allowed: {', '.join(_KEYS)}")
    devices = _names(where, "platform.device", raw.get("device", []), error, DEVICES)
    cpu = _names(where, "platform.cpu", raw.get("cpu", []), error, machine.CPU_FEATURES)
    not_cpu = _names(where, "platform.not_cpu", raw.get("not_cpu", []), error, machine.CPU_FEATURES)
    versions = raw.get("versions", {})
    if not isinstance(versions, Mapping):
        raise error(
            f'{where}: platform.versions={versions!r} is not allowed; allowed: {{ package = "spec" }}'
        )
    for name, spec in versions.items():
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier as exc:
            raise error(
                f"{where}: platform.versions.{name}={spec!r} is not allowed; allowed: a PEP 440 "
                "specifier such as '<2.12' or '>=1.20,<1.23'"
            ) from exc
    return Condition(devices, cpu, not_cpu, tuple((str(k), str(v)) for k, v in sorted(versions.items())))


def _names(
    where: str, key: str, value: Any, error: type[Exception], allowed: tuple[str, ...]
) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise error(f"{where}: {key}={value!r} is not allowed; allowed: a list of {', '.join(allowed)}")
    bad = sorted(set(values) - set(allowed))
    if bad:
        raise error(f"{where}: {key}={bad} is not allowed; allowed: {', '.join(allowed)}")
    return tuple(values)
