"""A call must leave its inputs, including the caller's gradient dy, bit for bit unchanged."""

from collections.abc import Callable


def test_inputs_unchanged(normconf_target: object, normconf_run: Callable[[str], None]) -> None:
    normconf_run("inputs_unchanged")
