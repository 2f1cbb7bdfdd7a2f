"""No output may share memory with an input or another output, and no input may be written, unless the
backend declares it (Capabilities.aliases); a declared in-place input must hold its output."""

from collections.abc import Callable


def test_aliasing(normconf_target: object, normconf_run: Callable[[str], None]) -> None:
    normconf_run("aliasing")
