"""conformance.model.case: validation messages, bias defaults, stable ids, round-trips, derived shapes."""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace

import pytest

from conformance.model import profiles
from conformance.model.case import DISTS, OPS, Case, CaseError
from conformance.model.dtypes import DTYPES


def ln(**kw: object) -> Case:
    return Case(**{"op": "layer_norm", "shape": (4, 8), "dtype": "float32", "eps": 1e-5, **kw})


def bn(**kw: object) -> Case:
    return Case(**{"op": "batch_norm", "shape": (4, 3, 5), "dtype": "float32", "eps": 1e-5, **kw})


# ---------------------------------------------------------------- validation messages


@pytest.mark.parametrize(
    ("kw", "field", "value", "allowed"),
    [
        ({"op": "spectral_norm"}, "op", "spectral_norm", ", ".join(OPS)),
        ({"dtype": "float8"}, "dtype", "float8", ", ".join(DTYPES)),
        ({"dtype": "half"}, "dtype", "half", ", ".join(DTYPES)),
        ({"param_dtype": "int8"}, "param_dtype", "int8", "None, " + ", ".join(DTYPES)),
        ({"dist": "uniform"}, "dist", "uniform", ", ".join(DISTS)),
        ({"shape": ()}, "shape", (), "a non-empty tuple of positive integers"),
        ({"shape": (4, 0)}, "shape", (4, 0), "a non-empty tuple of positive integers"),
        ({"shape": (4, -8)}, "shape", (4, -8), "a non-empty tuple of positive integers"),
        ({"shape": (4, 8.0)}, "shape", (4, 8.0), "a non-empty tuple of positive integers"),
        ({"norm_ndim": 3}, "norm_ndim", 3, "1..2 for shape (4, 8)"),
        ({"norm_ndim": 0}, "norm_ndim", 0, "1..2 for shape (4, 8)"),
        ({"eps": 0.0}, "eps", 0.0, "a positive finite float"),
        ({"eps": 0}, "eps", 0, "a positive finite float"),
        ({"eps": -1e-5}, "eps", -1e-5, "a positive finite float"),
        ({"eps": math.nan}, "eps", math.nan, "a positive finite float"),
        ({"eps": math.inf}, "eps", math.inf, "a positive finite float"),
        ({"eps": True}, "eps", True, "a positive finite float"),
        ({"eps": "1e-5"}, "eps", "1e-5", "a positive finite float"),
        ({"seed": -1}, "seed", -1, "a non-negative integer"),
        ({"seed": 1.0}, "seed", 1.0, "a non-negative integer"),
        ({"seed": True}, "seed", True, "a non-negative integer"),
        ({"weight_offset": 1.0}, "weight_offset", 1.0, "0.0 for op=layer_norm"),
        ({"training": True}, "training", True, "False for op=layer_norm"),
        ({"momentum": 0.5}, "momentum", 0.5, "0.1 (unused) for op=layer_norm"),
    ],
)
def test_layer_norm_field_errors_name_field_value_and_allowed(kw, field, value, allowed):
    with pytest.raises(CaseError) as info:
        ln(**kw)
    message = str(info.value)
    assert f"{field}={value!r} is not allowed" in message
    assert f"allowed: {allowed}" in message


@pytest.mark.parametrize(
    ("case_kw", "field", "value", "allowed"),
    [
        ({"op": "rms_norm", "bias": True}, "bias", True, "False for op=rms_norm"),
        ({"op": "add_rms_norm", "bias": True}, "bias", True, "False for op=add_rms_norm"),
        (
            {"op": "rms_norm", "weight": False, "weight_offset": 1.0},
            "weight_offset",
            1.0,
            "0.0 when weight=False",
        ),
        ({"op": "rms_norm", "weight_offset": math.inf}, "weight_offset", math.inf, "a finite float"),
        (
            {"op": "batch_norm", "weight_offset": 1.0, "shape": (4, 3)},
            "weight_offset",
            1.0,
            "0.0 for op=batch_norm",
        ),
        ({"op": "batch_norm", "shape": (4,)}, "shape", (4,), "(N, C) or (N, C, L...) for op=batch_norm"),
        ({"op": "batch_norm", "shape": (4, 3), "norm_ndim": 2}, "norm_ndim", 2, "1 for op=batch_norm"),
        (
            {"op": "batch_norm", "shape": (4, 3), "training": True, "momentum": 1.5},
            "momentum",
            1.5,
            "None or a float",
        ),
        (
            {"op": "batch_norm", "shape": (4, 3), "momentum": -0.1},
            "momentum",
            -0.1,
            "None or a float in [0, 1]",
        ),
        # One value per channel: the unbiased running variance would divide by zero.
        (
            {"op": "batch_norm", "shape": (1, 3), "training": True},
            "shape",
            (1, 3),
            "more than one value per channel",
        ),
        (
            {"op": "batch_norm", "shape": (1, 3, 1), "training": True},
            "shape",
            (1, 3, 1),
            "more than one value",
        ),
    ],
)
def test_op_specific_field_errors(case_kw, field, value, allowed):
    kw = {"shape": (4, 8), "dtype": "float32", "eps": 1e-5, **case_kw}
    with pytest.raises(CaseError) as info:
        Case(**kw)
    assert f"{field}={value!r} is not allowed" in str(info.value)
    assert allowed in str(info.value)


