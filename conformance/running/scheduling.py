"""Signature grouping under pytest-xdist: the tests that share a backend's preparation go to one worker.

Backends that compile or export (torch-compile, onnx-export) cache their work per process by the case's
signature: every Case field except the shape and the input distribution. xdist's default ``load``
distribution deals tests out one by one, so each worker pays for nearly every export and compile
once more. Grouping a backend's tests by signature (xdist's ``loadscope`` machinery with normconf's
own scope) pays for each once per run, and keeps the ``load`` behaviour for everything else: a test
that is not a backend x case test is its own scope.

Only imported when pytest-xdist is present (the plugin imports it from xdist's scheduler hook).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from xdist.scheduler import LoadScopeScheduling

from conformance.model.case import Case
from conformance.running.nodeid import NODE_ID


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


class SignatureScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type stubs
    """``loadscope`` with the scope (backend, case signature); other tests are scopes of their own."""

    def __init__(self, config: object, log: object, groups: Mapping[str, str]) -> None:
        super().__init__(config, log)
        self._groups = groups

    def remove_node(self, node: object) -> str | None:
        """A worker went away: its unfinished tests go back to the queue, except the one it crashed in.

        xdist reports that test as crashed; ``loadscope`` would queue it again with the rest of its
        scope, and a test that crashes its worker every time would then take down worker after worker.
        """
        workload = self.assigned_work.pop(node)
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
        return f"{match['backend']}::{self._groups[match['case']]}"
