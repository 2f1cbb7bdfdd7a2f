"""Semantic fingerprint: every convention fake is identified as the convention it implements, the
reference fake as the reference everywhere, and an answer no hypothesis explains says so."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import conformance
from conformance import oracle
from conformance.fingerprint import QUESTIONS, ask, classify, grid_error, judge, rel_error, sums
from conformance.fingerprint.emulate import REFERENCE, emulate
from conformance.model.case import Case
from conformance.model.dtypes import round_to
from conformance.model.inputs import make_inputs
from conformance.results.records import read_results
from conformance.running import checks

import fakes.ledger  # noqa: F401  (registers fake-truncating-convert and fake-bfloat16-execution)
from fakes.core import NumpyFake
from fakes.group import GroupFake

# fake -> the answers that differ from the reference; every other question must get the reference.
CONVENTIONS = {
    "fake-numpy": {},
    "fake-eps-outside-sqrt": {
        "layer_norm.eps": "added-to-std",
        "rms_norm.eps": "added-to-std",
        "batch_norm.eps": "added-to-std",
    },
    "fake-unbiased-variance": {"layer_norm.variance": "unbiased", "batch_norm.variance": "unbiased"},
    # float32 E[x^2] - E[x]^2 is itself inaccurate on the float16 stats probe's offset rows (mean/spread
    # ~4000): the statistics question tries every hypothesis with a one-pass variance too, and reads
    # float32.
    "fake-one-pass-variance": {"layer_norm.passes": "one-pass", "batch_norm.passes": "one-pass"},
    "fake-low-precision-stats": {
        **{
            f"{op}.stats_precision.{dtype}": "activation-dtype"
            for op in ("layer_norm", "rms_norm", "batch_norm")
            for dtype in ("bfloat16", "float16")
        },
        # The weight-cast question assumes float32 statistics; with bfloat16 ones neither rounding fits.
        "rms_norm.weight_cast": "unmatched",
        # So does the RMS sum question, read bit for bit in y as well, and the float16 LayerNorm sum
        # probe, whose ordinary row 1 normalized with float16 statistics neither sum explains.
        "add_rms_norm.sum": "unmatched",
        "add_rms_norm.sum.float16": "unmatched",
        "add_layer_norm.sum.float16": "unmatched",
    },
    # bfloat16 outputs converted as OpenVINO's CPU plugin does (from the guard bit alone): the bit-level
    # questions try that conversion too, so they still read the reference conventions.
    "fake-truncating-convert": {},
    "fake-ln-dx-no-mean-terms": {"layer_norm.dx": "no-mean-terms", "batch_norm.dx": "no-mean-terms"},
    "fake-bn-biased-running-var": {"batch_norm.running_var": "biased"},
    "fake-bias-ignored": {"layer_norm.bias": "ignored", "batch_norm.bias": "ignored"},
    "fake-wrong-axes": {"layer_norm.axes": "last-dim", "rms_norm.axes": "last-dim"},
    # GroupNorm / InstanceNorm (tests/fakes/group.py)
    "fake-group-numpy": {},
    "fake-gn-per-channel-stats": {"group_norm.groups": "per-channel"},
    "fake-gn-per-group-affine": {"group_norm.affine": "per-group"},
    "fake-gn-one-pass-variance": {"group_norm.passes": "one-pass", "instance_norm.passes": "one-pass"},
    # The same variance centred after scaling (Keras' GroupNormalization): one-pass all the same.
    "fake-gn-one-pass-scaled": {"group_norm.passes": "one-pass", "instance_norm.passes": "one-pass"},
    "fake-in-frozen-running-stats": {
        "instance_norm.momentum": "not-updated",
        "instance_norm.momentum_none": "as-0",
        # Neither variance explains a running variance that did not move.
        "instance_norm.running_var": "unmatched",
    },
}
DEFAULT_EPS = [name for name, q in QUESTIONS.items() if q.default_eps]


def _backend(name):
    return conformance.adapter.registry.entries()[name].load()


def _answers(backend):
    caps = backend.capabilities()
    return {name: ask(backend, caps, q, timeout=30) for name, q in QUESTIONS.items()}


def _asked(backend, names):
    """The questions of ``names`` about an op the backend declares (the others are unsupported)."""
    ops = backend.capabilities().ops
    return [name for name in names if QUESTIONS[name].op in ops]


def test_the_convention_fakes_cover_every_question():
    ops = set().union(*(_backend(fake).capabilities().ops for fake in CONVENTIONS))
    assert {q.op for q in QUESTIONS.values()} <= ops


@pytest.mark.parametrize("fake", sorted(CONVENTIONS))
def test_each_convention_fake_is_identified(fake):
    backend = _backend(fake)
    answers = _answers(backend)
    for name, q in QUESTIONS.items():
        if q.default_eps:
            continue
        if q.op not in backend.capabilities().ops:
            assert answers[name].outcome == "unsupported", (name, answers[name].reason)
            continue
        expected = CONVENTIONS[fake].get(name, q.reference)
        record = answers[name]
        assert record.outcome == "answered", (name, record.reason)
        assert record.answer == expected, (name, record.evidence)
        assert record.matched == (expected != "unmatched")


def test_reference_emulation_matches_the_oracle_on_every_float_probe():
    """The reference convention is the oracle's semantics, rounded: the hypotheses are anchored."""
    for name, q in QUESTIONS.items():
        probe = q.probe()
        if q.default_eps or probe.case.dtype != "float32":
            continue
        predicted = emulate(probe.case, probe.inputs, REFERENCE, grad=probe.grad)
        exact = oracle.evaluate(probe.case, probe.inputs, grad=probe.grad)
        for output in probe.outputs:
            scale = np.sqrt(np.mean(np.square(exact[output]))) or 1.0
            error = np.max(np.abs(predicted[output] - exact[output])) / scale
            assert error < q.noise(probe.case), (name, output, error)


