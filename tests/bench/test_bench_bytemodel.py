"""The benchmarks' byte model: compulsory activation bytes per check, weights and statistics apart."""

from __future__ import annotations

import math

import pytest

from conformance.bench.bytemodel import traffic
from conformance.model.case import Case
from conformance.model.dtypes import numpy_dtype


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


@pytest.mark.parametrize(
    ("op", "tensors"), [("layer_norm", 5), ("rms_norm", 5), ("add_rms_norm", 9), ("add_layer_norm", 9)]
)
def test_backward_benchmark_counts_forward_plus_backward(op: str, tensors: int) -> None:
    # The timed call runs both passes: forward (x, y; add: x, residual, y, residual_out), then
    # backward (x, dy, dx; add: h, dy, dresidual_out, dx, dresidual).
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


@pytest.mark.parametrize(
    "case",
    [
        Case("group_norm", (2, 320, 64, 64), "float32", 1e-5, num_groups=32),
        Case("group_norm", (4, 8), "bfloat16", 1e-5, num_groups=2, param_dtype="float32"),
        Case("instance_norm", (4, 64, 32, 32), "float16", 1e-5),
        Case("instance_norm", (2, 3, 4, 5, 6), "float32", 1e-5, layout="channels_last"),
    ],
    ids=lambda case: case.id,
)
def test_group_ops_read_x_write_y_and_backward_reads_x_dy_writes_dx(case: Case) -> None:
    # Channels-last moves the same bytes: the layout reorders them, it adds none.
    tensor = math.prod(case.shape) * numpy_dtype(case.dtype).itemsize
    assert traffic(case, "forward").activations == 2 * tensor
    assert traffic(case, "backward").activations == (2 + 3) * tensor


def test_group_norm_weights_are_per_channel_with_statistics_per_sample_and_group() -> None:
    case = Case("group_norm", (2, 320, 64, 64), "bfloat16", 1e-5, num_groups=32, param_dtype="float32")
    param, stats = 320 * 4, 2 * 32 * 2 * 4  # weight/bias (C,) in float32; mean and rstd per (n, group)
    assert traffic(case, "forward").weights == 2 * param
    # forward reads weight + bias; backward reads weight, writes dweight + dbias; stats written and read.
    assert traffic(case, "backward").weights == 2 * param + 3 * param + 2 * stats


def test_instance_norm_statistics_are_per_sample_and_channel() -> None:
    case = Case("instance_norm", (4, 64, 32, 32), "float32", 1e-5, weight=False, bias=False)
    assert traffic(case, "forward").weights == 0  # torch's default: no affine, no running statistics
    assert traffic(case, "backward").weights == 2 * (4 * 64 * 2 * 4)


def test_instance_norm_training_reads_and_writes_running_statistics() -> None:
    case = Case("instance_norm", (8, 4, 10), "float32", 1e-5, training=True, track_running_stats=True)
    param, stats = 4 * 4, 8 * 4 * 2 * 4
    assert traffic(case, "forward").weights == (2 + 4) * param
    assert traffic(case, "backward").weights == (2 + 4) * param + 3 * param + 2 * stats


@pytest.mark.parametrize(
    "case",
    [
        Case("instance_norm", (8, 4, 10), "float32", 1e-5, track_running_stats=True),
        Case("batch_norm", (8, 4, 10), "float32", 1e-5),
    ],
    ids=lambda case: case.id,
)
def test_eval_with_running_statistics_saves_none_and_reads_them_again(case: Case) -> None:
    """The running statistics normalize: the forward reads them, saves no per-group statistics, and
    the backward reads them again for rstd (dx) and xhat (dweight)."""
    param = 4 * 4
    assert traffic(case, "forward").weights == (2 + 2) * param
    assert traffic(case, "backward").weights == (2 + 2) * param + (3 + 2) * param


def test_float32_residual_stream_counts_its_tensors_at_four_bytes() -> None:
    # bfloat16 x, y, dy, dx (2 bytes); residual, residual_out, h, dresidual_out, dresidual in float32.
    case = Case("add_layer_norm", (16, 256), "bfloat16", 1e-5, residual_dtype="float32")
    elements = 16 * 256
    assert traffic(case, "forward").activations == elements * (2 * 2 + 2 * 4)
    assert traffic(case, "backward").activations == elements * (2 * 2 + 2 * 4 + 2 * 2 + 3 * 4)
