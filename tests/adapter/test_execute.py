"""conformance.adapter.execute: the call deadline and the validation of what an adapter returns."""

from __future__ import annotations

import threading
import warnings

import ml_dtypes
import numpy as np
import pytest

from conformance.adapter.backend import Unsupported
from conformance.adapter.execute import AdapterError, CallTimeout, run_backend, with_deadline
from conformance.model.case import Case

CASE = Case("layer_norm", (2, 3), "float32", 1e-5)
SHAPES = {"y": (2, 3)}
SHORT = 0.2  # seconds; the blocked worker waits on an Event, so nothing sleeps past the test


def release(event: threading.Event, what: str) -> None:
    """Let an abandoned worker finish and wait for it, so no thread outlives its test."""
    event.set()
    for thread in threading.enumerate():
        if thread.name == f"normconf:{what}":
            thread.join(5)


# ---------------------------------------------------------------- with_deadline


def test_with_deadline_returns_the_value():
    assert with_deadline(lambda: 42, 5, "quick") == 42


def test_with_deadline_times_out_on_slow_work():
    event = threading.Event()
    try:
        with pytest.raises(CallTimeout) as info:
            with_deadline(lambda: event.wait(10), SHORT, "slow work")
        assert str(info.value) == "slow work did not finish within 0.2 s (--call-timeout)"
        assert isinstance(info.value, AdapterError)
    finally:
        release(event, "slow work")


def test_with_deadline_re_raises_the_worker_exception():
    error = ValueError("boom")

    def work():
        raise error

    with pytest.raises(ValueError) as info:
        with_deadline(work, 5, "failing work")
    assert info.value is error


def test_with_deadline_re_raises_base_exceptions_too():
    class Stop(BaseException):
        pass

    def work():
        raise Stop

    with pytest.raises(Stop):
        with_deadline(work, 5, "stopping work")


def test_worker_runs_in_a_daemon_thread():
    seen = {}

    def work():
        seen["daemon"] = threading.current_thread().daemon
        seen["name"] = threading.current_thread().name

    with_deadline(work, 5, "where")
    assert seen == {"daemon": True, "name": "normconf:where"}


# ---------------------------------------------------------------- run_backend with an inline fake


class Prepared:
    def __init__(self, backend: Fake, inputs) -> None:
        self.backend, self.inputs = backend, inputs

    def __call__(self) -> None:
        self.backend.calls += 1
        if self.backend.call_error is not None:
            raise self.backend.call_error
        if self.backend.block is not None:
            self.backend.block.wait(10)
        self.inputs["x"][...] = 0  # an adapter scribbling on its inputs: run_backend must have copied them

    def synchronize(self) -> None:
        pass

    def outputs(self):
        return self.backend.result


class Fake:
    name = "fake-inline"

    def __init__(self, result=None, *, prepare_error=None, call_error=None, warn=None, block=None) -> None:
        self.result = {"y": np.ones((2, 3), np.float32)} if result is None else result
        self.prepare_error, self.call_error, self.warn, self.block = prepare_error, call_error, warn, block
        self.calls = 0

    def prepare(self, case, inputs, *, grad):
        if self.warn:
            warnings.warn(self.warn, UserWarning, stacklevel=1)
        if self.prepare_error is not None:
            raise self.prepare_error
        return Prepared(self, inputs)


def run(backend, *, calls=1, shapes=SHAPES, timeout=5.0):
    inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    return inputs, run_backend(
        backend, CASE, inputs, grad=False, calls=calls, expected_shapes=shapes, timeout=timeout
    )


def test_run_returns_copies_of_each_call_and_the_inputs_as_left():
    backend = Fake()
    inputs, result = run(backend, calls=2)
    assert backend.calls == 2
    assert len(result.outputs) == 2
    for outputs in result.outputs:
        assert list(outputs) == ["y"]
        np.testing.assert_array_equal(outputs["y"], np.ones((2, 3)))
        assert outputs["y"] is not backend.result["y"]  # a later call may reuse the adapter's buffer
    np.testing.assert_array_equal(inputs["x"], np.arange(6).reshape(2, 3))  # caller's arrays untouched
    assert not result.inputs["x"].any()  # what the adapter left behind is reported
    assert result.warnings == ()


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16])
def test_any_float_dtype_is_accepted(dtype):
    _, result = run(Fake({"y": np.ones((2, 3), dtype)}))
    assert result.outputs[0]["y"].dtype == np.dtype(dtype)


