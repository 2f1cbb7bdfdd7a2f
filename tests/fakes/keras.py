"""Deliberately broken Keras adapters for the meta-tests, running the real Keras layers.

Loaded into a conformance run with ``-p fakes.keras`` (tests/ on PYTHONPATH):

- ``fake-keras-momentum`` passes PyTorch's momentum straight to BatchNormalization, whose momentum
  weights the OLD moving value: the training check must catch running_mean (and running_var).
- ``fake-keras-group-axis`` builds GroupNormalization (GroupNorm and InstanceNorm) with Keras' default
  channel axis -1 on the case's channels-first x (N, C, L): the groups are formed over L, not C. With
  an affine the (C,) weights do not fit the (L,)-shaped gamma (an error); without one it runs and
  returns wrong values, the silent porting trap the forward check must catch.
- ``fake-keras-child-dies`` runs keras-jax in its child process (always, whatever this process's
  Keras backend) and makes the child exit while it receives one case: that case must be an error
  naming the dead child, and the next case must run in a fresh child.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import conformance
from backends.keras.layers import KerasJax, KerasTorch
from backends.keras.plan import Plan
from conformance.adapter.backend import Inputs
from conformance.model.case import Case

# The case whose request kills the child (a smoke-profile case).
DOOMED = "layer_norm-float32-6x40-eps1e-05-normal"


@conformance.register("fake-keras-momentum")
class MomentumStraightThrough(KerasTorch):
    """Keras' momentum is the weight of the old value; this fake gives it PyTorch's m, not 1 - m."""

    name = "fake-keras-momentum"

    def keras_momentum(self, case: Case) -> float | None:
        return case.momentum if case.op == "batch_norm" else None


@conformance.register("fake-keras-group-axis")
class GroupAxisLeftAtDefault(KerasTorch):
    """GroupNormalization with the channel axis at Keras' default -1 instead of the case's axis 1."""

    name = "fake-keras-group-axis"

    def plan(self, case: Case, inputs: Inputs, *, default_eps: bool = False) -> Plan:
        plan = super().plan(case, inputs, default_eps=default_eps)
        if plan.layer != "GroupNormalization":
            return plan
        return replace(plan, kwargs={**plan.kwargs, "axis": -1})


class _ExitWhenUnpickled:
    """Unpickled in the child, this calls os._exit: the child dies mid-request, as a segfault would."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (os._exit, (3,))


@conformance.register("fake-keras-child-dies")
class ChildDies(KerasJax):
    """keras-jax in its child process; the child exits while receiving the DOOMED case."""

    name = "fake-keras-child-dies"
    always_child = True

    def plan(self, case: Case, inputs: Inputs, *, default_eps: bool = False) -> Plan:
        plan = super().plan(case, inputs, default_eps=default_eps)
        if case.id != DOOMED:
            return plan
        return replace(plan, kwargs={**plan.kwargs, "doom": _ExitWhenUnpickled()})