def test_batch_norm_training_allows_two_values_per_channel():
    assert bn(shape=(1, 3, 2), training=True).rows == 2
    assert bn(shape=(1, 3), training=False).rows == 1  # eval uses running statistics: one value is fine


def test_case_error_is_a_value_error():
    assert issubclass(CaseError, ValueError)


@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("weight_offset", {"op": "rms_norm", "shape": (4, 8), "weight_offset": "x"}),
        ("momentum", {"op": "batch_norm", "shape": (4, 3), "training": True, "momentum": "0.1"}),
        ("norm_ndim", {"op": "layer_norm", "shape": (4, 8), "norm_ndim": "2"}),
        ("training", {"op": "batch_norm", "shape": (4, 3), "training": "false"}),
        ("weight", {"op": "layer_norm", "shape": (4, 8), "weight": "no"}),
    ],
)
def test_wrongly_typed_fields_raise_case_error_naming_the_field(field, kw):
    with pytest.raises(CaseError, match=f"^{field}="):
        Case(dtype="float32", eps=1e-5, **kw)


# ---------------------------------------------------------------- bias default per op


@pytest.mark.parametrize(
    ("op", "shape", "bias"),
    [
        ("layer_norm", (4, 8), True),
        ("batch_norm", (4, 3), True),
        ("rms_norm", (4, 8), False),
        ("add_rms_norm", (4, 8), False),
    ],
)
def test_unset_bias_resolves_to_the_ops_usual_form(op, shape, bias):
    assert Case(op, shape, "float32", 1e-5).bias is bias


def test_explicit_bias_is_kept():
    assert ln(bias=False).bias is False
    assert bn(bias=False).bias is False
    assert Case("rms_norm", (4, 8), "float32", 1e-5, bias=False).bias is False


def test_shape_list_becomes_tuple():
    assert ln(shape=[4, 8]).shape == (4, 8)


# ---------------------------------------------------------------- id


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            Case("layer_norm", (4096, 1024), "bfloat16", 1e-5, dist="offset"),
            "layer_norm-bfloat16-4096x1024-eps1e-05-offset",
        ),
        (
            Case("rms_norm", (8, 256), "float16", 1e-6, param_dtype="float32", weight_offset=1.0, seed=3),
            "rms_norm-float16-pfloat32-8x256-eps1e-06-normal-off1.0-s3",
        ),
        (
            Case("layer_norm", (3, 4, 10), "float32", 1e-5, norm_ndim=2, weight=False, bias=False),
            "layer_norm-float32-3x4x10-eps1e-05-normal-nd2-now-nob",
        ),
        (
            Case("batch_norm", (6, 3, 5), "float32", 1e-5, training=True, momentum=None, bias=False),
            "batch_norm-float32-6x3x5-eps1e-05-normal-nob-train-mNone",
        ),
        (
            Case("batch_norm", (32, 16), "float64", 0.01, training=True),
            "batch_norm-float64-32x16-eps0.01-normal-train-m0.1",
        ),
        (
            Case("rms_norm", (2, 8192), "float32", 1e-12, dist="zeros"),
            "rms_norm-float32-2x8192-eps1e-12-zeros",
        ),
    ],
)
def test_id_literals(case, expected):
    assert case.id == expected


