"""The aliasing evidence: where buffers live (conformance.adapter.memory) and what the check concludes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conformance.adapter.backend import Capabilities
from conformance.adapter.memory import Span, UnlocatableBuffer, Watch, problems, span
from conformance.judging.ledger import Ledger
from conformance.judging.tolerances import read_tolerances
from conformance.model.case import Case
from conformance.running.checks import CheckContext, run_check


def test_numpy_views_overlap_their_base_and_not_their_neighbours() -> None:
    base = np.zeros((4, 8), dtype=np.float32)
    top, bottom = base[:2], base[2:]
    assert span("a", top).overlaps(span("b", base))
    assert not span("a", top).overlaps(span("b", bottom))
    # A strided view spans from its first to its last element.
    column = base[:, 3]
    assert span("c", column).overlaps(span("d", bottom))
    assert not span("c", column).overlaps(span("e", np.zeros(4)))


class TensorLike:
    """What span() reads of a torch tensor: data_ptr(), stride() in elements, element_size(), shape."""

    def __init__(
        self, address: int, shape: tuple[int, ...], strides: tuple[int, ...], size: int, device: str
    ):
        self.address, self.shape, self.strides, self.size, self.device = address, shape, strides, size, device

    def data_ptr(self) -> int:
        return self.address

    def stride(self) -> tuple[int, ...]:
        return self.strides

    def element_size(self) -> int:
        return self.size


def test_tensor_spans_use_element_strides_and_keep_devices_apart() -> None:
    a = TensorLike(1000, (2, 3), (3, 1), 2, "cuda:0")
    assert span("a", a) == Span(1000, 1012, "cuda:0")
    assert span("b", TensorLike(1010, (1,), (1,), 2, "cuda:0")).overlaps(span("a", a))
    # The same addresses on another device are other memory.
    assert not span("c", TensorLike(1000, (6,), (1,), 2, "cpu")).overlaps(span("a", a))


def test_an_unlocatable_buffer_is_an_error_naming_its_key() -> None:
    with pytest.raises(UnlocatableBuffer, match=r"buffers\(\)\['y'\] is list"):
        span("y", [1.0, 2.0])
    assert span("z", (4096, 64)) == Span(4096, 4160)


def _watch(inputs: dict[str, Any], outputs: dict[str, Any]) -> Watch:
    names = tuple(outputs)
    watch = Watch.start(object(), inputs, names)
    watch.finish(object(), outputs, names)
    return watch


def test_problems_name_undeclared_sharing_and_writes() -> None:
    x, residual = np.ones(4, np.float32), np.ones(4, np.float32)
    watch = Watch.start(object(), {"x": x, "residual": residual}, ("y", "residual_out"))
    residual += x  # an in-place update of the residual stream
    watch.finish(object(), {"y": x * 2, "residual_out": residual}, ("y", "residual_out"))
    found = problems(watch, {}, {"x": x, "residual": residual}, {"residual_out": residual.copy()})
    assert any("output 'residual_out' shares memory with input 'residual'" in p for p in found)
    assert any("input 'residual' was written by the call" in p for p in found)
    # Declared, the same memory is fine: the input holds the output returned.
    assert (
        problems(watch, {"residual_out": "residual"}, {"residual": residual}, {"residual_out": residual})
        == []
    )


def test_a_declared_inplace_input_must_hold_its_output() -> None:
    residual = np.ones(4, np.float32)
    watch = Watch.start(object(), {"residual": residual}, ("residual_out",))
    residual[...] = 5.0
    watch.finish(object(), {"residual_out": np.full(4, 6.0, np.float32)}, ("residual_out",))
    found = problems(
        watch, {"residual_out": "residual"}, {"residual": residual}, {"residual_out": np.full(4, 6.0)}
    )
    assert found == [
        "input 'residual' is declared as 'residual_out''s buffer but does not hold the "
        "'residual_out' returned"
    ]


def test_two_outputs_in_one_buffer_fail_unless_declared() -> None:
    grad = np.zeros(4, np.float32)
    watch = _watch({"x": np.ones(4, np.float32)}, {"dx": grad, "dresidual": grad})
    assert (
        problems(watch, {}, {}, {})
        and "outputs 'dresidual' and 'dx' share memory" in problems(watch, {}, {}, {})[0]
    )
    assert problems(watch, {"dresidual": "dx"}, {}, {}) == []


class _Reporting:
    """A backend whose prepared call reports its buffers, one of them not a buffer at all."""

    name = "reports-junk"

    def capabilities(self) -> Capabilities:
        return Capabilities(ops=frozenset({"layer_norm"}), dtypes=frozenset({"float32"}))

    def prepare(self, case: Case, inputs: dict[str, np.ndarray], *, grad: bool) -> Any:
        class Prepared:
            def __call__(self) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def outputs(self) -> dict[str, np.ndarray]:
                return {"y": np.zeros(case.shape, np.float32)}

            def buffers(self) -> dict[str, object]:
                return {"x": "somewhere"}

        return Prepared()


def test_buffers_that_cannot_be_located_are_that_backends_error() -> None:
    backend = _Reporting()
    case = Case("layer_norm", (2, 8), "float32", 1e-5)
    ctx = CheckContext(read_tolerances(), Ledger("", "", ()), 30.0)
    result = run_check("aliasing", backend, backend.capabilities(), case, ctx)
    assert result.outcome == "error"
    assert "buffers()['x'] is str" in result.reason