def test_extra_outputs_are_ignored():
    _, result = run(Fake({"y": np.ones((2, 3)), "mean": np.zeros(2)}))
    assert list(result.outputs[0]) == ["y"]


@pytest.mark.parametrize(
    ("returned", "words"),
    [
        ([np.ones((2, 3))], "outputs() returned list, expected a mapping of NumPy arrays"),
        (None, "outputs() returned NoneType"),
        ({"dx": np.ones((2, 3))}, "outputs() is missing ['y']; returned keys ['dx']"),
        ({"y": [[1.0] * 3] * 2}, "output 'y' is list, expected a NumPy array"),
        ({"y": np.ones((2, 3), np.int64)}, "output 'y' has dtype int64, expected a floating dtype"),
        ({"y": np.ones((2, 3), bool)}, "output 'y' has dtype bool, expected a floating dtype"),
        ({"y": np.ones((2, 3), np.complex128)}, "output 'y' has dtype complex128"),
        ({"y": np.ones((3, 2), np.float32)}, "output 'y' has shape (3, 2), expected (2, 3)"),
        ({"y": np.ones(6, np.float32)}, "output 'y' has shape (6,), expected (2, 3)"),
    ],
)
def test_outputs_outside_the_contract_are_adapter_errors(returned, words):
    backend = Fake()
    backend.result = returned
    with pytest.raises(AdapterError) as info:
        run(backend)
    assert words in str(info.value)


def test_unsupported_from_prepare_passes_through():
    with pytest.raises(Unsupported, match="no multi-axis"):
        run(Fake(prepare_error=Unsupported("no multi-axis")))


def test_unsupported_after_prepare_is_an_adapter_error():
    with pytest.raises(
        AdapterError, match=r"Unsupported raised from __call__\(\); it is honoured only from prepare\(\)"
    ):
        run(Fake(call_error=Unsupported("late")))


def test_exception_from_a_stage_names_it_and_chains_the_cause():
    error = ZeroDivisionError("division by zero in kernel")
    with pytest.raises(AdapterError) as info:
        run(Fake(call_error=error))
    assert str(info.value) == "__call__() raised ZeroDivisionError: division by zero in kernel"
    assert info.value.__cause__ is error


def test_exception_from_prepare_is_an_adapter_error():
    with pytest.raises(AdapterError, match=r"prepare\(\) raised KeyError"):
        run(Fake(prepare_error=KeyError("weight")))


def test_adapter_warnings_are_recorded_once_not_raised():
    # pytest runs this suite with warnings as errors: run_backend must record the adapter's warnings.
    _, result = run(Fake(warn="falling back to the slow path"), calls=2)
    assert result.warnings == ("UserWarning: falling back to the slow path",)


def test_a_hung_adapter_times_out_naming_backend_and_case():
    event = threading.Event()
    what = f"fake-inline {CASE.id}"
    try:
        with pytest.raises(CallTimeout, match=f"^{what} did not finish within 0.2 s"):
            run(Fake(block=event), timeout=SHORT)
    finally:
        release(event, what)


def test_timeout_leaves_the_warning_filters_as_they_were():
    event = threading.Event()
    what = f"fake-inline {CASE.id}"
    before = list(warnings.filters)
    try:
        with pytest.raises(CallTimeout):
            run(Fake(block=event), timeout=SHORT)
        assert warnings.filters == before
        with pytest.raises(UserWarning, match="after a timeout"):
            warnings.warn("after a timeout", UserWarning, stacklevel=1)
    finally:
        release(event, what)


def test_prepared_info_is_recorded_when_given():
    class WithInfo:
        name = "fake-info"

        def prepare(self, case, inputs, *, grad):
            class P:
                def __call__(self):
                    pass

                def synchronize(self):
                    pass

                def outputs(self):
                    return {"y": np.zeros(case.shape, np.float32)}

                def info(self):
                    return {"opset": 18, "provider": "CPUExecutionProvider", "obj": object}

            return P()

    from conformance.adapter.execute import run_backend

    ran = run_backend(
        WithInfo(),
        CASE,
        {"x": np.zeros(CASE.shape, np.float32)},
        grad=False,
        calls=1,
        expected_shapes={"y": CASE.shape},
        timeout=5,
    )
    assert ran.info["opset"] == 18 and ran.info["provider"] == "CPUExecutionProvider"
    assert isinstance(ran.info["obj"], str)
