"""Fake backends for the benchmark tests, loaded with ``-p fakes.bench`` (tests/ on PYTHONPATH).

One declares an interpreted mode (never timed unless asked), one reports a thread count other than
the session's (its benchmarks must fail), one offers its own roofline copy. Two answer
``device_timing()``: one with fixed figures (a device time of 1 µs, 3 launches, no copy), whose records
must carry the split; one that raises, whose records must keep their wall time and say why no split.
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


DEVICE = {
    "device_ms": 0.001,
    "device_method": "fake",
    "launches": 3.0,
    "h2d_copies": 0.0,
    "kernel_sum_ms": 0.001,
}


class _DevicePrepared(Prepared):
    def device_timing(self) -> dict[str, Any]:
        return dict(DEVICE)


@conformance.register("fake-device-timing")
class DeviceTiming(NumpyFake):
    name = "fake-device-timing"

    def prepare(self, case: Case, inputs: dict[str, Any], *, grad: bool) -> Prepared:
        return _DevicePrepared(self, case, inputs, grad)


class _BrokenDevicePrepared(Prepared):
    def device_timing(self) -> dict[str, Any]:
        raise RuntimeError("capture failed: the fake's stream was busy")


@conformance.register("fake-device-timing-broken")
class BrokenDeviceTiming(NumpyFake):
    name = "fake-device-timing-broken"

    def prepare(self, case: Case, inputs: dict[str, Any], *, grad: bool) -> Prepared:
        return _BrokenDevicePrepared(self, case, inputs, grad)
