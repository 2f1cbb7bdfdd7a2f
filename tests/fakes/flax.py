"""Deliberately broken Flax adapters for the meta-tests, run by the real Flax and JAX.

Loaded into a conformance run with ``-p fakes.flax`` (tests/ on PYTHONPATH). Each builds the
same jitted linen modules as the flax adapter with one translation undone: PyTorch's momentum passed
straight through as Flax's (the old value's weight, backwards), the case's eps left out so Flax's
default applies, or GroupNorm's channels-first x handed to linen.GroupNorm untransposed (its feature
axis is the last one, so the groups are formed over the last spatial axis). The training and forward
checks must catch them.
"""

from __future__ import annotations

import conformance
from backends.flax.linen import FlaxLinen
from conformance.model.case import Case


@conformance.register("fake-flax-momentum")
class MomentumStraightThrough(FlaxLinen):
    """Flax's momentum weights the old running value; this fake gives it PyTorch's m instead of 1 - m."""

    name = "fake-flax-momentum"

    def flax_momentum(self, case: Case) -> float | None:
        return case.momentum if case.op == "batch_norm" else None


@conformance.register("fake-flax-default-eps")
class DefaultEps(FlaxLinen):
    """Never passes the case's eps: every module runs with Flax's default epsilon (1e-6 for LayerNorm)."""

    name = "fake-flax-default-eps"

    def epsilon(self, case: Case, default_eps: bool) -> float | None:
        return None


@conformance.register("fake-flax-group-layout")
class GroupNormUntransposed(FlaxLinen):
    """linen.GroupNorm given x (N, C, L) as it is: Flax takes L for the channels and groups it.

    With an affine, the (C,) weights do not fit the (L,) scale Flax expects (an error); without one
    the module runs and returns wrong values: the silent trap the forward check must catch.
    """

    name = "fake-flax-group-layout"

    def transposes(self, case: Case) -> bool:
        return False