def test_id_is_stable_across_equal_constructions():
    a = Case("layer_norm", [4, 8], "float32", 1e-5)
    b = Case("layer_norm", (4, 8), "float32", 1e-05, bias=True)
    assert a == b
    assert a.id == b.id


def test_ids_are_unique_per_case_across_every_grid_of_the_full_profile():
    # profiles.cases() de-duplicates by id, so check the raw grids: one id never names two different cases.
    seen: dict[str, Case] = {}
    for grid in profiles.FULL:
        for case in grid.cases():
            assert seen.setdefault(case.id, case) == case, f"{case.id} names {seen[case.id]} and {case}"
    listed = [c.id for c in profiles.cases("full")]
    assert len(listed) == len(set(listed)) == len(seen)


@pytest.mark.parametrize(
    ("base", "change"),
    [
        (ln(), {"op": "rms_norm", "bias": False}),
        (ln(), {"shape": (8, 4)}),
        (ln(), {"shape": (4, 8, 1)}),
        (ln(), {"dtype": "float64"}),
        (ln(), {"eps": 1e-6}),
        (ln(), {"eps": math.nextafter(1e-5, 1.0)}),
        (ln(), {"param_dtype": "float64"}),
        (ln(), {"norm_ndim": 2}),
        (ln(), {"weight": False}),
        (ln(), {"bias": False}),
        (ln(), {"dist": "offset"}),
        (ln(), {"seed": 1}),
        (Case("rms_norm", (4, 8), "float32", 1e-5), {"weight_offset": 1.0}),
        (Case("rms_norm", (4, 8), "float32", 1e-5, weight_offset=1.0), {"weight_offset": 0.5}),
        (bn(), {"training": True}),
        (bn(training=True), {"momentum": 0.5}),
        (bn(training=True), {"momentum": None}),
        (bn(), {"bias": False}),
        (bn(), {"shape": (4, 5, 3)}),
    ],
)
def test_id_distinguishes_every_field(base, change):
    assert base.id != replace(base, **change).id


def test_one_spelling_per_meaning():
    # An explicit param_dtype equal to dtype is the default; a momentum eval mode never uses is refused,
    # so two cases with one id always run the same computation.
    assert ln(param_dtype="float32") == ln()
    with pytest.raises(CaseError, match=r"momentum=0.5 is not allowed; allowed: 0.1 \(unused\)"):
        bn(momentum=0.5)


# ---------------------------------------------------------------- to_dict / from_dict


ROUND_TRIP = [
    ln(),
    Case(
        "rms_norm", (2, 3, 4), "bfloat16", 1e-6, param_dtype="float32", norm_ndim=2, weight_offset=1.0, seed=7
    ),
    bn(training=True, momentum=None, bias=False, dist="constant"),
    Case("layer_norm", (5,), "float16", 0.01, weight=False, bias=False, dist="outlier"),
    Case("group_norm", (2, 8, 3, 3), "float32", 1e-5, num_groups=4, layout="channels_last"),
    Case(
        "instance_norm", (2, 3, 5), "bfloat16", 1e-5, track_running_stats=True, training=True, momentum=None
    ),
    Case("instance_norm", (2, 3, 5), "float32", 1e-5, weight=False, bias=False),
    Case("add_layer_norm", (4, 8), "bfloat16", 1e-5, residual_dtype="float32", norm_input="exact"),
    Case("add_rms_norm", (4, 8), "float16", 1e-6, norm_input="exact", weight_offset=1.0),
    Case("add_layer_norm", (4, 8), "float16", 1e-5, residual_dtype="float32"),
]
# Fields added after the first results files: left out of a record at the op's usual value.
QUIET = {"num_groups", "track_running_stats", "layout", "residual_dtype", "norm_input"}


@pytest.mark.parametrize("case", ROUND_TRIP, ids=lambda c: c.id)
def test_to_dict_from_dict_round_trip_through_json(case):
    record = case.to_dict()
    assert record["id"] == case.id
    assert record["shape"] == list(case.shape)
    assert set(record) | QUIET == {f.name for f in fields(Case)} | {"id"}
    usual = {
        "num_groups": None,
        "track_running_stats": case.op == "batch_norm",
        "layout": "contiguous",
        "residual_dtype": None,
        "norm_input": "rounded",
    }
    assert QUIET & set(record) == {name for name in QUIET if getattr(case, name) != usual[name]}
    again = Case.from_dict(json.loads(json.dumps(record)))
    assert again == case
    assert again.id == case.id


