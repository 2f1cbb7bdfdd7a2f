"""The liger-* adapters (backends/liger/norms.py) over stand-in classes that run on the CPU, loaded
with ``-p fakes.liger``: ``fake-liger-*`` over sound stand-ins (tests/fakes/liger_standin.py), and
``fake-liger-rms-dweight`` and ``fake-liger-gn-variance`` over the two defects of
tests/fakes/liger_broken.py, which the suite must fail."""

from __future__ import annotations

import conformance
from backends.liger.norms import LigerNorm


class _StandIn(LigerNorm):
    library = "fakes.liger_standin"
    needs_cuda = False


class _Broken(LigerNorm):
    library = "fakes.liger_broken"
    needs_cuda = False


def _fake(name: str, kind: str, base: type[LigerNorm]) -> type[LigerNorm]:
    cls = type(name.replace("-", "_"), (base,), {"name": name, "kind_name": kind})
    return conformance.register(name)(cls)


for _kind in ("liger-rms", "liger-rms-gemma", "liger-layer-norm", "liger-add-rms", "liger-group-norm"):
    _fake(f"fake-{_kind}", _kind, _StandIn)
_fake("fake-liger-rms-dweight", "liger-rms", _Broken)
_fake("fake-liger-gn-variance", "liger-group-norm", _Broken)


def registry_backend(name: str) -> LigerNorm:
    """A registered fake by name, loaded (the tests call its prepare() directly)."""
    backend = conformance.adapter.registry.entries()[name].load()
    assert isinstance(backend, LigerNorm)
    return backend