def test_every_hypothesis_is_far_from_every_other_on_its_probe():
    """A probe is useful only if its hypotheses disagree by far more than the noise bound."""
    for name, q in QUESTIONS.items():
        if q.default_eps:
            continue
        probe = q.probe()
        predicted = {
            h: emulate(probe.case, probe.inputs, family[0], grad=probe.grad)
            for h, family in q.hypotheses.items()
        }
        for h, outputs in predicted.items():
            verdict = judge(q, probe, {o: outputs[o] for o in probe.outputs})
            assert verdict.answer == h and verdict.matched, (name, h, verdict.evidence)


class GroupEpsOutsideSqrt(GroupFake):
    """GroupNorm/InstanceNorm dividing by sqrt(var) + eps."""

    name = "group-eps-outside-sqrt"

    def rstd(self, var, eps):
        return 1.0 / (np.sqrt(var) + np.asarray(eps, var.dtype))


class GroupUnbiasedVariance(GroupFake):
    name = "group-unbiased-variance"

    def stats(self, x, axes):
        mean, var = super().stats(x, axes)
        n = int(np.prod([x.shape[a] for a in axes]))
        return mean, var * (n / (n - 1))


def test_group_convention_variants_are_identified():
    """eps placement and the variance divisor, asked of GroupNorm and InstanceNorm alike."""
    for fake, answer, questions in (
        (GroupEpsOutsideSqrt(), "added-to-std", ("group_norm.eps", "instance_norm.eps")),
        (GroupUnbiasedVariance(), "unbiased", ("group_norm.variance", "instance_norm.variance")),
    ):
        for name in questions:
            record = ask(fake, fake.capabilities(), QUESTIONS[name], timeout=30)
            assert (record.answer, record.matched) == (answer, True), (name, record.evidence)


@pytest.mark.parametrize("fake_class", [NumpyFake, GroupFake])
@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-12])
def test_default_eps_is_inferred_from_the_outputs(fake_class, eps):
    fake = fake_class()
    fake.default_eps = eps
    caps = fake.capabilities()
    names = {1e-5: "1e-05", 1e-6: "1e-06", 1e-12: "1e-12"}
    asked = _asked(fake, DEFAULT_EPS)
    assert asked
    for name in asked:
        record = ask(fake, caps, QUESTIONS[name], timeout=30)
        assert record.answer == names[eps], (name, record.estimate)
        assert record.estimate == pytest.approx(eps, rel=0.01)


@pytest.mark.parametrize(
    "fake", [_backend("fake-eps-outside-sqrt"), GroupEpsOutsideSqrt()], ids=lambda fake: fake.name
)
def test_default_eps_is_found_wherever_the_backend_adds_it(fake):
    for name in _asked(fake, DEFAULT_EPS):
        record = ask(fake, fake.capabilities(), QUESTIONS[name], timeout=30)
        assert record.answer == "1e-05", (name, record.estimate)


