"""Gradients (dx, dweight, dbias) against the oracle's analytic gradients."""

from collections.abc import Callable


def test_backward(normconf_target: object, normconf_run: Callable[[str], None]) -> None:
    normconf_run("backward")
