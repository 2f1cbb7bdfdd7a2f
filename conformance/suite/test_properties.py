"""Metamorphic properties (shift and scale invariance, row independence, ...) under Hypothesis."""

from collections.abc import Callable


def test_properties(normconf_property: object, normconf_check_property: Callable[[], None]) -> None:
    normconf_check_property()