@pytest.mark.parametrize("fake", ["fake-gn-per-channel-stats", "fake-gn-one-pass-variance"])
def test_default_eps_is_found_whatever_the_group_statistics(fake):
    backend = _backend(fake)
    for name in _asked(backend, DEFAULT_EPS):
        assert ask(backend, backend.capabilities(), QUESTIONS[name], timeout=30).answer == "1e-05", name


def test_an_unlisted_default_eps_is_reported_with_its_estimate():
    fake = NumpyFake()
    fake.default_eps = 3e-6
    record = ask(fake, fake.capabilities(), QUESTIONS["layer_norm.default_eps"], timeout=30)
    assert record.answer == "unmatched" and not record.matched
    assert record.estimate == pytest.approx(3e-6, rel=1e-3)
    assert record.to_dict()["estimate"] == pytest.approx(3e-6, rel=1e-3)


def test_default_eps_needs_the_optional_hook():
    class NoHook:
        name = "no-hook"

        def capabilities(self):
            return NumpyFake().capabilities()

        def prepare(self, case, inputs, *, grad):
            return NumpyFake().prepare(case, inputs, grad=grad)

    record = ask(NoHook(), NoHook().capabilities(), QUESTIONS["rms_norm.default_eps"], timeout=30)
    assert record.outcome == "unsupported" and "prepare_default_eps" in record.reason


def test_an_output_no_hypothesis_explains_is_unmatched():
    class Scaled(NumpyFake):
        name = "scaled"

        def compute(self, case, inputs, grad):
            out = super().compute(case, inputs, grad)
            return {**out, "y": (out["y"].astype(np.float64) * 1.1).astype(out["y"].dtype)}

    record = ask(Scaled(), Scaled().capabilities(), QUESTIONS["layer_norm.eps"], timeout=30)
    assert record.answer == "unmatched" and not record.matched
    assert min(record.evidence.values()) > record.noise


def test_classify_needs_a_clear_winner_within_the_noise():
    assert classify({"a": 0.0, "b": 1.0}, noise=0.1) == ("a", True)
    assert classify({"a": 0.5, "b": 1.0}, noise=0.1) == ("unmatched", False)
    answer, matched = classify({"a": 0.01, "b": 0.02}, noise=0.1)
    assert answer.startswith("ambiguous") and not matched
    assert classify({"a": float("nan"), "b": 0.0}, noise=0.1) == ("b", True)


def test_an_unsupported_probe_is_reported_not_asked():
    fake = NumpyFake()
    caps = dataclasses.replace(fake.capabilities(), dtypes=frozenset({"float32"}))
    record = ask(fake, caps, QUESTIONS["rms_norm.weight_cast"], timeout=30)
    assert record.outcome == "unsupported" and "bfloat16" in record.reason


def test_records_are_additive_result_kinds():
    record = ask(NumpyFake(), NumpyFake().capabilities(), QUESTIONS["layer_norm.eps"], timeout=30).to_dict()
    assert record["kind"] == "fingerprint" and record["answer"] == "inside-sqrt"
    assert set(record["evidence"]) == {"inside-sqrt", "added-to-std", "dropped"}
    assert record["probe"] == record["probe_case"]["id"]


torch_only = pytest.mark.skipif(
    not any(name.startswith("torch") for name in conformance.adapter.registry.entries()),
    reason="torch adapters absent",
)


@pytest.fixture(scope="module")
def torch_answers():
    pytest.importorskip("torch")
    return {name: _answers(_backend(name)) for name in ("torch-eager", "torch-nn", "torch-functional")}


@torch_only
def test_torch_defaults_and_statistics_precision(torch_answers):
    """What the fingerprint finds in torch, recorded so a change in torch or the adapters shows."""
    answers = {b: {q: r.answer for q, r in found.items()} for b, found in torch_answers.items()}
    for library in ("torch-nn", "torch-functional"):
        assert answers[library]["layer_norm.default_eps"] == "1e-05"
        assert answers[library]["batch_norm.default_eps"] == "1e-05"
        assert answers[library]["rms_norm.default_eps"] == "finfo(float32).eps"
        assert answers[library]["layer_norm.stats_precision.bfloat16"] == "float32"
    assert answers["torch-eager"]["rms_norm.default_eps"] == "1e-06"
    assert answers["torch-eager"]["layer_norm.stats_precision.bfloat16"] == "activation-dtype"
    assert answers["torch-eager"]["rms_norm.stats_precision.bfloat16"] == "float32"
    for backend in answers.values():
        assert backend["layer_norm.eps"] == "inside-sqrt" and backend["batch_norm.momentum"] == "torch"


