"""One table of backends fed by the ``normconf.backends`` entry points and ``register()``.

Listing reads names and origins without importing any adapter; loading imports and instantiates.
Backends registered under an opt-in group are selected by the group's name only: ``all`` leaves them
out, ``all,frameworks`` selects both. ``normconf.backends.frameworks`` holds the framework and runtime
adapters of docs/porting.md (many: the ``ci`` profile over all of them takes longer than a CI job
should); ``normconf.backends.kernels`` the kernel libraries people compare against (Liger-Kernel: CUDA
only).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

from conformance.adapter.backend import Backend

GROUP = "normconf.backends"
# Opt-in groups by the --backend word that selects them.
OPT_IN_GROUPS = {"frameworks": "normconf.backends.frameworks", "kernels": "normconf.backends.kernels"}
OPT_IN_GROUP = OPT_IN_GROUPS["frameworks"]
# Words --backend takes besides backend names; no backend may be called one of them.
KEYWORDS = ("all", *OPT_IN_GROUPS)
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_registered: dict[str, Entry] = {}

T = TypeVar("T")


class RegistryError(ValueError):
    """A usage problem with backend names: unknown, duplicate or malformed."""


class BackendLoadError(RuntimeError):
    """An adapter could not be imported or instantiated; the cause is chained."""


@dataclass(frozen=True)
class Entry:
    """A backend known by name, not yet loaded."""

    name: str
    origin: str
    factory: Callable[[], Any]
    module: str = ""  # the module an entry point names; "" for a register()ed class
    group: str = ""  # the opt-in group's word ("frameworks", "kernels") that selects it; "" for "all"

    @property
    def opt_in(self) -> bool:
        """Selected by its group's word, not by "all"."""
        return bool(self.group)

    def load(self) -> Backend:
        try:
            backend = self.factory()
        except Exception as exc:
            raise BackendLoadError(f"backend {self.name!r} ({self.origin}) failed to load: {exc}") from exc
        if getattr(backend, "name", None) != self.name:
            raise BackendLoadError(
                f"backend {self.name!r} ({self.origin}) reports name={getattr(backend, 'name', None)!r}; "
                "an adapter's name must equal its registered name"
            )
        return backend  # type: ignore[no-any-return]


def _check_name(name: str) -> None:
    if not _NAME.match(name) or name in KEYWORDS:
        raise RegistryError(
            f"backend name={name!r} is not allowed; allowed: kebab-case like 'my-backend', not {KEYWORDS}"
        )


def register(name: str) -> Callable[[T], T]:
    """Class decorator registering an unpackaged adapter (conftest, ``-p module``, notebook)."""
    _check_name(name)

    def decorate(cls: T) -> T:
        origin = f"register() in {getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}"
        previous = _registered.get(name)
        if previous is not None and previous.origin != origin:
            raise RegistryError(f"duplicate backend name {name!r}: {previous.origin} and {origin}")
        _registered[name] = Entry(name, origin, cls)  # type: ignore[arg-type]
        return cls

    return decorate


def _entry_point(ep: metadata.EntryPoint, group: str = "", where: str = "") -> Entry:
    def factory() -> Any:
        return ep.load()()

    return Entry(ep.name, f"entry point {ep.value}{where}", factory, ep.module, group)


def _distribution(ep: metadata.EntryPoint, known: dict[int, str]) -> str:
    """`` from <name> <version>`` of the distribution declaring ``ep``: each ``.name`` and
    ``.version`` of a distribution parses its METADATA file again, so once per distribution."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ""
    if id(dist) not in known:
        meta = dist.metadata
        known[id(dist)] = f" from {meta['Name']} {meta['Version']}"
    return known[id(dist)]


def entries() -> dict[str, Entry]:
    """Every known backend by name; a name claimed twice is an error naming both origins."""
    table: dict[str, Entry] = {}
    seen_values: dict[str, str] = {}
    where: dict[int, str] = {}
    groups = [(GROUP, ""), *((group, word) for word, group in OPT_IN_GROUPS.items())]
    for group, word in groups:
        for ep in metadata.entry_points(group=group):
            # One distribution can be visible twice on sys.path (editable + build dir); same target is fine.
            if seen_values.get(ep.name) == ep.value:
                continue
            _add(table, _entry_point(ep, word, _distribution(ep, where)))
            seen_values[ep.name] = ep.value
    for entry in _registered.values():
        _add(table, entry)
    return dict(sorted(table.items()))


def _add(table: dict[str, Entry], entry: Entry) -> None:
    _check_name(entry.name)
    if entry.name in table:
        raise RegistryError(
            f"duplicate backend name {entry.name!r}: {table[entry.name].origin} and {entry.origin}"
        )
    table[entry.name] = entry


def resolve(spec: str, table: dict[str, Entry]) -> list[str]:
    """Turn a comma list of names and keywords (``all``: every backend but the opt-in ones; an opt-in
    group's word: its backends) into names; an unknown name gets the known ones and a guess."""
    words = [n.strip() for n in spec.split(",") if n.strip()]
    if not words:
        raise RegistryError(
            f"--backend={spec!r} is not allowed; allowed: {', '.join(KEYWORDS)} or a comma list of "
            f"{list(table)}"
        )
    keyword = {"all": [n for n, e in table.items() if not e.opt_in]}
    keyword |= {word: [n for n, e in table.items() if e.group == word] for word in OPT_IN_GROUPS}
    names = [name for word in words for name in keyword.get(word, [word])]
    for name in names:
        if name not in table:
            guess = difflib.get_close_matches(name, list(table), n=1)
            hint = f"; did you mean {guess[0]!r}?" if guess else ""
            raise RegistryError(f"unknown backend {name!r}; known: {', '.join(table) or '(none)'}{hint}")
    return list(dict.fromkeys(names))
