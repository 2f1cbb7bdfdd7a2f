"""Two calls on the same prepared inputs must return the same bits."""

from collections.abc import Callable


def test_determinism(normconf_target: object, normconf_run: Callable[[str], None]) -> None:
    normconf_run("determinism")