@torch_only
def test_torch_group_and_instance_norm_conventions(torch_answers):
    """torch's GroupNorm/InstanceNorm follow the reference everywhere but one place: nn.InstanceNorm*d
    passes momentum 0 to F.instance_norm when momentum=None, so its running statistics never move."""
    grouped = [n for n, q in QUESTIONS.items() if q.op in ("group_norm", "instance_norm")]
    for backend, found in torch_answers.items():
        if found["group_norm.eps"].outcome == "unsupported":
            continue  # the adapter does not declare the op (yet)
        answers = {name: found[name].answer for name in grouped}
        expected = {n: "1e-05" if QUESTIONS[n].default_eps else QUESTIONS[n].reference for n in grouped}
        if backend == "torch-nn":
            expected["instance_norm.momentum_none"] = "as-0"
        assert answers == expected, backend


def test_suite_run_records_fingerprints_and_properties_and_prints_their_tables(suite):
    run = suite(
        "-p",
        "fakes.property",
        "--backend",
        "fake-numpy,fake-bias-ignored,fake-spreads-nan",
        "--op",
        "layer_norm",
        "--profile",
        "smoke",
    )
    assert run.returncode == 1, run.output[-3000:]
    loaded = read_results(run.results)
    answers = {(r.backend, r.question): r for r in loaded.fingerprints}
    assert {q for _, q in answers} == {n for n, q in QUESTIONS.items() if q.op == "layer_norm"}
    assert answers["fake-bias-ignored", "layer_norm.bias"].answer == "ignored"
    assert answers["fake-numpy", "layer_norm.bias"].evidence["ignored"] > 0.1
    assert answers["fake-numpy", "layer_norm.default_eps"].answer == "1e-05"
    props = {(r.backend, r.property): r for r in loaded.properties}
    assert props["fake-spreads-nan", "nonfinite_containment"].outcome == "failed"
    counterexample = props["fake-spreads-nan", "nonfinite_containment"].counterexample
    assert counterexample is not None and counterexample["rows"] >= 2
    assert props["fake-numpy", "row_independence"].bitwise is True
    assert loaded.results and {r.check for r in loaded.results} <= set(checks.CHECK_NAMES)
    assert "ignored*" in run.output and "question" in run.output and "nonfinite_containment" in run.output
    invariant = "batch-invariant (bitwise): fake-bias-ignored (16 examples), fake-numpy (16 examples), "
    assert invariant + "fake-spreads-nan (16 examples)\n" in run.output


@pytest.mark.parametrize(
    "fake", [_backend("fake-unbiased-variance"), GroupUnbiasedVariance()], ids=lambda fake: fake.name
)
def test_default_eps_is_found_whatever_the_normalization_variance(fake):
    for name in _asked(fake, DEFAULT_EPS):
        assert ask(fake, fake.capabilities(), QUESTIONS[name], timeout=30).answer == "1e-05", name


def _oracle_sum_y(case: Case, inputs: dict, norm_input: str) -> np.ndarray:
    y = oracle.evaluate(dataclasses.replace(case, norm_input=norm_input), inputs, grad=False)["y"]
    return round_to(y, case.dtype)


def test_sum_read_tells_the_sums_apart() -> None:
    case = Case("add_rms_norm", (16, 64), "bfloat16", 1e-6)
    inputs = make_inputs(case, grad=False)
    rounded, exact = (_oracle_sum_y(case, inputs, name) for name in ("rounded", "exact"))
    assert sums.sum_read(case, inputs, rounded)["sum_normalized"] == "rounded"
    assert sums.sum_read(case, inputs, exact)["sum_normalized"] == "exact"
    half = np.where(np.arange(rounded.size).reshape(rounded.shape) % 2 == 0, rounded, exact)
    assert sums.sum_read(case, inputs, half)["sum_normalized"] == "mixed"
    # A float32 stream stores the sum it normalizes: nothing to read.
    stream = dataclasses.replace(case, residual_dtype="float32")
    assert sums.sum_read(stream, make_inputs(stream, grad=False), rounded) == {}


