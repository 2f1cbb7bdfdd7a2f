"""The one mapping from a recorded outcome to the outcome of its pytest test.

Every suite test (checks, fingerprint questions, properties) records its record first and then
ends through ``enforce``, so pytest's summary and the results file always agree.
"""

from __future__ import annotations

import pytest

FAILING: frozenset[str] = frozenset({"failed", "error", "xpassed"})
SKIPPING: frozenset[str] = frozenset({"skipped", "unsupported"})


def enforce(outcome: str, reason: str) -> None:
    """failed, error, xpassed -> test failure; skipped, unsupported -> skip; xfailed -> xfail; else pass.

    A fingerprint's ``answered`` and a check's ``passed`` both pass."""
    if outcome in FAILING:
        pytest.fail(f"{outcome}: {reason}", pytrace=False)
    if outcome in SKIPPING:
        pytest.skip(f"{outcome}: {reason}")
    if outcome == "xfailed":
        # pytest.xfail(reason) without its traceback: pytest formats a failure's traceback (parsing the
        # source of every frame) before it turns it into an xfail and drops it: tens of milliseconds a test.
        raise pytest.xfail.Exception(reason, pytrace=False)
