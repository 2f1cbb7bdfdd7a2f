"""conformance.adapter.registry: register(), entry points, duplicates, name rules, resolve(), Entry.load()."""

from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import pytest

from conformance.adapter import registry
from conformance.adapter.registry import BackendLoadError, Entry, RegistryError, register, resolve


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    """A private register() table and fixed entry points: tests neither leak nor depend on installs."""
    monkeypatch.setattr(registry, "_registered", {})
    points = [
        metadata.EntryPoint(name="ep-one", value="pkg.one:One", group=registry.GROUP),
        metadata.EntryPoint(name="ep-two", value="pkg.two:Two", group=registry.GROUP),
    ]
    # Replace the module's view of importlib.metadata, not importlib.metadata itself (pytest uses that).
    fake = SimpleNamespace(entry_points=lambda group: [p for p in points if p.group == group])
    monkeypatch.setattr(registry, "metadata", fake)
    return points


class Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_register_returns_the_class_and_lists_it():
    @register("my-backend")
    class Mine:
        name = "my-backend"

    assert isinstance(Mine, type)
    table = registry.entries()
    assert list(table) == ["ep-one", "ep-two", "my-backend"]
    entry = table["my-backend"]
    assert (
        entry.origin == f"register() in {__name__}.test_register_returns_the_class_and_lists_it.<locals>.Mine"
    )
    assert isinstance(entry.load(), Mine)


def test_listing_does_not_import_entry_points():
    # The fake entry points name modules that do not exist: listing must not try to import them.
    table = registry.entries()
    assert table["ep-one"].origin == "entry point pkg.one:One"


def test_registering_the_same_class_twice_is_harmless():
    class Again:
        name = "again"

    register("again")(Again)
    register("again")(Again)
    assert list(registry._registered) == ["again"]


def _define(label: str):
    # Two different classes with one backend name, from two different places.
    if label == "first":

        class First:
            name = "dup"

        return First

    class Second:
        name = "dup"

    return Second


def test_duplicate_register_names_both_origins():
    register("dup")(_define("first"))
    with pytest.raises(RegistryError) as info:
        register("dup")(_define("second"))
    message = str(info.value)
    assert "duplicate backend name 'dup'" in message
    assert f"register() in {__name__}._define.<locals>.First" in message
    assert f"register() in {__name__}._define.<locals>.Second" in message
    assert registry._registered["dup"].factory.__name__ == "First"  # the first registration stands


def test_register_colliding_with_an_entry_point_names_both_origins():
    @register("ep-one")
    class Shadow:
        name = "ep-one"

    with pytest.raises(RegistryError) as info:
        registry.entries()
    message = str(info.value)
    assert "duplicate backend name 'ep-one'" in message
    assert "entry point pkg.one:One" in message
    assert "register() in" in message and "Shadow" in message


def test_two_entry_points_with_one_name_and_different_targets_are_an_error(isolated):
    isolated.append(metadata.EntryPoint(name="ep-one", value="other.pkg:Other", group=registry.GROUP))
    with pytest.raises(RegistryError, match=r"entry point pkg\.one:One and entry point other\.pkg:Other"):
        registry.entries()


def test_the_same_entry_point_seen_twice_is_listed_once(isolated):
    # An editable install plus a build directory can show one distribution twice.
    isolated.append(metadata.EntryPoint(name="ep-one", value="pkg.one:One", group=registry.GROUP))
    assert list(registry.entries()) == ["ep-one", "ep-two"]


def test_malformed_entry_point_name_is_rejected(isolated):
    isolated.append(metadata.EntryPoint(name="Bad_Name", value="pkg:Bad", group=registry.GROUP))
    with pytest.raises(RegistryError, match="backend name='Bad_Name' is not allowed"):
        registry.entries()


@pytest.mark.parametrize(
    "name", ["", "My-Backend", "my_backend", "my backend", "-lead", "trail-", "a--b", "café"]
)
def test_bad_names_are_rejected_at_register(name):
    with pytest.raises(RegistryError) as info:
        register(name)
    assert f"backend name={name!r} is not allowed; allowed: kebab-case" in str(info.value)
    assert registry._registered == {}


