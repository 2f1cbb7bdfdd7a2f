"""Forward outputs (y, residual_out) against the float64 oracle."""

from collections.abc import Callable


def test_forward(normconf_target: object, normconf_run: Callable[[str], None]) -> None:
    normconf_run("forward")
