"""How long each scheduling scope took, kept between runs so the next one deals the slowest out first.

A scope is what the xdist scheduler hands one worker (conformance/running/scheduling.py): a backend's
checks of one case signature (``backend::signature``), or one fingerprint question or property test
(``check[backend:name]``). The writing process adds this run's seconds per scope to ``durations.json``
in the graph cache folder (conformance.adapter.cache), replacing the scopes it ran and keeping the
others, so a run of part of the suite does not forget the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from conformance.adapter import cache
from conformance.model.case import Case
from conformance.running.nodeid import NODE_ID

FILE = "durations.json"
__all__ = ["group_key", "read", "record_key", "scopes", "seconds", "signature", "test_key", "update"]
# The suite test each non-result record kind comes from (its node id's test_<name>), and its name field.
_RECORD_TESTS = {"fingerprint": ("fingerprint", "question"), "property": ("properties", "property")}


def signature(case: Case) -> str:
    """What a backend's cached preparation can depend on: every field but the shape, dist and seed.

    The shape stays out because the built-in caching backends key on a dynamic-shape signature
    (torch-compile) or on the parameter shape (onnx-export, a finer key inside this group); eps stays
    in because both specialize on it.
    """
    fields: tuple[object, ...] = (
        case.op,
        case.dtype,
        case.weight_dtype,
        case.norm_ndim,
        case.weight,
        case.bias,
    )
    fields += (case.weight_offset, case.training, case.momentum, case.eps)
    return "|".join(map(str, fields))


def scopes(cases: Iterable[Case]) -> dict[str, str]:
    """Case id -> signature, for the scheduler's lookups by node id."""
    return {case.id: signature(case) for case in cases}


def group_key(backend: str, signature: str) -> str:
    """The scope of a backend's checks of the cases of one signature."""
    return f"{backend}::{signature}"


def _named_key(test: str, backend: str, name: str) -> str:
    """The scope of one other suite test (a fingerprint question, a property)."""
    return f"{test}[{backend}:{name}]"


def test_key(nodeid: str) -> str:
    """A node id's ``check[backend:name]`` (the file path before it depends on how pytest was invoked);
    any other node id as it is."""
    match = NODE_ID.search(nodeid)
    return nodeid if match is None else _named_key(match["check"], match["backend"], match["case"])


def record_key(record: Mapping[str, Any], groups: Mapping[str, str]) -> str | None:
    """The scope a results record's test belonged to; ``groups`` maps case ids to signatures."""
    kind, backend = record.get("kind", "result"), str(record.get("backend"))
    if kind == "result":
        case = record.get("case")
        signature = groups.get(str(case.get("id"))) if isinstance(case, Mapping) else None
        return None if signature is None else group_key(backend, signature)
    if kind in _RECORD_TESTS:
        test, field = _RECORD_TESTS[kind]
        return _named_key(test, backend, str(record.get(field)))
    return None


def seconds(records: Iterable[Mapping[str, Any]], groups: Mapping[str, str]) -> dict[str, float]:
    """Scope -> the seconds its records' tests took."""
    total: dict[str, float] = {}
    for record in records:
        key = record_key(record, groups)
        if key is not None:
            duration = record.get("duration_s")
            total[key] = total.get(key, 0.0) + (float(duration) if isinstance(duration, int | float) else 0.0)
    return total


def path() -> Path | None:
    base = cache.root()
    return None if base is None else base / FILE


def read() -> dict[str, float]:
    """Scope -> seconds from earlier runs; empty without a cache or a readable file (then xdist's order)."""
    file = path()
    try:
        raw = json.loads(file.read_text()) if file is not None else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float)}


def update(found: Mapping[str, float]) -> None:
    """Merge this run's scopes into the file (theirs replaced, the others kept); written whole."""
    file = path()
    if file is None or not found:
        return
    merged = {**read(), **found}
    cache.folder()  # the folder and its tag
    cache.store(file, json.dumps(merged, sort_keys=True, indent=0).encode())
