"""Signature grouping under pytest-xdist: the tests that share a backend's preparation go to one worker.

Backends that compile or export (torch-compile, onnx-export) cache their work per process by the case's
signature: every Case field except the shape and the input distribution. xdist's default ``load``
distribution deals tests out one by one, so each worker pays for nearly every export and compile
once more. Grouping a backend's tests by signature (xdist's ``loadscope`` machinery with normconf's
own scope) pays for each once per run, and keeps the ``load`` behaviour for everything else: a test
that is not a backend x case test is its own scope.

Scopes are dealt out slowest first, by the seconds their tests took in earlier runs (the durations
file in the graph cache, conformance/running/durations.py) when there are any, so the run does not
end on one worker finishing a long compile while the other waits; without them, xdist's order (most
tests first). The signature itself is defined in durations.py, which the writing process also uses.

Only imported when pytest-xdist is present (the plugin imports it from xdist's scheduler hook).
"""

from __future__ import annotations

from collections.abc import Mapping

from xdist.scheduler import LoadScopeScheduling

from conformance.running.durations import group_key, test_key
from conformance.running.nodeid import NODE_ID


class SignatureScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type stubs
    """``loadscope`` with the scope (backend, case signature); other tests are scopes of their own.
    With ``seconds`` (durations.read() of earlier runs) the slowest scopes go out first."""

    def __init__(
        self,
        config: object,
        log: object,
        groups: Mapping[str, str],
        seconds: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(config, log)
        self._groups = groups
        self._seconds = dict(seconds or {})
        self._ordered = False
        self._positions: dict[object, dict[str, int]] = {}

    def _assign_work_unit(self, node: object) -> None:
        """Order the queue slowest first once, before the first unit goes out; then send the next
        unit as ``loadscope`` does, its tests found by a table of the worker's collection where
        ``loadscope`` searches the list for each (O(collection) a test: over a 49,000-test run, ~20 s
        of the controller's CPU, on the cores the workers need)."""
        if not self._ordered:
            self._ordered = True
            if self._seconds:
                ordered = sorted(self.workqueue.items(), key=lambda item: self._estimate(*item), reverse=True)
                self.workqueue.clear()
                self.workqueue.update(ordered)
        scope, unit = self.workqueue.popitem(last=False)
        self.assigned_work.setdefault(node, {})[scope] = unit
        positions = self._positions.get(node)
        if positions is None:
            collection = self.registered_collections[node]
            positions = self._positions[node] = {nodeid: i for i, nodeid in enumerate(collection)}
        node.send_runtest_some([positions[nodeid] for nodeid, done in unit.items() if not done])  # type: ignore[attr-defined]

    def mark_test_complete(self, node: object, item_index: int, duration: float = 0) -> None:
        """``loadscope``'s, with a finished scope dropped from the worker's assigned work: ``loadscope``
        counts a worker's pending tests over every scope it was ever given, on each completed test
        (~20 s of the controller's CPU over a 49,000-test run); only unfinished scopes count."""
        nodeid = self.registered_collections[node][item_index]
        scope = self._split_scope(nodeid)
        work = self.assigned_work[node]
        work[scope][nodeid] = True
        if all(work[scope].values()):
            del work[scope]
        self._reschedule(node)

    def _estimate(self, scope: str, tests: Mapping[str, bool]) -> tuple[bool, float]:
        """(new to this run, seconds last run): a scope without history goes first (its cost is
        unknown; a new backend or signature may compile for minutes), most tests first among those."""
        known = self._seconds.get(test_key(scope))
        return (True, float(len(tests))) if known is None else (False, known)

    def remove_node(self, node: object) -> str | None:
        """A worker went away: its unfinished tests go back to the queue, except the one it crashed in.

        xdist reports that test as crashed; ``loadscope`` would queue it again with the rest of its
        scope, and a test that crashes its worker every time would then take down worker after worker.
        """
        workload = self.assigned_work.pop(node)
        self._positions.pop(node, None)
        pending = [(scope, test) for scope, unit in workload.items() for test, ok in unit.items() if not ok]
        if not pending:
            return None
        scope, crashed = pending[0]  # a worker runs its tests in order: the first unfinished one crashed
        workload[scope][crashed] = True
        for scope, unit in workload.items():
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            # A replacement worker whose collection has not arrived yet gets its work from schedule()
            # once it does; assigning it now would fail on the missing collection.
            if other in self.registered_collections:
                self._reschedule(other)
        return str(crashed)

    def _split_scope(self, nodeid: str) -> str:
        match = NODE_ID.search(nodeid)
        if match is None or match["case"] not in self._groups:
            return nodeid
        return group_key(match["backend"], self._groups[match["case"]])