def test_from_dict_ignores_a_stale_id():
    record = {**ln().to_dict(), "id": "something-else"}
    assert Case.from_dict(record) == ln()


def test_from_dict_unknown_field_names_it_and_lists_allowed():
    with pytest.raises(CaseError) as info:
        Case.from_dict({**ln().to_dict(), "epsilon": 1e-5, "axes": 1})
    message = str(info.value)
    assert "'axes', 'epsilon' (did you mean 'eps'?)" in message
    assert "allowed:" in message
    assert "eps" in message and "norm_ndim" in message


@pytest.mark.parametrize("dropped", ["op", "shape", "dtype", "eps"])
def test_from_dict_missing_required_field_is_named(dropped):
    record = ln().to_dict()
    del record[dropped]
    with pytest.raises(CaseError, match=rf"missing Case field\(s\) \['{dropped}'\]"):
        Case.from_dict(record)


def test_from_dict_defaults_optional_fields():
    assert Case.from_dict({"op": "layer_norm", "shape": [4, 8], "dtype": "float32", "eps": 1e-5}) == ln()


def test_from_dict_validates_values():
    with pytest.raises(CaseError, match="dtype='float8'"):
        Case.from_dict({"op": "layer_norm", "shape": [4, 8], "dtype": "float8", "eps": 1e-5})


# ---------------------------------------------------------------- features, rows, param_shape


@pytest.mark.parametrize(
    ("case", "features"),
    [
        (ln(), set()),
        (ln(weight=False, bias=False), {"no_weight", "no_bias"}),
        (Case("rms_norm", (4, 8), "float32", 1e-5), set()),  # no bias is RMSNorm's usual form, not a feature
        (Case("rms_norm", (4, 8), "float32", 1e-5, weight_offset=1.0), {"weight_offset"}),
        (Case("rms_norm", (2, 4, 8), "float32", 1e-5, norm_ndim=2), {"multi_axis"}),
        (ln(dtype="bfloat16", param_dtype="float32"), {"param_dtype"}),
        (ln(param_dtype="float32"), set()),
        (bn(training=True), {"training"}),
        (bn(training=True, momentum=None), {"training", "momentum_none"}),
        (bn(bias=False, weight=False), {"no_weight", "no_bias"}),
    ],
)
def test_features(case, features):
    assert case.features == frozenset(features)


@pytest.mark.parametrize(
    ("case", "rows", "param_shape"),
    [
        (ln(shape=(2, 3, 4)), 6, (4,)),
        (ln(shape=(2, 3, 4), norm_ndim=2), 2, (3, 4)),
        (ln(shape=(2, 3, 4), norm_ndim=3), 1, (2, 3, 4)),
        (ln(shape=(7,)), 1, (7,)),
        (Case("rms_norm", (5, 9), "float32", 1e-5), 5, (9,)),
        (bn(shape=(8, 3)), 8, (3,)),
        (bn(shape=(4, 3, 5, 6)), 120, (3,)),
    ],
)
def test_rows_and_param_shape(case, rows, param_shape):
    assert case.rows == rows
    assert case.param_shape == param_shape


def test_params_defaults_to_dtype():
    assert ln().weight_dtype == "float32"
    assert ln(dtype="float16", param_dtype="float32").weight_dtype == "float32"
    with pytest.warns(DeprecationWarning, match=r"Case\.params is deprecated; use Case\.weight_dtype"):
        assert ln(dtype="bfloat16").params == "bfloat16"