@pytest.mark.parametrize("name", ["a", "torch-eager", "onnx2-cpu", "x-1-y"])
def test_kebab_case_names_are_accepted(name):
    register(name)(Named)
    assert name in registry._registered


# ---------------------------------------------------------------- resolve


TABLE = {name: Entry(name, "test", lambda: None) for name in ("fake-numpy", "torch-eager", "torch-nn")}


def test_resolve_all():
    assert resolve("all", TABLE) == ["fake-numpy", "torch-eager", "torch-nn"]
    assert resolve(" all ", TABLE) == ["fake-numpy", "torch-eager", "torch-nn"]


def test_resolve_a_comma_list_keeps_order_and_drops_repeats():
    assert resolve("torch-nn, fake-numpy,torch-nn", TABLE) == ["torch-nn", "fake-numpy"]


def test_resolve_unknown_name_lists_known_and_guesses():
    with pytest.raises(RegistryError) as info:
        resolve("torch-nn,torch-eagre", TABLE)
    message = str(info.value)
    assert "unknown backend 'torch-eagre'" in message
    assert "known: fake-numpy, torch-eager, torch-nn" in message
    assert "did you mean 'torch-eager'?" in message


def test_resolve_unknown_name_without_a_close_match_has_no_guess():
    with pytest.raises(RegistryError) as info:
        resolve("zzzzzz", TABLE)
    assert "known: fake-numpy, torch-eager, torch-nn" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_resolve_against_an_empty_table():
    with pytest.raises(RegistryError, match=r"known: \(none\)"):
        resolve("anything", {})


@pytest.mark.parametrize("spec", ["", " , ", ","])
def test_resolve_empty_spec_is_an_error(spec):
    with pytest.raises(
        RegistryError, match="is not allowed; allowed: all, frameworks, kernels or a comma list of"
    ):
        resolve(spec, TABLE)


# ---------------------------------------------------------------- Entry.load


def test_load_chains_the_factory_exception():
    cause = ImportError("No module named 'triton'")

    def factory():
        raise cause

    with pytest.raises(BackendLoadError) as info:
        Entry("triton-ln", "entry point backends.triton:LN", factory).load()
    assert info.value.__cause__ is cause
    message = str(info.value)
    assert "backend 'triton-ln' (entry point backends.triton:LN) failed to load" in message
    assert "No module named 'triton'" in message


def test_load_rejects_a_name_mismatch():
    with pytest.raises(BackendLoadError) as info:
        Entry("fake-a", "test origin", lambda: Named("fake-b")).load()
    message = str(info.value)
    assert "backend 'fake-a' (test origin) reports name='fake-b'" in message
    assert "must equal its registered name" in message


def test_load_rejects_a_backend_without_a_name():
    with pytest.raises(BackendLoadError, match="reports name=None"):
        Entry("fake-a", "test origin", object).load()


def test_load_returns_the_instance():
    backend = Entry("fake-a", "test origin", lambda: Named("fake-a")).load()
    assert backend.name == "fake-a"


def test_entry_point_factory_imports_and_instantiates(isolated):
    isolated.append(metadata.EntryPoint(name="fake-ok", value=f"{__name__}:Ok", group=registry.GROUP))
    assert isinstance(registry.entries()["fake-ok"].load(), Ok)


def test_entry_point_that_cannot_import_fails_to_load_with_cause():
    with pytest.raises(BackendLoadError) as info:
        registry.entries()["ep-one"].load()
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


class Ok:
    name = "fake-ok"


def test_framework_and_kernel_backends_are_opt_in() -> None:
    """``all`` leaves the opt-in groups' entries out; each group's word selects its own."""
    from conformance.adapter import registry

    table = {
        "plain": registry.Entry("plain", "test", object),
        "framework": registry.Entry("framework", "test", object, group="frameworks"),
        "kernel": registry.Entry("kernel", "test", object, group="kernels"),
    }
    assert registry.resolve("all", table) == ["plain"]
    assert registry.resolve("frameworks", table) == ["framework"]
    assert registry.resolve("kernels", table) == ["kernel"]
    assert registry.resolve("all,frameworks", table) == ["plain", "framework"]
    assert registry.resolve("framework,plain", table) == ["framework", "plain"]
    for word in ("frameworks", "kernels"):
        with pytest.raises(registry.RegistryError, match="not allowed"):
            registry.register(word)
