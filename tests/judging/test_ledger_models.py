"""Known deviations as executable models, platform conditions, added ledger files and strict mode:
each run end to end against fakes that deviate in a known way (tests/fakes/ledger.py)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from conformance.judging import models, platform, tolerances
from conformance.judging.ledger import LedgerError
from conformance.judging.platform import Platform
from conformance.judging.tolerances import OUTPUTS
from conformance.judging.verdict import Evidence, Verdict, compare_outputs, judge
from conformance.model import dtypes
from conformance.model.case import Case
from conformance.model.inputs import for_call
from conformance.results import machine
from conformance.running.checks import CHECKS as SPECS
from conformance.running.checks import materials
from conformance.running.settings import load_ledger

import fakes.core
import fakes.ledger
from support.ledger import ARGS, CHECKS, entry, ledger_file


def test_without_an_entry_the_deviation_fails(suite):
    run = suite("--backend", "fake-eps-float32", *ARGS, *CHECKS)
    assert run.returncode == 1
    assert run.outcomes().get("failed", 0) >= 3, run.outcomes()


def test_a_model_explains_the_deviation_it_models(suite, tmp_path):
    mine = ledger_file(tmp_path, entry('"fake-eps-float32"'))
    run = suite("--backend", "fake-eps-float32", *ARGS, *CHECKS, "--ledger", mine)
    assert run.returncode == 0, run.output[-3000:]
    xfailed = [r for r in run.records if r["outcome"] == "xfailed"]
    assert len(xfailed) >= 3
    for record in xfailed:
        assert "model eps_float32 reproduces it" in record["reason"]
        assert "eps is rounded to float32 before use" in record["reason"]
        explained = [c["explained"] for c in record["comparisons"] if "explained" in c]
        assert explained and all(x["model"] == "eps_float32" and x["passed"] for x in explained)
        # The model's answer is itself off the oracle by what the backend shows, and the backend sits
        # within the very tolerance of the model: nothing was widened.
        assert all(x["model_ratio"] > 1 and x["worst_ratio"] <= 1 for x in explained)
    # The entry is the file's own, added to the built-in ones, and the header says where it came from.
    files = run.header["ledger"]["files"]
    assert files[-1] == mine and any(f.endswith("torch.toml") for f in files)


def test_a_model_does_not_explain_another_deviation(suite, tmp_path):
    mine = ledger_file(tmp_path, entry('"fake-eps-float32", "fake-eps-bfloat16"'))
    run = suite("--backend", "fake-eps-bfloat16", *ARGS, *CHECKS, "--ledger", mine)
    assert run.returncode == 1
    failed = [r for r in run.records if r["outcome"] == "failed"]
    assert failed and all("names model eps_float32, which does not explain" in r["reason"] for r in failed)


def test_a_third_party_model_is_named_by_module_and_function(suite, tmp_path):
    model = 'model = "fakes.ledger:eps_bfloat16"'
    mine = ledger_file(tmp_path, entry('"fake-eps-bfloat16"', model))
    run = suite("--backend", "fake-eps-bfloat16", *ARGS, *CHECKS, "--ledger", mine)
    assert run.returncode == 0, run.output[-3000:]
    assert run.outcomes().get("xfailed", 0) >= 3


def test_a_platform_condition_that_does_not_hold_leaves_the_deviation_failing(suite, tmp_path):
    elsewhere = entry('"fake-eps-float32"', extra='platform = { device = ["cuda"] }\n')
    run = suite("--backend", "fake-eps-float32", *ARGS, *CHECKS, "--ledger", ledger_file(tmp_path, elsewhere))
    assert run.returncode == 1
    # Not observed here, and for another platform: no complaint about the entry itself.
    assert "not observed here: deviation" not in run.output


def test_no_builtin_ledger_replaces_the_built_in_entries(suite, tmp_path):
    mine = ledger_file(tmp_path, entry('"fake-eps-float32"'))
    run = suite("--backend", "fake-eps-float32", *ARGS, *CHECKS, "--ledger", mine, "--no-builtin-ledger")
    assert run.returncode == 0, run.output[-3000:]
    assert run.header["ledger"]["files"] == [mine] and len(run.header["ledger"]["entries"]) == 1
    alone = suite("--backend", "fake-numpy", "--no-builtin-ledger", *CHECKS)
    assert alone.returncode == 4 and "--no-builtin-ledger without --ledger FILE" in alone.output


def test_an_entry_not_observed_is_reported_and_fails_only_a_strict_run(suite, tmp_path):
    mine = ledger_file(tmp_path, entry('"fake-numpy"'))
    run = suite("--backend", "fake-numpy", *ARGS, *CHECKS, "--ledger", mine)
    assert run.returncode == 0, run.output[-3000:]
    index = len(run.header["ledger"]["entries"]) - 1
    assert f"not observed here: deviation[{index}]" in run.output
    assert run.header["ledger"]["not_observed"] == [index]
    strict = suite("--backend", "fake-numpy", *ARGS, *CHECKS, "--ledger", mine, "--strict-ledger")
    assert strict.returncode == 1
    assert "--strict-ledger: 1 entries were not observed" in strict.output
    assert strict.header["exitstatus"] == 1


# ---------------------------------------------------------------------------------- unit level


def test_platform_conditions_read_device_cpu_features_and_versions(tmp_path):
    body = (
        '[[deviation]]\nbackend = "fake-a"\ncheck = "forward"\noutput = "y"\nband = [1, 2]\n'
        'note = "no model yet"\nreason = "r"\n'
        'platform = { device = ["cpu"], cpu = ["avx2"], not_cpu = ["avx512_bf16"], '
        'versions = { torch = "<2.12" } }\n'
    )
    path = tmp_path / "l.toml"
    path.write_text(body)
    (dev,) = load_ledger(path, builtin=False).entries
    old_avx2 = Platform("cpu", frozenset({"avx2"}), {"torch": "2.11.0+cu130"})
    assert dev.condition.holds(old_avx2)
    assert not dev.condition.holds(old_avx2.on("cuda"))
    assert not dev.condition.holds(Platform("cpu", frozenset({"avx2", "avx512_bf16"}), {"torch": "2.11.0"}))
    assert not dev.condition.holds(Platform("cpu", frozenset({"avx2"}), {"torch": "2.13.0"}))
    assert not dev.condition.holds(Platform("cpu", frozenset({"avx2"}), {"torch": None}))
    assert dev.to_dict()["platform"] == {
        "device": ["cpu"],
        "cpu": ["avx2"],
        "not_cpu": ["avx512_bf16"],
        "versions": {"torch": "<2.12"},
    }


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('{ device = ["gpu"] }', "platform.device=['gpu'] is not allowed; allowed: cpu, cuda, rocm"),
        ('{ cpu = ["avx9"] }', "platform.cpu=['avx9'] is not allowed"),
        ('{ versions = { torch = "lower than 2" } }', "platform.versions.torch='lower than 2'"),
        ('{ os = "linux" }', "platform field(s) ['os'] are not allowed"),
    ],
)
def test_a_malformed_platform_condition_is_named(tmp_path, value, words):
    path = tmp_path / "l.toml"
    path.write_text(
        '[[deviation]]\nbackend = "fake-a"\ncheck = "forward"\noutput = "y"\nband = [1, 2]\n'
        'note = "no model yet"\nreason = "r"\n'
        f"platform = {value}\n"
    )
    with pytest.raises(LedgerError, match=r"deviation\[0\]") as info:
        load_ledger(path, builtin=False)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('model = "no_such_model"\n', "model='no_such_model' is not allowed; allowed: "),
        ('model = "normconf_nowhere:f"\n', "cannot be loaded"),
        (
            'model = "eps_float32"\nband = [1, 2]\nnote = "no model yet"\n',
            "model with band or measure is not allowed",
        ),
        ('model = "eps_float32"\ncheck = "shift_invariance"\n', "is not allowed with a model"),
    ],
)
def test_a_malformed_model_entry_is_named(tmp_path, body, words):
    path = tmp_path / "l.toml"
    head = '[[deviation]]\nbackend = "fake-a"\noutput = "y"\nreason = "r"\n'
    path.write_text(head + ('check = "forward"\n' if "check" not in body else "") + body)
    with pytest.raises(LedgerError) as info:
        load_ledger(path, builtin=False)
    assert words in str(info.value)


def test_reasons_are_stated_once_and_cited_by_key(tmp_path):
    path = tmp_path / "l.toml"
    cite = (
        '[[deviation]]\nbackend = "fake-a"\ncheck = "forward"\noutput = "y"\nband = [1, 2]\n'
        'note = "no model yet"\nreason = "k"\n'
    )
    path.write_text(
        cite + cite + '\n[reasons.k]\ntext = "the one reason"\nlink = "https://example.invalid"\n'
    )
    first, second = load_ledger(path, builtin=False).entries
    assert first.reason == second.reason == "the one reason" and first.link == "https://example.invalid"
    path.write_text(cite + '\n[reasons.k]\ntext = "t"\n[reasons.unused]\ntext = "u"\n')
    with pytest.raises(LedgerError, match=r"reasons \['unused'\] are cited by no entry"):
        load_ledger(path, builtin=False)


def test_every_builtin_model_resolves_and_unknown_names_list_the_choices():
    for name in models.MODELS:
        assert models.resolve(name) is models.MODELS[name]
    with pytest.raises(models.ModelError, match=r"allowed: .*eps_float32.*'package.module:function'"):
        models.resolve("nothing")


def test_cpu_features_are_read_from_cpuinfo():
    x86 = "processor : 0\nflags\t\t: fpu sse4_2 avx avx2 avx512f avx512_bf16 amx_tile\n"
    assert machine.parse_cpu_features(x86) == ("sse4_2", "avx", "avx2", "avx512f", "avx512_bf16", "amx_tile")
    arm = "processor : 0\nFeatures\t: fp asimd asimdhp bf16 sve\n"
    assert machine.parse_cpu_features(arm) == ("asimd", "asimdhp", "bf16", "sve")
    assert machine.parse_cpu_features("") == ()
    assert platform.here().cpu_features == frozenset(machine.cpu_features())


# ------------------------------------------------------------------ each model against its fake and near miss
def _judged(backend: str, case: Case, check: str, model: str, tmp_path) -> Verdict:
    """The fake run on the case and judged by the real judge under one entry naming ``model``."""
    path = tmp_path / f"{model}.toml"
    path.write_text(
        f'[[deviation]]\nbackend = "{backend}"\ncheck = ["forward", "backward", "training"]\n'
        f'output = {json.dumps(list(OUTPUTS))}\nmodel = "{model}"\nreason = "as the model says"\n'
    )
    ledger = load_ledger(str(path), builtin=False)
    fake = FAKES[backend]()
    inputs, expected = materials(case)
    grad = check == "backward"
    actual = fake.compute(case, for_call(inputs, grad=grad), grad)
    table = tolerances.read_tolerances()
    comparisons = compare_outputs(case, inputs, expected, actual, SPECS[check].outputs(case), table)
    evidence = Evidence(inputs, expected, actual, table)
    return judge(backend, case, check, comparisons, ledger, "x", None, None, evidence)


FAKES = {
    fake.name: fake
    for module in (fakes.core, fakes.ledger)
    for fake in vars(module).values()
    if isinstance(fake, type) and issubclass(fake, fakes.core.NumpyFake)
}


def _case(op: str, dtype: str, dist: str, **kw: object) -> Case:
    shape = kw.pop("shape", (8, 4, 6) if op == "batch_norm" else (12, 64))
    eps = kw.pop("eps", 1e-5)
    return Case(op, shape, dtype, eps, dist=dist, **kw)  # type: ignore[arg-type]


# (model, its fake, the near miss, the case, the check): the fake's failing outputs are xfailed and
# explained by the model; the near miss fails under the same entry.
PAIRS = [
    ("eps_dropped", "fake-eps-dropped", "fake-eps-bfloat16",
     _case("rms_norm", "float32", "normal", eps=1e-2), "forward"),
    ("float32_execution", "fake-float64-in-float32", "fake-float64-in-float16",
     _case("layer_norm", "float64", "normal"), "backward"),
    ("variance_path_underflow", "fake-rstd-cubed", "fake-ln-dx-no-mean-terms",
     _case("layer_norm", "float32", "large"), "backward"),
    ("half_statistics", "fake-half-statistics", "fake-bfloat16-statistics",
     _case("layer_norm", "float16", "offset"), "backward"),
    ("exact_sum", "fake-exact-sum", "fake-truncated-sum-read",
     _case("add_layer_norm", "bfloat16", "offset"), "forward"),
    ("biased_running_var", "fake-bn-biased-running-var", "fake-bn-doubled-running-var",
     _case("batch_norm", "float32", "normal", training=True), "training"),
    ("rounded_xhat", "fake-rounded-xhat", "fake-float16-xhat",
     _case("rms_norm", "bfloat16", "normal", param_dtype="float32"), "backward"),
    ("weight_grad_in_dtype", "fake-weight-grad-in-dtype", "fake-weight-grad-in-bfloat16",
     _case("rms_norm", "float16", "normal", param_dtype="float32"), "backward"),
    ("truncating_bfloat16_convert", "fake-truncating-convert", "fake-truncated-half",
     _case("layer_norm", "bfloat16", "normal", shape=(64, 384)), "forward"),
    ("bfloat16_execution", "fake-bfloat16-execution", "fake-bfloat16-statistics-execution",
     _case("layer_norm", "float32", "offset"), "forward"),
    ("one_pass_unclamped", "fake-one-pass-unclamped", "fake-one-pass-unclamped-sequential",
     _case("group_norm", "float32", "offset", shape=(4, 8, 200), num_groups=8), "forward"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "fake", "near", "case", "check"), PAIRS, ids=[p[0] for p in PAIRS])
def test_each_model_explains_its_deviation_and_not_a_near_miss(model, fake, near, case, check, tmp_path):
    verdict = _judged(fake, case, check, model, tmp_path)
    assert verdict.outcome == "xfailed", verdict.reason
    explained = [c.explained for c in verdict.comparisons if c.explained is not None]
    assert explained and all(x.model == model and x.passed for x in explained)
    # The model's answer fails the oracle as the backend does: it explains, nothing was widened.
    inputs, expected = materials(case)
    answer = models.resolve(model)(case, inputs)
    names = tuple(c.output for c in verdict.comparisons if c.explained is not None)
    assert not any(
        c.passed for c in compare_outputs(case, inputs, expected, answer, names, tolerances.read_tolerances())
    )
    missed = _judged(near, case, check, model, tmp_path)
    assert missed.outcome == "failed", missed.reason
    assert f"names model {model}, which does not explain" in missed.reason


def test_one_pass_unclamped_puts_nan_where_the_backend_does_on_constant_groups(tmp_path):
    case = _case("group_norm", "float32", "constant", shape=(4, 8, 200), num_groups=8, eps=1e-12)
    verdict = _judged("fake-one-pass-unclamped", case, "forward", "one_pass_unclamped", tmp_path)
    (y,) = verdict.comparisons
    assert verdict.outcome == "xfailed" and y.worst_ratio == np.inf and y.explained.worst_ratio < 1
    missed = _judged("fake-one-pass-unclamped-sequential", case, "forward", "one_pass_unclamped", tmp_path)
    assert missed.outcome == "failed"


def test_eps_dropped_makes_a_row_of_zeros_nan_as_the_graph_does(tmp_path):
    case = _case("rms_norm", "float32", "zeros", eps=1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):  # the fake's 0 * (1/0), as the graph's
        verdict = _judged("fake-eps-dropped", case, "forward", "eps_dropped", tmp_path)
    (y,) = verdict.comparisons
    assert verdict.outcome == "xfailed" and y.worst_ratio == np.inf and y.explained.worst_ratio == 0
    inputs, _ = materials(case)
    assert np.isnan(models.resolve("eps_dropped")(case, inputs)["y"]).all()


def test_a_bias_only_failure_keeps_the_live_explanation_of_the_same_model_when_rejudged(tmp_path):
    """A re-judged record without stored outputs: one element cannot show a rounding bias, so the live
    run's explanation by the entry's own model stands, and nothing else explains it."""
    case, model = _case("layer_norm", "bfloat16", "normal", shape=(64, 384)), "truncating_bfloat16_convert"
    live = _judged("fake-truncating-convert", case, "forward", model, tmp_path)
    (y,) = live.comparisons
    assert live.outcome == "xfailed" and not y.rounding_passed and y.worst_ratio <= 1.0

    def rejudged(recorded: dict, named: str) -> str:
        path = tmp_path / "entry.toml"
        path.write_text(
            f'[[deviation]]\nbackend = "fake-truncating-convert"\ncheck = "forward"\noutput = "y"\n'
            f'model = "{named}"\nreason = "as the model says"\n'
        )
        inputs, expected = materials(case)
        bare = dataclasses.replace(y, explained=None)
        evidence = Evidence(inputs, expected, {}, tolerances.read_tolerances(), recorded)
        ledger = load_ledger(str(path), builtin=False)
        fake = "fake-truncating-convert"
        verdict = judge(fake, case, "forward", (bare,), ledger, "x", None, None, evidence)
        return verdict.outcome

    assert rejudged({"y": y.explained}, model) == "xfailed"
    assert rejudged({}, model) == "failed"
    assert rejudged({"y": y.explained}, "half_statistics") == "failed"
    assert rejudged({"y": dataclasses.replace(y.explained, passed=False)}, model) == "failed"


def test_a_narrowed_model_is_judged_under_the_tolerance_of_the_dtype_it_runs_in():
    case = _case("rms_norm", "float64", "normal")
    inputs, _ = materials(case)
    run, rounded = models.execution(models.MODELS["float32_execution"], case, inputs)
    assert run.dtype == "float32" and run.param_dtype is None
    assert all(np.array_equal(v, v.astype(np.float32)) for v in rounded.values())
    same, _ = models.execution(models.MODELS["half_statistics"], case, inputs)
    assert same is case


def test_a_model_that_does_not_speak_of_an_op_explains_nothing_there(tmp_path):
    # half_statistics models centred norms; an entry naming it for RMSNorm explains no RMSNorm output.
    verdict = _judged("fake-float64-in-float32", _case("rms_norm", "float64", "normal"), "forward",
                      "half_statistics", tmp_path)  # fmt: skip
    assert verdict.outcome == "failed"


def test_truncating_convert_rounds_half_up_only_after_an_odd_kept_bit():
    ulp = 2.0**-7  # bfloat16 spacing in [1, 2)
    values = np.array([1.0 + ulp / 2, 1.0 + ulp + ulp / 2, 1.0 + ulp / 4, -(1.0 + ulp + ulp / 2)])
    got = dtypes.truncating_bfloat16(values)
    # Even kept bit: the tie truncates; odd kept bit: it rounds up (away from zero for negatives).
    assert list(got) == [1.0, 1.0 + 2 * ulp, 1.0, -(1.0 + 2 * ulp)]


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_model_that_overflows_on_purpose_is_judged_not_raised(tmp_path):
    # float64 rows of 1e150 narrowed to float32 are inf, as the backend's are: an answer, not an error
    # (checks run with warnings as errors; the model's overflow must not be one).
    case = _case("rms_norm", "float64", "large")
    inputs, expected = materials(case)
    with np.errstate(over="ignore", invalid="ignore"):
        actual = FAKES["fake-float64-in-float32"]().compute(case, for_call(inputs, grad=False), False)
    table = tolerances.read_tolerances()
    path = tmp_path / "l.toml"
    path.write_text(entry('"fake-float64-in-float32"', 'model = "float32_execution"'))
    comparisons = compare_outputs(case, inputs, expected, actual, ("y",), table)
    verdict = judge(
        "fake-float64-in-float32", case, "forward", comparisons, load_ledger(str(path), builtin=False),
        "x", None, None, Evidence(inputs, expected, actual, table),
    )  # fmt: skip
    assert verdict.outcome in ("xfailed", "failed")
