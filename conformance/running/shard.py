"""``--shard K/N``: a deterministic split of the suite's tests into N disjoint parts.

Whole cases go to one shard (every backend and check of a case runs together, so its inputs and
oracle are computed once), dealt round-robin over the sorted case ids; the N shards together run
exactly the unsharded suite, whichever machine runs each.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")

T = TypeVar("T")


class ShardError(ValueError):
    """A malformed ``--shard`` value."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def to_dict(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}


def parse(spec: str) -> Shard:
    match = _SPEC.match(spec)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise ShardError(f"--shard={spec!r} is not allowed; allowed: K/N with 1 <= K <= N, e.g. 1/4")
    return Shard(int(match[1]), int(match[2]))


def _stable_hash(text: str) -> int:
    # Python's hash() is salted per process; shards on different machines must agree.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def select(
    items: Iterable[T], shard: Shard, key: Callable[[T], str | None], nodeid: Callable[[T], str]
) -> list[T]:
    """The items of ``shard``: by position of ``key(item)`` (a case id) among the sorted keys.

    Items without a key (not a parametrized conformance test) go by a stable hash of their node id.
    """
    items = list(items)
    keys = sorted({k for k in map(key, items) if k is not None})
    position = {k: i for i, k in enumerate(keys)}
    chosen = []
    for item in items:
        k = key(item)
        slot = position[k] if k is not None else _stable_hash(nodeid(item))
        if slot % shard.count == shard.index - 1:
            chosen.append(item)
    return chosen