@pytest.mark.parametrize(("backend", "answer"), [("fake-numpy", "rounded"), ("fake-exact-sum", "exact")])
def test_every_backends_add_op_results_say_which_sum_it_normalized(suite, backend, answer):
    run = suite(
        "-p", "fakes.ledger", "--backend", backend, "--profile", "smoke",
        "--op", "add_rms_norm", "--dtype", "bfloat16", "-k", "test_forward",
    )  # fmt: skip
    asked = [r for r in run.records if r["check"] == "forward" and r["case"].get("norm_input") is None]
    forward = [r for r in asked if r["case"].get("residual_dtype") is None]  # a half stream, the stored sum
    read = [r["extra"]["info"]["sum_normalized"] for r in forward]
    # Rows where the two sums' outputs round alike (constant rows) cannot tell them apart.
    assert answer in read and set(read) <= {answer, "indistinguishable"}, run.output[-2000:]


class _NoBias(NumpyFake):
    """A LayerNorm class without a bias (CohereLayerNorm): a case with one is Unsupported."""

    name = "fake-no-bias"

    def prepare(self, case, inputs, *, grad):
        if case.op == "layer_norm" and "bias" in inputs:
            raise conformance.Unsupported("this class has no bias; bias=True")
        return super().prepare(case, inputs, grad=grad)


class _NoBiasEpsOutside(_NoBias):
    """The same class computing sqrt(var) + eps: the bias-free probes must still tell it apart."""

    name = "fake-no-bias-eps-outside"

    def compute(self, case, inputs, grad):
        return _backend("fake-eps-outside-sqrt").compute(case, inputs, grad)


LN_QUESTIONS = [name for name, q in QUESTIONS.items() if q.op == "layer_norm" and not q.default_eps]


@pytest.mark.parametrize(
    ("fake", "changed"), [(_NoBias, {}), (_NoBiasEpsOutside, {"layer_norm.eps": "added-to-std"})]
)
def test_a_class_without_a_bias_is_asked_with_the_probes_bias_left_out(fake, changed):
    backend = fake()
    for name in LN_QUESTIONS:
        record = ask(backend, backend.capabilities(), QUESTIONS[name], timeout=30)
        if name == "layer_norm.bias":  # its probe's bias is not zero: not askable without one
            assert record.outcome == "unsupported" and "has no bias" in record.reason
            continue
        assert record.outcome == "answered", (name, record.reason)
        assert record.answer == changed.get(name, QUESTIONS[name].reference), (name, record.evidence)
        assert record.probe["bias"] is False
        assert record.reason.startswith("asked without the probe's zero bias, which prepare() refused")


@pytest.mark.parametrize(
    ("fake", "given", "executes"),
    [
        ("fake-float64-in-float32", "float64", "float32"),
        ("fake-executes-float32-in-bfloat16", "float32", "bfloat16"),
        ("fake-bfloat16-execution", "float16", "bfloat16"),
    ],
)
def test_an_execution_precision_policy_is_named_and_gates_the_probes_of_that_dtype(fake, given, executes):
    from conformance.fingerprint.questions import GATES

    import fakes.precision  # noqa: F401  (registers fake-executes-float32-in-bfloat16)

    backend = _backend(fake)
    answers = _answers(backend)
    gates = {name for (op, dtype), name in GATES.items() if dtype == given}
    for name in gates:
        assert (answers[name].answer, answers[name].matched) == (executes, True), answers[name].evidence
    gated = [
        name
        for name, q in QUESTIONS.items()
        if GATES.get((q.op, q.probe().case.dtype)) in gates and name not in gates
    ]
    assert gated
    for name in gated:
        record = answers[name]
        assert (record.outcome, record.matched) == ("answered", False), name
        assert record.answer == f"not askable: executes in {executes}"
        assert record.cell == f"not askable: {executes}"
    # The reference fake computes in the dtype it is given: nothing is gated.
    reference = _answers(_backend("fake-numpy"))
    for name in gated:
        assert not reference[name].answer.startswith("not askable"), name
    for name in gates:
        assert reference[name].answer == QUESTIONS[name].reference


def test_the_grid_metric_reads_outputs_on_the_bfloat16_grid_apart_from_values_within_rounding():
    wide = np.random.default_rng(5).standard_normal(256).astype(np.float32).astype(np.float64)
    narrow = round_to(wide, "bfloat16").astype(np.float64)
    # Within a bfloat16 rounding of each other, yet one is all on the grid and the other all off it.
    assert rel_error(narrow, wide) < 0.02
    assert grid_error(narrow, wide) == 1.0 and grid_error(wide, narrow) == 1.0
    assert grid_error(narrow, narrow) == 0.0 and grid_error(wide, wide) == 0.0
    # On the same grid, values far apart still count: twice the relative error.
    assert grid_error(narrow, 2 * narrow) == pytest.approx(2 * rel_error(narrow, 2 * narrow))
