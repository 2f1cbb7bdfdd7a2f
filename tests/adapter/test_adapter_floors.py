"""A built-in adapter on a library older than the floor it is tested with is unavailable, once, with
the reason; the floors are pyproject's."""

from __future__ import annotations

import re
import tomllib

from conformance.adapter import opening
from conformance.adapter.opening import FLOORS, Absent, open_backend
from conformance.adapter.registry import Entry

from support.suite import ROOT

PYPROJECT = ROOT / "pyproject.toml"


def _declared() -> dict[str, str]:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    floors = {}
    for requirement in (r for reqs in extras.values() for r in reqs):
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(,.*)?", requirement)
        if found:
            floors[found.group(1)] = found.group(2)
    return floors


def test_the_floors_are_the_ones_pyproject_declares():
    declared = _declared()
    assert {k: declared[k] for k in FLOORS} == FLOORS


class _Torchy:
    name = "torchy"

    def capabilities(self):  # type: ignore[no-untyped-def]
        import torch

        from conformance.adapter.backend import Capabilities

        # As every built-in adapter does, it names the libraries it runs on in its notes.
        notes = {"torch": torch.__version__}
        return Capabilities(ops=frozenset({"layer_norm"}), dtypes=frozenset({"float32"}), notes=notes)


def test_a_built_in_adapter_below_its_floor_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setitem(opening.FLOORS, "torch", "99")
    opened = open_backend(Entry("torchy", "entry point backends.torchy:Torchy", _Torchy, "backends.torchy"))
    assert isinstance(opened, Absent) and not opened.broken and opened.outcome == "skipped"
    assert re.fullmatch(
        r"backend torchy unavailable: needs torch>=99, \S+ is installed "
        r"\(pip install --upgrade 'normconf\[torch\]'\)",
        opened.reason,
    )


def test_a_third_party_adapter_states_its_own_requirements(monkeypatch):
    monkeypatch.setitem(opening.FLOORS, "torch", "99")
    opened = open_backend(Entry("torchy", "register() in my_pkg", _Torchy))
    assert not isinstance(opened, Absent)


def test_every_built_in_adapter_names_the_libraries_it_runs_on():
    from conformance.adapter import registry

    # The default ones; the framework adapters (opt-in, some in child processes) record theirs alike.
    for name, entry in registry.entries().items():
        if entry.opt_in or not entry.module.startswith("backends."):
            continue  # other tests register fakes of their own in this process
        opened = open_backend(entry)
        if isinstance(opened, Absent):
            continue  # not installed here: nothing to compare
        assert set(FLOORS) & set(opened[1].notes), f"{name} names none of {sorted(FLOORS)} in its notes"


def test_at_the_floor_a_built_in_adapter_opens(monkeypatch):
    opened = open_backend(Entry("torchy", "entry point backends.torchy:Torchy", _Torchy, "backends.torchy"))
    assert not isinstance(opened, Absent)
