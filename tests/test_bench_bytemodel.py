"""The benchmarks' byte model: compulsory activation bytes per check, weights and statistics apart."""

from __future__ import annotations

import pytest

from conformance.bench.bytemodel import traffic
from conformance.model.case import Case


def test_layer_norm_forward_reads_x_and_writes_y() -> None:
    case = Case("layer_norm", (4, 64), "float32", 1e-5)
    t = traffic(case, "forward")
    assert t.activations == 2 * 4 * 64 * 4
    assert t.weights == 2 * 64 * 4  # weight and bias read once


def test_rms_norm_half_activations_with_float32_weight() -> None:
    case = Case("rms_norm", (8, 128), "bfloat16", 1e-5, param_dtype="float32")
    t = traffic(case, "forward")
    assert t.activations == 2 * 8 * 128 * 2
    assert t.weights == 128 * 4


def test_add_rms_norm_forward_moves_four_tensors() -> None:
    case = Case("add_rms_norm", (2, 8192), "float16", 1e-5)
    assert traffic(case, "forward").activations == 4 * 2 * 8192 * 2


@pytest.mark.parametrize(("op", "tensors"), [("layer_norm", 5), ("rms_norm", 5), ("add_rms_norm", 7)])
def test_backward_benchmark_counts_forward_plus_backward(op: str, tensors: int) -> None:
    # The timed call runs both passes: forward (x, y; add: x, residual, y, residual_out), then
    # backward (x, dy, dx).
    case = Case(op, (16, 256), "float32", 1e-5)
    assert traffic(case, "backward").activations == tensors * 16 * 256 * 4


def test_backward_weights_include_gradients_and_saved_statistics() -> None:
    case = Case("layer_norm", (16, 256), "float32", 1e-5)
    param, stats = 256 * 4, 16 * 2 * 4  # mean and rstd per row, float32
    # forward reads weight + bias; backward reads weight, writes dweight + dbias; stats written and read.
    assert traffic(case, "backward").weights == 2 * param + 3 * param + 2 * stats


def test_weights_never_count_as_activation_bytes() -> None:
    with_affine = Case("layer_norm", (4, 64), "float32", 1e-5)
    without = Case("layer_norm", (4, 64), "float32", 1e-5, weight=False, bias=False)
    assert traffic(with_affine, "forward").activations == traffic(without, "forward").activations
    assert traffic(without, "forward").weights == 0


def test_batch_norm_training_reads_and_writes_running_statistics() -> None:
    case = Case("batch_norm", (8, 4, 10), "float32", 1e-5, training=True)
    assert traffic(case, "forward").weights == (2 + 4) * 4 * 4
    assert traffic(case, "forward").activations == 2 * 8 * 4 * 10 * 4


def test_unknown_check_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="check='training' is not allowed; allowed: forward, backward"):
        traffic(Case("layer_norm", (4, 64), "float32", 1e-5), "training")
