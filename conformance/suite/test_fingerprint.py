"""Semantic fingerprint: which convention each backend implements (docs/fingerprints.md)."""

from collections.abc import Callable


def test_fingerprint(normconf_question: object, normconf_fingerprint: Callable[[], None]) -> None:
    normconf_fingerprint()
