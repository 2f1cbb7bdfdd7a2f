"""BatchNorm training: running_mean and running_var after one update."""

from collections.abc import Callable


def test_training(normconf_target: object, normconf_run: Callable[[str], None]) -> None:
    normconf_run("training")
