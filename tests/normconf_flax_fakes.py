"""Deliberately broken Flax adapters for the meta-tests, run by the real Flax and JAX.

Loaded into a conformance run with ``-p normconf_flax_fakes`` (tests/ on PYTHONPATH). Each builds the
same jitted linen modules as the flax adapter with one translation undone: PyTorch's momentum passed
straight through as Flax's (the old value's weight, backwards), or the case's eps left out so
Flax's default applies. The training and forward checks must catch them.
"""

from __future__ import annotations

import conformance
from backends.flax_linen import FlaxLinen
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
