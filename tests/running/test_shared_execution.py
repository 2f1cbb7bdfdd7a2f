"""A case's checks share executions: backward, inputs_unchanged, aliasing and determinism read one
prepare and two calls; forward and training one call. A fault in a second call is still charged to
determinism alone, and a second run over the same case runs afresh."""

from __future__ import annotations

from collections import Counter

from conformance.judging.ledger import Ledger
from conformance.judging.tolerances import read_tolerances
from conformance.model.case import Case
from conformance.running.checks import CHECK_NAMES, CheckContext, run_check

from fakes.core import NumpyFake, Prepared

CTX = CheckContext(read_tolerances(), Ledger("", "", ()), 30.0)
TRAINING = Case("batch_norm", (8, 3, 5), "float32", 1e-5, training=True)


class _Counted(Prepared):
    def __call__(self) -> None:
        self.fake.calls[self.grad] += 1
        if self.fake.fail_second and self.fake.calls[self.grad] == 2:
            raise RuntimeError("second call lost its workspace")
        super().__call__()


class Counting(NumpyFake):
    """Correct; counts prepares and calls per grad. ``fail_second``: the second call of a prepared
    gradient run raises (a deliberately broken backend whose first call is right)."""

    name = "fake-counting"

    def __init__(self, fail_second: bool = False) -> None:
        self.prepares: Counter[bool] = Counter()
        self.calls: Counter[bool] = Counter()
        self.fail_second = fail_second

    def prepare(self, case, inputs, *, grad):
        self.prepares[grad] += 1
        self.calls[grad] = 0 if self.fail_second else self.calls[grad]
        return _Counted(self, case, inputs, grad)


def _run_all(backend: NumpyFake, case: Case) -> dict[str, str]:
    caps = backend.capabilities()
    return {check: run_check(check, backend, caps, case, CTX).outcome for check in CHECK_NAMES}


def test_a_cases_checks_make_one_forward_run_and_one_gradient_run():
    backend = Counting()
    assert set(_run_all(backend, TRAINING).values()) == {"passed"}
    # forward and training: one call; backward, inputs_unchanged, aliasing, determinism: two calls.
    assert backend.prepares == {False: 1, True: 1}
    assert backend.calls == {False: 1, True: 2}


def test_running_the_checks_again_runs_them_again():
    backend = Counting()
    _run_all(backend, TRAINING)
    _run_all(backend, TRAINING)
    assert backend.prepares == {False: 2, True: 2} and backend.calls == {False: 2, True: 4}


def test_a_fault_in_the_second_call_is_charged_to_determinism_alone():
    backend = Counting(fail_second=True)
    outcomes = _run_all(backend, TRAINING)
    assert outcomes.pop("determinism") == "error"
    assert set(outcomes.values()) == {"passed"}, outcomes
