"""Fake backends for the benchmark tests, loaded with ``-p fakes.bench`` (tests/ on PYTHONPATH).

One declares an interpreted mode (never timed unless asked), one reports a thread count other than
the session's (its benchmarks must fail), one offers its own roofline copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import conformance
from conformance.adapter.backend import Capabilities
from conformance.bench.timing import NumpyCopy
from conformance.model.case import Case

from fakes.core import NumpyFake, Prepared


@conformance.register("fake-interpreted")
class Interpreted(NumpyFake):
    name = "fake-interpreted"

    def capabilities(self) -> Capabilities:
        notes = {"mode": "interpreted: a NumPy stand-in for an interpreter"}
        return dataclasses.replace(super().capabilities(), notes=notes)


class _ThreadsPrepared(Prepared):
    def info(self) -> dict[str, Any]:
        return {"threads": 999}


@conformance.register("fake-wrong-threads")
class WrongThreads(NumpyFake):
    name = "fake-wrong-threads"

    def prepare(self, case: Case, inputs: dict[str, Any], *, grad: bool) -> Prepared:
        return _ThreadsPrepared(self, case, inputs, grad)


class _Copy(NumpyCopy):
    def info(self) -> dict[str, Any]:
        return {"copy": "fake-own-copy"}


@conformance.register("fake-own-copy")
class OwnCopy(NumpyFake):
    name = "fake-own-copy"

    def copy_kernel(self, nbytes: int) -> NumpyCopy:
        return _Copy(nbytes, 1)