@pytest.mark.parametrize(
    ("kw", "field", "allowed"),
    [
        ({"op": "group_norm", "shape": (2, 6, 4)}, "num_groups", "a divisor of C=6: [1, 2, 3, 6]"),
        ({"op": "group_norm", "shape": (2, 6, 4), "num_groups": 4}, "num_groups", "a divisor of C=6"),
        ({"op": "group_norm", "shape": (6,), "num_groups": 1}, "shape", "(N, C) or (N, C, spatial...)"),
        ({"op": "layer_norm", "shape": (2, 6), "num_groups": 2}, "num_groups", "None for op=layer_norm"),
        ({"op": "instance_norm", "shape": (2, 6)}, "shape", "(N, C, spatial...) for op=instance_norm"),
        ({"op": "instance_norm", "shape": (2, 6, 1)}, "shape", "more than one spatial value per instance"),
        (
            {"op": "instance_norm", "shape": (2, 6, 4), "training": True},
            "training",
            "without track_running_stats",
        ),
        (
            {"op": "group_norm", "shape": (2, 6, 4), "num_groups": 2, "track_running_stats": True},
            "track_running_stats",
            "False for op=group_norm",
        ),
        ({"op": "batch_norm", "shape": (2, 6), "track_running_stats": False}, "track_running_stats", "True"),
        (
            {"op": "group_norm", "shape": (2, 6, 4), "num_groups": 2, "layout": "nhwc"},
            "layout",
            "contiguous, channels_last",
        ),
        (
            {"op": "group_norm", "shape": (2, 6, 4), "num_groups": 2, "layout": "channels_last"},
            "layout",
            "4-d or 5-d",
        ),
        ({"op": "layer_norm", "shape": (2, 6, 4, 4), "layout": "channels_last"}, "layout", "channel op"),
        (
            {"op": "group_norm", "shape": (2, 6, 4), "num_groups": True},
            "num_groups",
            "None or a positive integer",
        ),
    ],
)
def test_group_and_instance_fields_name_field_value_and_allowed(kw, field, allowed):
    fields_ = {"dtype": "float32", "eps": 1e-5, **kw}
    with pytest.raises(CaseError) as info:
        Case(**fields_)
    message = str(info.value)
    assert message.startswith(f"{field}=") and allowed in message


def test_group_and_instance_ids_and_features():
    gn = Case("group_norm", (2, 8, 3, 3), "float32", 1e-5, num_groups=4, layout="channels_last")
    assert gn.id == "group_norm-float32-2x8x3x3-eps1e-05-normal-g4-cl"
    assert (
        gn.features == {"channels_last"} and gn.rows == 8 and gn.param_terms == 18 and gn.param_shape == (8,)
    )
    tracked = Case("instance_norm", (2, 3, 5), "float32", 1e-5, track_running_stats=True)
    assert (
        tracked.id.endswith("-track")
        and tracked.features == {"running_stats"}
        and not tracked.uses_batch_stats
    )
    step = Case(
        "instance_norm", (2, 3, 5), "float32", 1e-5, track_running_stats=True, training=True, momentum=None
    )
    assert step.id.endswith("-train-mNone") and step.features == {
        "running_stats",
        "training",
        "momentum_none",
    }
    plain = Case("instance_norm", (2, 3, 5), "float32", 1e-5)
    assert plain.uses_batch_stats and plain.groups == 3 and plain.rows == 6 and "track" not in plain.id


# ------------------------------------------------------------------ the add ops' residual stream
def test_residual_conventions_name_themselves_in_the_id_and_features():
    case = Case("add_layer_norm", (4, 8), "bfloat16", 1e-5, residual_dtype="float32", norm_input="exact")
    assert case.id == "add_layer_norm-bfloat16-4x8-eps1e-05-normal-rfloat32-exact"
    assert {"residual_dtype", "exact_sum"} <= case.features
    assert case.stream_dtype == "float32"
    assert case.bias is True  # LayerNorm's usual form carries a bias, fused or not


def test_residual_dtype_equal_to_the_activation_dtype_is_the_default_spelling():
    same = Case("add_rms_norm", (4, 8), "float32", 1e-6, residual_dtype="float32")
    assert same.residual_dtype is None
    assert same == Case("add_rms_norm", (4, 8), "float32", 1e-6)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"op": "layer_norm", "residual_dtype": "float32"}, "residual_dtype"),
        ({"op": "rms_norm", "norm_input": "exact"}, "norm_input"),
        ({"op": "add_rms_norm", "norm_input": "unrounded"}, "norm_input"),
        ({"op": "add_rms_norm", "residual_dtype": "int8"}, "residual_dtype"),
        ({"op": "add_rms_norm", "bias": True}, "bias"),
    ],
)
def test_residual_fields_outside_their_ops_or_values_fail_by_name(fields, named):
    with pytest.raises(CaseError) as info:
        Case(shape=(4, 8), dtype="bfloat16", eps=1e-5, **fields)
    message = str(info.value)
    assert message.startswith(f"{named}=") and "allowed" in message
