"""Broken adapters, as someone else's package may ship them: loaded with ``-p fakes.broken``.

Each fails in a different place; the suite must report each as that backend's problem (its tests are
errors with the reason, the listing says why) and keep every other backend's results complete.
"""

from __future__ import annotations

import time
from typing import Any

import conformance
from conformance.adapter.backend import Capabilities

from fakes.core import NumpyFake


@conformance.register("fake-broken-capabilities")
class BrokenCapabilities(NumpyFake):
    name = "fake-broken-capabilities"

    def capabilities(self) -> Any:
        raise TypeError("capabilities() of this adapter has a bug")


@conformance.register("fake-broken-constructor")
class BrokenConstructor(NumpyFake):
    name = "fake-broken-constructor"

    def __init__(self) -> None:
        raise RuntimeError("the adapter cannot be built")


@conformance.register("fake-broken-capabilities-type")
class CapabilitiesOfTheWrongType(NumpyFake):
    name = "fake-broken-capabilities-type"

    def capabilities(self) -> Any:
        return {"ops": ["layer_norm"]}


@conformance.register("fake-misspelt-capabilities")
class MisspeltCapabilities(NumpyFake):
    """Capabilities typed from memory: every case would be unsupported and the run would test nothing."""

    name = "fake-misspelt-capabilities"

    def capabilities(self) -> Capabilities:
        return Capabilities(ops=frozenset({"rmsnorm", "layer_norm"}), dtypes=frozenset({"fp32"}))


@conformance.register("fake-rms-norm-only")
class RmsNormOnly(NumpyFake):
    """Declares one op: a run that selects only others executes nothing of it, which must not be green."""

    name = "fake-rms-norm-only"
    ops = frozenset({"rms_norm"})


@conformance.register("fake-hangs-always")
class HangsAlways(NumpyFake):
    """Hangs in every call: after --max-timeouts timeouts its remaining tests must error at once."""

    name = "fake-hangs-always"

    def compute(self, case: Any, inputs: Any, grad: bool) -> Any:
        time.sleep(3600)
        return super().compute(case, inputs, grad)
