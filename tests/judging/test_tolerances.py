"""conformance.judging.tolerances: the built-in matrix covers every comparison; bad files fail to load."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from conformance.judging import tolerances
from conformance.judging.tolerances import KEYS, ToleranceError, read_tolerances
from conformance.model.case import DISTS
from conformance.model.dtypes import DTYPES

COMPARED_OPS = ("layer_norm", "rms_norm", "batch_norm")
COMPARED_OUTPUTS = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")


@pytest.fixture(scope="module")
def builtin():
    return read_tolerances()


def write(tmp_path, body: str, name: str = "tol.toml"):
    path = tmp_path / name
    path.write_text(body)
    return path


def rule(why: str = "because", rtol: float = 1e-3, atol: float = 1e-3, **keys: str) -> str:
    lines = ["[[rule]]", *(f'{k} = "{v}"' for k, v in keys.items()), f"rtol = {rtol}", f"atol = {atol}"]
    if why is not None:
        lines.append(f'why = "{why}"')
    return "\n".join(lines) + "\n\n"


# ---------------------------------------------------------------- the built-in file


def test_builtin_file_loads_with_identity(builtin):
    assert builtin.path == str(tolerances.default_path())
    assert builtin.sha256 == hashlib.sha256(tolerances.default_path().read_bytes()).hexdigest()
    assert builtin.rules


def test_every_compared_query_finds_a_rule(builtin):
    for op, output, dtype, dist in itertools.product(COMPARED_OPS, COMPARED_OUTPUTS, DTYPES, DISTS):
        tol = builtin.lookup(op, output, dtype, dist)
        assert tol.why.strip(), (op, output, dtype, dist)
        assert tol.rtol >= 0 and tol.atol >= 0 and tol.cond >= 0
        assert tol.source.startswith("tolerances.toml rule[")


def test_every_rule_has_a_why_and_no_backend(builtin):
    for r in builtin.rules:
        assert r.why.strip(), r.source
        assert "backend" not in r.source


def test_lower_precision_is_never_stricter(builtin):
    # A sanity property of the matrix: tolerances grow as the unit roundoff grows.
    order = ("float64", "float32", "float16", "bfloat16")
    for output in ("y", "dx", "dweight", "dbias"):
        rtols = [builtin.lookup("layer_norm", output, d, "normal").rtol for d in order]
        assert rtols == sorted(rtols), output


# ---------------------------------------------------------------- most specific wins


def test_most_specific_rule_wins(tmp_path):
    path = write(
        tmp_path,
        rule("catch-all", rtol=1)
        + rule("every y", rtol=2, output="y")
        + rule("float32 y", rtol=3, output="y", dtype="float32")
        + rule(
            "offset float32 y of layer_norm",
            rtol=4,
            op="layer_norm",
            output="y",
            dtype="float32",
            dist="offset",
        ),
    )
    table = read_tolerances(path)
    assert table.lookup("rms_norm", "dx", "float16", "normal").rtol == 1
    assert table.lookup("rms_norm", "y", "float16", "normal").rtol == 2
    assert table.lookup("rms_norm", "y", "float32", "offset").rtol == 3
    chosen = table.lookup("layer_norm", "y", "float32", "offset")
    assert chosen.rtol == 4
    assert chosen.why == "offset float32 y of layer_norm"
    assert chosen.source == "tol.toml rule[3] op=layer_norm output=y dtype=float32 dist=offset"
    assert table.lookup("batch_norm", "dbias", "bfloat16", "zeros").source == "tol.toml rule[0] (catch-all)"


def _mixed_file(tmp_path):
    """Rules open in every combination of keys, two rules naming the same value of one key."""
    return read_tolerances(
        write(
            tmp_path,
            rule("catch-all", rtol=1)
            + rule("every y", rtol=2, output="y")
            + rule("every dx", rtol=3, output="dx")
            + rule("float32", rtol=4, dtype="float32")
            + rule("float32 y", rtol=5, output="y", dtype="float32")
            + rule("float32 dx", rtol=8, output="dx", dtype="float32")
            + rule("offset rms dx", rtol=6, op="rms_norm", output="dx", dist="offset")
            + rule("bf16 large ln", rtol=7, op="layer_norm", dtype="bfloat16", dist="large"),
        )
    )


@pytest.mark.parametrize("which", ["builtin", "mixed"])
def test_the_rule_index_finds_the_rules_a_scan_finds(builtin, tmp_path, which):
    # The index (a bitmask per key value) stands in for testing each rule's `matches`: over the whole
    # key space, and for values outside it (only the rules that leave that key open match them).
    table = builtin if which == "builtin" else _mixed_file(tmp_path)
    space = [(*tolerances._ALLOWED[key], "not-a-value") for key in KEYS]
    for query in itertools.product(*space):
        scanned = [r for r in table.rules if r.matches(query)]
        assert table._index.candidates(query) == scanned, query


def test_a_repeated_lookup_answers_as_the_first(tmp_path):
    table = _mixed_file(tmp_path)
    fresh = _mixed_file(tmp_path)
    queries = list(itertools.product(("layer_norm", "rms_norm"), ("y", "dx", "dbias"), DTYPES, DISTS))
    first = [table.lookup(*q) for q in queries]
    # Asked again, in another order, and against a table that never answered them.
    assert [table.lookup(*q) for q in reversed(queries)] == first[::-1]
    assert [fresh.lookup(*q) for q in queries] == first
    assert table.lookup("rms_norm", "dx", "float32", "offset").rtol == 6
    assert table.lookup("rms_norm", "dx", "float32", "normal").rtol == 8
    assert table.lookup("rms_norm", "dbias", "float32", "normal").rtol == 4
    # The answers are remembered by the table only: equal tables compare equal whatever they answered.
    assert table == fresh == read_tolerances(table.path)


def test_star_means_any(tmp_path):
    table = read_tolerances(write(tmp_path, rule(op="*", output="y")))
    assert table.rules[0].op is None
    assert table.lookup("batch_norm", "y", "float16", "large").source == "tol.toml rule[0] output=y"


def test_cond_defaults_to_zero_and_why_is_stripped(tmp_path):
    table = read_tolerances(write(tmp_path, rule(why="  padded  ", output="y")))
    assert table.rules[0].cond == 0.0
    assert table.rules[0].why == "padded"


def test_no_matching_rule_names_the_query(tmp_path):
    table = read_tolerances(write(tmp_path, rule(output="y")))
    with pytest.raises(
        ToleranceError, match="no rule matches op=layer_norm output=dx dtype=float32 dist=normal"
    ):
        table.lookup("layer_norm", "dx", "float32", "normal")


# ---------------------------------------------------------------- malformed files


@pytest.mark.parametrize(
    ("body", "index", "words"),
    [
        (
            rule(output="y")
            + rule(output="dx")
            + '[[rule]]\noutput = "y"\nrtol = 1\natol = 1\nwhy = "x"\nbackend = "torch"\n',
            2,
            ["unknown field(s) ['backend']"],
        ),
        (rule(dtype="float8"), 0, ["dtype='float8' is not allowed", "float32"]),
        (rule(output="y") + rule(op="spectral_norm"), 1, ["op='spectral_norm' is not allowed", "layer_norm"]),
        (rule(output="z"), 0, ["output='z' is not allowed", "running_var"]),
        (rule(dist="uniform"), 0, ["dist='uniform' is not allowed", "near_constant"]),
        (rule(output="y", rtol=-1e-3), 0, ["rtol=-0.001 is not allowed", "a finite number >= 0"]),
        (rule(output="y", atol=-1), 0, ["atol=-1 is not allowed"]),
        (rule(output="y") + rule(output="dx", rtol="nan"), 1, ["rtol=nan is not allowed"]),
        ('[[rule]]\noutput = "y"\natol = 1\nwhy = "x"\n', 0, ["rtol=None is not allowed"]),
        ('[[rule]]\noutput = "y"\nrtol = "1e-3"\natol = 1\nwhy = "x"\n', 0, ["rtol='1e-3' is not allowed"]),
        ('[[rule]]\noutput = "y"\nrtol = true\natol = 1\nwhy = "x"\n', 0, ["rtol=True is not allowed"]),
        ('[[rule]]\noutput = "y"\nrtol = 1\natol = 1\ncond = -2\nwhy = "x"\n', 0, ["cond=-2 is not allowed"]),
        (
            '[[rule]]\noutput = "y"\nrtol = 1\natol = 1\n',
            0,
            ["why=None is not allowed", "non-empty explanation"],
        ),
        ('[[rule]]\noutput = "y"\nrtol = 1\natol = 1\nwhy = "   "\n', 0, ["why='   ' is not allowed"]),
    ],
)
def test_malformed_rule_names_file_rule_and_field(tmp_path, body, index, words):
    path = write(tmp_path, body)
    with pytest.raises(ToleranceError) as info:
        read_tolerances(path)
    message = str(info.value)
    assert message.startswith(f"{path}: rule[{index}]: ")
    for word in words:
        assert word in message


def test_equally_specific_overlapping_rules_tie(tmp_path):
    path = write(
        tmp_path, rule(output="dx") + rule(op="layer_norm", output="y") + rule(output="y", dtype="float32")
    )
    with pytest.raises(ToleranceError) as info:
        read_tolerances(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert "rule[1] op=layer_norm output=y and rule[2] output=y dtype=float32 tie" in message
    assert "op=layer_norm output=y dtype=float32 dist=" in message


def test_a_more_specific_rule_breaks_a_tie(tmp_path):
    body = (
        rule(op="layer_norm", output="y")
        + rule(output="y", dtype="float32")
        + rule(op="layer_norm", output="y", dtype="float32", rtol=7)
    )
    assert read_tolerances(write(tmp_path, body)).lookup("layer_norm", "y", "float32", "normal").rtol == 7


def test_disjoint_equally_specific_rules_do_not_tie(tmp_path):
    table = read_tolerances(
        write(tmp_path, rule(output="y", dtype="float32") + rule(output="y", dtype="float16"))
    )
    assert len(table.rules) == 2


def test_duplicate_rules_tie(tmp_path):
    with pytest.raises(ToleranceError, match=r"rule\[0\] output=y and rule\[1\] output=y tie"):
        read_tolerances(write(tmp_path, rule(output="y") + rule(output="y")))


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("", "expected one or more [[rule]] tables"),
        ("rule = 3\n", "expected one or more [[rule]] tables"),
        ("[[rule\n", "cannot read tolerance file"),
        ("rule = [1]\n", "rule[0]: expected a table"),
    ],
)
def test_unreadable_or_empty_file_names_it(tmp_path, body, words):
    path = write(tmp_path, body)
    with pytest.raises(ToleranceError) as info:
        read_tolerances(path)
    assert str(info.value).startswith(f"{path}: ")
    assert words in str(info.value)


def test_missing_file_names_it(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(ToleranceError, match=r"absent\.toml: cannot read tolerance file") as info:
        read_tolerances(path)
    assert isinstance(info.value.__cause__, OSError)


def test_tolerance_names_its_rule_by_index_and_keys(builtin):
    tol = builtin.lookup("layer_norm", "y", "float32", "normal")
    rule = builtin.rules[tol.rule]
    assert (tol.rtol, tol.atol, tol.cond, tol.why) == (rule.rtol, rule.atol, rule.cond, rule.why)
    assert dict(tol.keys) == {k: v for k, v in zip(KEYS, rule.keys, strict=True) if v is not None}
    assert tol.keys.get("output") == "y" and tol.file == "tolerances.toml"
    # The rule is named by index and keys in text too, as messages show it.
    assert tol.source == f"tolerances.toml rule[{tol.rule}] " + " ".join(
        f"{k}={v}" for k, v in tol.keys.items()
    )


def test_infinite_tolerance_is_refused(tmp_path):
    path = tmp_path / "inf.toml"
    path.write_text('[[rule]]\noutput = "y"\nrtol = inf\natol = 0\nwhy = "never fails"\n')
    with pytest.raises(
        ToleranceError, match=r"rule\[0\]: rtol=inf is not allowed; allowed: a finite number >= 0"
    ):
        tolerances.read_tolerances(path)
