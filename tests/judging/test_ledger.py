"""conformance.judging.ledger: matching known deviations and rejecting malformed entries."""

from __future__ import annotations

import hashlib

import pytest

from conformance.judging import ledger
from conformance.judging.ledger import LedgerError
from conformance.model.case import Case
from conformance.running.settings import load_ledger as _load_ledger

LN = Case("layer_norm", (4, 8), "float32", 1e-5)
RMS16 = Case("rms_norm", (4, 8), "float16", 1e-6, dist="offset")
BN_TRAIN = Case("batch_norm", (4, 3), "float32", 1e-5, training=True)
BN_EVAL = Case("batch_norm", (4, 3), "float32", 1e-5)


def load_ledger(path=None, **options):
    """Only the given file's entries (the built-in ones are added unless left out)."""
    return _load_ledger(path, builtin=path is None, **options)


def write(tmp_path, body: str):
    path = tmp_path / "ledger.toml"
    path.write_text(body)
    return path


ENTRY = (
    '[[deviation]]\nbackend = "fake-a"\ncheck = "forward"\noutput = "y"\nband = [1, 2]\n'
    'note = "no model yet"\nreason = "r"\n'
)


def test_builtin_ledger_loads():
    table = load_ledger()
    assert table.path == str(ledger.default_path())
    files = ledger.builtin_files()
    assert {f.name for f in files} >= {"torch.toml", "onnx.toml", "openvino.toml"}
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.name}:{hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    assert table.sha256 == digest.hexdigest()
    assert [e.index for e in table.entries] == list(range(len(table.entries)))
    for entry in table.entries:
        assert entry.reason.strip() and entry.file.endswith(".toml")
        assert entry.model or entry.band[1] >= entry.band[0] >= (0.0 if entry.measure == "rounding" else 1.0)


def test_builtin_entries_are_predicates_and_every_band_says_why_and_where():
    # A built-in entry names where it applies, never a list of case ids; one without a model yet keeps
    # its band on the platform it was measured on and says why no model explains it.
    for entry in load_ledger().entries:
        assert not entry.lists_cases, entry.index
        if not entry.model:
            assert entry.note.strip() and entry.condition.devices, entry.index


def test_empty_file_is_an_empty_ledger(tmp_path):
    table = load_ledger(write(tmp_path, "# nothing known\n"))
    assert table.entries == ()
    assert table.find("fake-a", LN, "forward", "y") is None


def test_entry_fields_are_parsed(tmp_path):
    table = load_ledger(
        write(
            tmp_path,
            '[[deviation]]\nbackend = ["fake-a", "fake-b"]\ncheck = "backward"\noutput = "dx"\n'
            'op = "layer_norm"\n'
            'band = [1, 3.5]\nnote = "no model yet"\nreason = "float32 accumulation"\n'
            'link = "https://example.invalid/1"\n',
        )
    )
    (entry,) = table.entries
    assert entry.index == 0
    assert entry.match == {
        "backend": ("fake-a", "fake-b"),
        "check": ("backward",),
        "output": ("dx",),
        "op": ("layer_norm",),
    }
    assert entry.band == (1.0, 3.5)
    assert entry.training is None
    assert entry.link == "https://example.invalid/1"
    assert entry.to_dict()["match"]["backend"] == ["fake-a", "fake-b"]
    assert entry.to_dict()["band"] == [1.0, 3.5]


@pytest.mark.parametrize(
    ("extra", "matches", "misses"),
    [
        (
            "",
            [("fake-a", LN, "forward", "y"), ("fake-a", BN_TRAIN, "forward", "y")],
            [
                ("fake-b", LN, "forward", "y"),
                ("fake-a", LN, "backward", "y"),
                ("fake-a", LN, "forward", "dx"),
            ],
        ),
        (
            'op = ["rms_norm", "batch_norm"]\n',
            [("fake-a", RMS16, "forward", "y"), ("fake-a", BN_EVAL, "forward", "y")],
            [("fake-a", LN, "forward", "y")],
        ),
        ('dtype = "float16"\n', [("fake-a", RMS16, "forward", "y")], [("fake-a", LN, "forward", "y")]),
        ('dist = "offset"\n', [("fake-a", RMS16, "forward", "y")], [("fake-a", LN, "forward", "y")]),
        (
            'case = ["rms_norm-float16-*-offset", "batch_norm-*-train-*"]\n',
            [("fake-a", RMS16, "forward", "y"), ("fake-a", BN_TRAIN, "forward", "y")],
            [("fake-a", LN, "forward", "y"), ("fake-a", BN_EVAL, "forward", "y")],
        ),
        (
            "training = true\n",
            [("fake-a", BN_TRAIN, "forward", "y")],
            [("fake-a", BN_EVAL, "forward", "y"), ("fake-a", LN, "forward", "y")],
        ),
        (
            "training = false\n",
            [("fake-a", BN_EVAL, "forward", "y"), ("fake-a", LN, "forward", "y")],
            [("fake-a", BN_TRAIN, "forward", "y")],
        ),
    ],
    ids=["backend-check-output", "op", "dtype", "dist", "case-glob", "training", "eval"],
)
def test_matching(tmp_path, extra, matches, misses):
    table = load_ledger(write(tmp_path, ENTRY + extra))
    for query in matches:
        assert table.find(*query) is table.entries[0], query
    for query in misses:
        assert table.find(*query) is None, query


def test_case_glob_matches_the_whole_id(tmp_path):
    table = load_ledger(write(tmp_path, ENTRY + 'case = "layer_norm-float32"\n'))
    assert table.find("fake-a", LN, "forward", "y") is None  # a prefix is not a match; globs are explicit
    table = load_ledger(write(tmp_path, ENTRY + f'case = "{LN.id}"\n'))
    assert table.find("fake-a", LN, "forward", "y") is not None


def test_first_matching_entry_wins(tmp_path):
    table = load_ledger(
        write(tmp_path, ENTRY + 'dtype = "float16"\n' + ENTRY.replace('reason = "r"', 'reason = "second"'))
    )
    assert table.find("fake-a", RMS16, "forward", "y").index == 0
    assert table.find("fake-a", LN, "forward", "y").index == 1


@pytest.mark.parametrize(
    ("body", "index", "words"),
    [
        (ENTRY.replace('reason = "r"\n', ""), 0, "missing field 'reason'"),
        (ENTRY + ENTRY.replace('backend = "fake-a"\n', ""), 1, "missing field 'backend'"),
        (ENTRY.replace('check = "forward"\n', ""), 0, "missing field 'check'"),
        (ENTRY.replace('output = "y"\n', ""), 0, "missing field 'output'"),
        (ENTRY.replace("band = [1, 2]\n", ""), 0, "missing field 'model' (or 'band'"),
        (
            ENTRY.replace("[1, 2]", "[0.5, 2]"),
            0,
            "band=[0.5, 2] is not allowed; allowed: [low, high] with 1 <= low <= high",
        ),
        (ENTRY.replace("[1, 2]", "[3, 2]"), 0, "band=[3, 2] is not allowed"),
        (ENTRY.replace("[1, 2]", "[1, 2, 3]"), 0, "band=[1, 2, 3] is not allowed"),
        (ENTRY.replace("[1, 2]", '["1", "2"]'), 0, "band=['1', '2'] is not allowed"),
        (ENTRY.replace("[1, 2]", "2"), 0, "band=2 is not allowed"),
        (ENTRY + ENTRY + 'severity = "high"\n', 1, "unknown field(s) ['severity']"),
        (ENTRY + 'training = "yes"\n', 0, "training='yes' is not allowed; allowed: true, false"),
        (
            ENTRY.replace('"fake-a"', "[]"),
            0,
            "backend=[] is not allowed; allowed: a string or a list of strings",
        ),
        (ENTRY.replace('"fake-a"', "[1]"), 0, "backend=[1] is not allowed"),
        (ENTRY + "case = 3\n", 0, "case=3 is not allowed"),
        ("deviation = [1]\n", 0, "expected a table"),
    ],
)
def test_malformed_entry_names_file_and_index(tmp_path, body, index, words):
    path = write(tmp_path, body)
    with pytest.raises(LedgerError) as info:
        load_ledger(path)
    message = str(info.value)
    assert message.startswith(f"{path}: deviation[{index}]: ")
    assert words in message


@pytest.mark.parametrize(
    ("body", "words"),
    [("deviation = 1\n", "expected [[deviation]] tables"), ("[[deviation\n", "cannot read ledger")],
)
def test_unreadable_ledger_names_the_file(tmp_path, body, words):
    path = write(tmp_path, body)
    with pytest.raises(LedgerError) as info:
        load_ledger(path)
    assert str(info.value).startswith(f"{path}: ")
    assert words in str(info.value)


def test_missing_ledger_names_the_file(tmp_path):
    with pytest.raises(LedgerError, match=r"absent\.toml: cannot read ledger"):
        load_ledger(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("output", '"dw"', "output=['dw'] is not allowed; allowed: y, residual_out"),
        ("check", '"fwd"', "check=['fwd'] is not allowed; allowed: forward, backward"),
        ("dtype", '["float16", "fp8"]', "dtype=['fp8'] is not allowed"),
        ("reason", '" "', "reason='' is not allowed"),
    ],
)
def test_typo_in_an_entry_is_an_error_not_a_silent_mismatch(tmp_path, field, value, words):
    entry = {
        "backend": '"b"',
        "check": '"forward"',
        "output": '"y"',
        "band": "[1.0, 2.0]",
        "note": '"n"',
        "reason": '"r"',
    }
    entry[field] = value
    path = write(tmp_path, "[[deviation]]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items()))
    with pytest.raises(LedgerError, match="deviation\\[0\\]") as info:
        load_ledger(path)
    assert words in str(info.value)


# ----------------------------------------------------------------------------- measure = "rounding"
ROUNDING = (
    '[[deviation]]\nbackend = "fake-a"\ncheck = "forward"\noutput = "y"\nmeasure = "rounding"\n'
    'band = [0.0, 0.4]\nnote = "no model yet"\nreason = "statistics rounded to the activation dtype"\n'
)


def _biased(shift: float, ratio: float = 0.5):
    from conformance.results.result import ComparisonRecord, RoundingRecord, ToleranceRecord

    tol = ToleranceRecord(0.01, 0.01, 0.0, "t", "w", 0.01)
    rounding = RoundingRecord(shift, 0.01, 0.0, 0.01, 2000, 0.12)
    return ComparisonRecord(
        "y", 2000, 0, 0.1, 0.1, 1.0, ratio, (0,), 0.0, 0.0, 1.0, 0.0, 0.0, tol, rounding=rounding
    )


def test_a_rounding_entry_covers_a_bias_within_its_band(tmp_path):
    from conformance.judging.verdict import judge

    table = load_ledger(write(tmp_path, ROUNDING))
    assert table.entries[0].measure == "rounding" and table.entries[0].band == (0.0, 0.4)
    covered = judge("fake-a", LN, "forward", (_biased(-0.3),), table, "r")
    assert covered.outcome == "xfailed" and "statistics rounded" in covered.reason
    beyond = judge("fake-a", LN, "forward", (_biased(-0.45),), table, "r")
    assert beyond.outcome == "failed" and "rounding bias up to 0.4 ulp" in beyond.reason
    # Out of tolerance is another deviation than the one the entry describes.
    worse = judge("fake-a", LN, "forward", (_biased(-0.3, ratio=3.0),), table, "r")
    assert worse.outcome == "failed"
    # A pass is no failure: the entry was not observed here (another machine's kernels round otherwise).
    assert judge("fake-a", LN, "forward", (_biased(-0.01),), table, "r").outcome == "passed"
    # Strict mode (reference runs): an entry that lists the case claims it fails, so a pass is xpassed.
    listed = load_ledger(write(tmp_path, ROUNDING + f'case = "{LN.id}"\n'), strict=True)
    assert judge("fake-a", LN, "forward", (_biased(-0.01),), listed, "r").outcome == "xpassed"
    # A predicate entry claims a cause, not a case: strict mode judges it by whether the run observed it.
    strict = load_ledger(write(tmp_path, ROUNDING), strict=True)
    assert judge("fake-a", LN, "forward", (_biased(-0.01),), strict, "r").outcome == "passed"


def test_a_worst_ratio_entry_covers_its_comparison_whatever_the_bias(tmp_path):
    from conformance.judging.verdict import judge

    table = load_ledger(write(tmp_path, ENTRY))
    assert judge("fake-a", LN, "forward", (_biased(-0.45, ratio=1.5),), table, "r").outcome == "xfailed"
    # A bias alone (within tolerance) is not the deviation a worst_ratio entry records.
    assert judge("fake-a", LN, "forward", (_biased(-0.45),), table, "r").outcome == "failed"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            ROUNDING.replace('"rounding"', '"ulps"'),
            ["measure='ulps' is not allowed", "worst_ratio, rounding"],
        ),
        (ROUNDING.replace("[0.0, 0.4]", "[0.5, 0.4]"), ["band=[0.5, 0.4]", "0 <= low <= high"]),
        (ENTRY.replace("[1, 2]", "[0.5, 2]"), ["band=[0.5, 2]", "1 <= low <= high"]),
    ],
)
def test_malformed_measure_or_band_is_named(tmp_path, body, words):
    with pytest.raises(LedgerError) as info:
        load_ledger(write(tmp_path, body))
    for word in words:
        assert word in str(info.value)


