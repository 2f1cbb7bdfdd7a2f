"""The fingerprint's probe cases: one small case per question, with crafted inputs (probes.py).

Each function returns a ``Probe``: the case run through the backend, its inputs, whether gradients
are asked, and which outputs are judged. Values are chosen so that conventions disagree by far more
than rounding; docs/fingerprints.md gives the reasoning per question.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from conformance.fingerprint import probes
from conformance.model.case import GROUP_NORM, Case
from conformance.model.dtypes import finfo, round_to


@dataclass(frozen=True)
class Probe:
    """The case run through the backend, its inputs, which outputs are judged, and (bitwise
    questions) the elements on which the hypotheses are known to round differently."""

    case: Case
    inputs: Mapping[str, np.ndarray]
    grad: bool
    outputs: tuple[str, ...]
    mask: Mapping[str, np.ndarray] = field(default_factory=dict)

    def without_bias(self) -> Probe | None:
        """The probe for a class that has no bias (CohereLayerNorm): the case with bias=False and no bias
        input, where the probe's bias is all zeros, so that every hypothesis predicts the same outputs
        without it; None where the probe has no bias or a non-zero one (the bias question itself)."""
        bias = self.inputs.get("bias")
        if not self.case.bias or bias is None or np.any(np.asarray(bias, dtype=np.float64) != 0):
            return None
        return replace(
            self,
            case=replace(self.case, bias=False),
            inputs={name: value for name, value in self.inputs.items() if name != "bias"},
            outputs=tuple(out for out in self.outputs if out != "dbias"),
            mask={out: m for out, m in self.mask.items() if out != "dbias"},
        )


def row_probe(case: Case, x: np.ndarray, outputs: tuple[str, ...] = ("y",), **params: np.ndarray) -> Probe:
    return Probe(case, probes.rows(case, x, **params), False, outputs)


# eps probes use eps = 1e-2, a value the ci profile's eps sweep has, so backends that compile or
# export per eps value reuse what the checks built; rows of +-1/8 and +-1/16 (variance 1/64, 1/256)
# keep var and eps comparable. 1e-2 is not a float32, so the eps precision question can use it too.
EPS_VALUE = 1e-2
EPS_SCALES = [2.0**-3, 2.0**-4]


def eps_row(op: str, dtype: str = "float32") -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case(op, (2, 4), dtype, EPS_VALUE)
        return row_probe(case, probes.alternating(EPS_SCALES, 4))

    return make


def eps_bn(dtype: str = "float32") -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("batch_norm", (4, 2), dtype, EPS_VALUE)
        columns = probes.alternating(EPS_SCALES, 4).T
        variances = np.square(np.array(EPS_SCALES))
        return Probe(case, probes.channels(case, columns, running_var=variances), False, ("y",))

    return make


# Execution precision. float64 inputs: values of 2^-80, whose squares (2^-160) are far below float32's
# smallest subnormal (2^-149): in float64 the rows normalize to +-1; computed in float32 (or bfloat16, of
# the same range) the variance underflows to 0 with eps 1e-60 (also 0 there), and y is +-inf. The
# rows' mean is 0, so a one-pass variance is as exact as a two-pass one.
TINY = 2.0**-80
TINY_EPS = 1e-60
# float32 and float16 inputs: 1 +- 2^-9 is a float32 and a float16 but not a bfloat16 (whose step at 1
# is 2^-7): in float32 or float16 (statistics in float32) the centred rows normalize to +-1 (one-pass or
# two-pass: 1 + 2^-18 is a float32 too); rounded to bfloat16 they are constant and y is 0. The first row
# is the same in every dtype.
HALF_STEP = 2.0**-9
CANCEL_EPS = 1e-12


_SIGNS = np.array([[1.0, -1.0, 1.0, -1.0], [1.0, -1.0, -1.0, 1.0], [1.0, 1.0, -1.0, -1.0]])


def _cancelling_rows(count: int) -> np.ndarray:
    """One row of +-1, then rows of 1 +- 2^-9 (the float32 execution probes' values)."""
    return np.vstack([_SIGNS[:1], 1.0 + HALF_STEP * np.resize(_SIGNS[1:], (count - 1, 4))])


def execution_row(op: str, dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        if dtype == "float64":
            case = Case(op, (2, 4), dtype, TINY_EPS)
            return row_probe(case, TINY * np.array([[1.0, -1.0, 1.0, -1.0], [2.0, -1.0, 1.0, -2.0]]))
        return row_probe(Case(op, (3, 4), dtype, CANCEL_EPS), _cancelling_rows(3))

    return make


def execution_add(op: str, dtype: str) -> Callable[[], Probe]:
    """The add ops' cancelling rows, made by the add: x of the execution rows and a residual of -1 (0 on
    the first row), so the sums are +-1, then +-2^-9 (exact in ``dtype``, float32 or float16). Rounded
    to bfloat16 first, x of 1 +- 2^-9 is 1 and the sums are 0: y = 0 for RMSNorm as for LayerNorm."""

    def make() -> Probe:
        case = Case(op, (3, 4), dtype, CANCEL_EPS)
        residual = np.vstack([np.zeros((1, 4)), -np.ones((2, 4))])
        return _with_residual(case, _cancelling_rows(3), residual, ("y",))

    return make


def execution_rms(dtype: str) -> Callable[[], Probe]:
    """RMSNorm has nothing to cancel in: 16 x 16 normal rows, weights ~ N(1, 0.25), read on the
    bfloat16 grid (questions.py: metric ``grid``)."""

    def make() -> Probe:
        case = Case("rms_norm", (16, 16), dtype, 1e-6)
        return row_probe(
            case, probes.seeded(31, case.shape), weight=probes.seeded(32, (16,), loc=1.0, scale=0.25)
        )

    return make


def execution_groups(op: str, dtype: str = "float32") -> Callable[[], Probe]:
    """The float32 (float16) execution probe's rows as the groups of a GN/IN case."""

    def make() -> Probe:
        return group_probe(op, _cancelling_rows(4), dtype, CANCEL_EPS)

    return make


def execution_bn(dtype: str) -> Callable[[], Probe]:
    """The same values as columns of an eval BatchNorm, its running statistics the rows' exact ones."""

    def make() -> Probe:
        if dtype == "float64":
            case = Case("batch_norm", (4, 2), dtype, TINY_EPS)
            columns = TINY * np.array([[1.0, -1.0, 1.0, -1.0], [2.0, -1.0, 1.0, -2.0]]).T
            mean, var = np.zeros(2), np.array([TINY**2, 2.5 * TINY**2])
        else:
            case = Case("batch_norm", (4, 2), dtype, CANCEL_EPS)
            columns = (1.0 + HALF_STEP * np.array([[1.0, -1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0]])).T
            mean, var = np.ones(2), np.full(2, HALF_STEP**2)
        return Probe(case, probes.channels(case, columns, running_mean=mean, running_var=var), False, ("y",))

    return make


def variance_ln() -> Probe:
    case = Case("layer_norm", (2, 4), "float32", 1e-12)
    return row_probe(case, np.array([[3.0, 1.0, -1.0, 1.0], [0.5, -0.25, 1.0, 0.75]]))


def variance_bn() -> Probe:
    case = Case("batch_norm", (4, 2), "float32", 1e-12, training=True)
    columns = np.array([[3.0, 1.0, -1.0, 1.0], [0.5, -0.25, 1.0, 0.75]]).T
    return Probe(case, probes.channels(case, columns), False, ("y",))


def passes_ln() -> Probe:
    case = Case("layer_norm", (2, 4), "float32", 1e-12)
    return row_probe(case, probes.cancelling("float32", 2))


def passes_bn() -> Probe:
    case = Case("batch_norm", (4, 2), "float32", 1e-12, training=True)
    return Probe(case, probes.channels(case, probes.cancelling("float32", 2).T), False, ("y",))


def stats_ln(dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("layer_norm", (6, 4), dtype, 1e-6)
        return row_probe(case, probes.off_grid_means(dtype, 6))

    return make


def stats_bn(dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("batch_norm", (4, 6), dtype, 1e-6, training=True)
        columns = probes.off_grid_means(dtype, 6).T
        return Probe(case, probes.channels(case, columns, running_mean=columns.mean(axis=0)), False, ("y",))

    return make


def stats_rms(dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("rms_norm", (64, 16), dtype, 1e-6)
        return row_probe(case, probes.seeded(7, case.shape))

    return make


def cast_rms() -> Probe:
    case = Case("rms_norm", (32, 16), "bfloat16", 1e-6)
    return row_probe(case, probes.seeded(11, case.shape), weight=probes.seeded(12, (16,), loc=1.0, scale=0.5))


def offset_rms() -> Probe:
    case = Case("rms_norm", (2, 8), "float32", 1e-12, weight_offset=1.0)
    return row_probe(case, probes.dyadic(3, case.shape), weight=probes.dyadic(4, (8,), step=2.0**-6) / 4)


def bn_update(momentum: float | None, *outputs: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("batch_norm", (4, 2), "float32", 1e-12, training=True, momentum=momentum)
        columns = np.array([[1.0, 0.0, 1.0, 0.0], [-1.0, -2.0, -1.0, 0.0]]).T
        inputs = probes.channels(case, columns, np.array([4.0, -6.0]), np.array([2.0, 3.0]))
        return Probe(case, inputs, False, outputs)

    return make


def dx_ln() -> Probe:
    case = Case("layer_norm", (3, 8), "float32", 1e-12)
    inputs = probes.rows(case, probes.dyadic(5, case.shape), weight=probes.dyadic(6, (8,), loc=1.0))
    inputs["dy"] = round_to(probes.dyadic(7, case.shape), "float32")
    return Probe(case, inputs, True, ("dx",))


def dx_bn() -> Probe:
    case = Case("batch_norm", (8, 3), "float32", 1e-12, training=True)
    inputs = probes.channels(case, probes.dyadic(8, case.shape), weight=probes.dyadic(9, (3,), loc=1.0))
    inputs["dy"] = round_to(probes.dyadic(10, case.shape), "float32")
    return Probe(case, inputs, True, ("dx",))


def bias_ln() -> Probe:
    case = Case("layer_norm", (2, 8), "float32", 1e-12)
    return row_probe(case, probes.dyadic(13, case.shape), bias=probes.dyadic(14, (8,)) + 1.0)


def bias_bn() -> Probe:
    case = Case("batch_norm", (4, 3), "float32", 1e-12)
    return Probe(
        case,
        probes.channels(case, probes.dyadic(15, case.shape), bias=np.array([1.0, -2.0, 3.0])),
        False,
        ("y",),
    )


def axes_row(op: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case(op, (2, 3, 4), "float32", 1e-12, norm_ndim=2)
        return row_probe(case, probes.dyadic(16, case.shape, loc=0.5))

    return make


def default_eps_row(op: str, dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case(op, (8, 8), dtype, 1e-5)  # eps unused: the probe runs through prepare_default_eps
        return row_probe(case, probes.ladder(8))

    return make


def default_eps_bn() -> Probe:
    case = Case("batch_norm", (8, 8), "float32", 1e-5)
    columns = probes.ladder(8).T
    return Probe(
        case, probes.channels(case, columns, running_var=np.square(columns).mean(axis=0)), False, ("y",)
    )


def eps_candidates(dtype: str) -> dict[str, float]:
    """Defaults seen in libraries: fixed constants, or the machine epsilon of the input dtype or of
    the float32 it is upcast to (torch.nn.RMSNorm's eps=None)."""
    named = {"0.001": 1e-3, "1e-05": 1e-5, "1e-06": 1e-6, "1e-08": 1e-8, "1e-12": 1e-12}
    for name in dict.fromkeys(("float32", dtype)):
        named[f"finfo({name}).eps"] = float(finfo(name).eps)
    return named


# ----------------------------------------------------------------------------- GroupNorm, InstanceNorm
def channel_case(op: str, rows: int, length: int, dtype: str, eps: float) -> Case:
    """A GN/IN case whose normalization groups, in order, are ``rows`` rows of ``length`` values: two
    groups per sample, each of two channels (GroupNorm) or one (InstanceNorm). Groups are contiguous
    in x, so a row probe's values become the groups unchanged."""
    if op == GROUP_NORM:
        return Case(op, (rows // 2, 4, length // 2), dtype, eps, num_groups=2)
    return Case(op, (rows // 2, 2, length), dtype, eps)


def group_probe(op: str, x: np.ndarray, dtype: str, eps: float) -> Probe:
    """A row probe's rows as the groups of a GN/IN case."""
    case = channel_case(op, x.shape[0], x.shape[1], dtype, eps)
    return Probe(case, probes.instances(case, x), False, ("y",))


def eps_groups(op: str) -> Callable[[], Probe]:
    def make() -> Probe:
        return group_probe(op, probes.alternating(EPS_SCALES, 4), "float32", EPS_VALUE)

    return make


def variance_groups(op: str) -> Callable[[], Probe]:
    def make() -> Probe:
        return group_probe(op, np.array([[3.0, 1.0, -1.0, 1.0], [0.5, -0.25, 1.0, 0.75]]), "float32", 1e-12)

    return make


def passes_groups(op: str) -> Callable[[], Probe]:
    def make() -> Probe:
        return group_probe(op, probes.cancelling("float32", 2), "float32", 1e-12)

    return make


def stats_groups(op: str, dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        return group_probe(op, probes.off_grid_means(dtype, 6), dtype, 1e-6)

    return make


def default_eps_groups(op: str) -> Callable[[], Probe]:
    def make() -> Probe:
        # eps unused: the probe runs through prepare_default_eps
        return group_probe(op, probes.ladder(8), "float32", 1e-5)

    return make


# Channel means far apart within each group: per-channel statistics then normalize every channel
# to mean 0, per-group ones leave the channels' offsets in y.
_CHANNEL_OFFSETS = np.array([0.0, 1.0, -1.0, 0.5])


def groups_gn() -> Probe:
    case = Case("group_norm", (2, 4, 3), "float32", 1e-12, num_groups=2)
    x = probes.dyadic(17, case.shape) + _CHANNEL_OFFSETS.reshape(1, 4, 1)
    return Probe(case, probes.instances(case, x), False, ("y",))


def affine_gn() -> Probe:
    case = Case("group_norm", (2, 4, 3), "float32", 1e-12, num_groups=2)
    weight, bias = np.array([1.0, 0.5, -0.75, 1.25]), np.array([0.25, -0.5, 1.0, 0.0])
    return Probe(
        case, probes.instances(case, probes.dyadic(18, case.shape), weight=weight, bias=bias), False, ("y",)
    )


def in_update(momentum: float | None, *outputs: str) -> Callable[[], Probe]:
    """InstanceNorm training with running statistics: 2 samples x 2 channels of 4 values, running
    statistics far from the instances' (dyadic means; unbiased variances 4/3 of the biased)."""

    def make() -> Probe:
        case = Case(
            "instance_norm",
            (2, 2, 4),
            "float32",
            1e-12,
            training=True,
            momentum=momentum,
            track_running_stats=True,
        )
        x = np.array(
            [[[1.0, 0.0, 1.0, 0.0], [-1.0, -2.0, -1.0, 0.0]], [[3.0, 1.0, 3.0, 1.0], [0.0, 2.0, 0.0, -2.0]]]
        )
        inputs = probes.instances(case, x, np.array([4.0, -6.0]), np.array([2.0, 3.0]))
        return Probe(case, inputs, False, outputs)

    return make


# ------------------------------------------------------------------ the add ops' residual stream
def _with_residual(case: Case, x: np.ndarray, residual: np.ndarray, outputs: tuple[str, ...]) -> Probe:
    inputs = probes.rows(case, x)
    inputs["residual"] = round_to(
        np.asarray(residual, dtype=np.float64).reshape(case.shape), case.stream_dtype
    )
    return Probe(case, inputs, False, outputs)


# Below half an ulp of 1 in each dtype: 1 + SUM_NUDGE rounds back to 1.
SUM_NUDGE = {"bfloat16": 2.0**-10, "float16": 2.0**-12}


def sum_ln(dtype: str = "bfloat16") -> Callable[[], Probe]:
    """Row 0: x = 1 and residual = +-SUM_NUDGE. Rounded to ``dtype`` the sums are all 1 (a constant
    row: y = 0); the unrounded sums normalize to +-1. Row 1 is ordinary data."""

    def make() -> Probe:
        case = Case("add_layer_norm", (2, 16), dtype, 1e-12)
        x = np.stack([np.ones(16), probes.seeded(21, (16,))])
        residual = np.stack([probes.alternating([SUM_NUDGE[dtype]], 16)[0], probes.seeded(22, (16,))])
        return _with_residual(case, x, residual, ("y",))

    return make


def sum_rms(dtype: str = "bfloat16") -> Callable[[], Probe]:
    """Ordinary ``dtype`` rows: where the sum's rounding moves y to another value (masked)."""

    def make() -> Probe:
        case = Case("add_rms_norm", (64, 16), dtype, 1e-6)
        return _with_residual(case, probes.seeded(23, case.shape), probes.seeded(24, case.shape), ("y",))

    return make


def stream(op: str) -> Callable[[], Probe]:
    """bfloat16 sums that bfloat16 cannot hold: residual_out rounded, or kept in float32 (masked)."""

    def make() -> Probe:
        case = Case(op, (64, 16), "bfloat16", 1e-6)
        return _with_residual(
            case, probes.seeded(25, case.shape), probes.seeded(26, case.shape), ("residual_out",)
        )

    return make