def test_an_info_condition_applies_only_where_the_backend_recorded_that_choice(tmp_path):
    table = load_ledger(
        write(tmp_path, ENTRY + 'info = { norm_precision = ["bf16", "f32+bf16"], lowered = "true" }\n')
    )
    (entry,) = table.entries
    assert entry.info == (("lowered", ("true",)), ("norm_precision", ("bf16", "f32+bf16")))
    assert entry.to_dict()["info"] == {"lowered": ["true"], "norm_precision": ["bf16", "f32+bf16"]}
    assert table.find("fake-a", LN, "forward", "y", {"norm_precision": "bf16", "lowered": True}) is entry
    assert table.find("fake-a", LN, "forward", "y", {"norm_precision": "f32+bf16", "lowered": True}) is entry
    # The same deviation on a machine where the runtime kept f32: the entry does not apply (strictness).
    assert table.find("fake-a", LN, "forward", "y", {"norm_precision": "f32", "lowered": False}) is None
    assert table.find("fake-a", LN, "forward", "y", {"lowered": True}) is None
    # Checks that record no info (the properties) never match a conditioned entry.
    assert table.find("fake-a", LN, "forward", "y") is None


@pytest.mark.parametrize("value", ['"bf16"', "[1, 2]", "{ precision = 3 }", "{ precision = [] }"])
def test_a_malformed_info_condition_is_named(tmp_path, value):
    with pytest.raises(LedgerError, match=r"deviation\[0\]: info"):
        load_ledger(write(tmp_path, ENTRY + f"info = {value}\n"))
