"""conformance.model.casefile: JSON and TOML case files load; every bad file names itself and the entry."""

from __future__ import annotations

import json

import pytest

from conformance.model.case import Case
from conformance.model.casefile import CaseFileError, read_cases

LN = Case("layer_norm", (4, 8), "float32", 1e-5)
BN = Case("batch_norm", (6, 3, 5), "bfloat16", 1e-5, training=True, momentum=None, bias=False)


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_json_list_loads(tmp_path):
    path = write(tmp_path, "cases.json", json.dumps([LN.to_dict(), BN.to_dict()]))
    assert read_cases(path) == [LN, BN]


def test_json_entries_need_only_the_required_fields(tmp_path):
    path = write(
        tmp_path, "cases.json", '[{"op": "layer_norm", "shape": [4, 8], "dtype": "float32", "eps": 1e-5}]'
    )
    assert read_cases(path) == [LN]


def test_toml_case_array_loads(tmp_path):
    text = (
        '[[case]]\nop = "layer_norm"\nshape = [4, 8]\ndtype = "float32"\neps = 1e-5\n\n'
        '[[case]]\nop = "batch_norm"\nshape = [6, 3, 5]\ndtype = "bfloat16"\neps = 1e-5\n'
        "training = true\nbias = false\n"
    )
    cases = read_cases(write(tmp_path, "cases.toml", text))
    assert cases[0] == LN
    assert cases[1] == Case("batch_norm", (6, 3, 5), "bfloat16", 1e-5, training=True, bias=False)


def test_path_may_be_a_string(tmp_path):
    path = write(tmp_path, "cases.json", json.dumps([LN.to_dict()]))
    assert read_cases(str(path)) == [LN]


def test_duplicate_cases_are_listed_once_in_order(tmp_path):
    path = write(
        tmp_path, "cases.json", json.dumps([LN.to_dict(), BN.to_dict(), {**LN.to_dict(), "id": "x"}])
    )
    assert read_cases(path) == [LN, BN]


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("cases.yaml", "- op: layer_norm\n", "suffix '.yaml' is not allowed; allowed: .json, .toml"),
        ("cases", "[]", "suffix '' is not allowed"),
        ("cases.json", "[{", "cannot parse"),
        ("cases.toml", "[[case]\n", "cannot parse"),
        ("cases.json", json.dumps(LN.to_dict()), "expected a JSON list of objects"),
        ("cases.json", '"layer_norm"', "expected a JSON list of objects"),
        ("cases.toml", 'title = "no cases here"\n', "expected a [[case]] array"),
        ("cases.toml", "case = 3\n", "expected a [[case]] array"),
        ("cases.json", "[]", "no cases in file"),
    ],
)
def test_bad_file_names_the_file(tmp_path, name, text, words):
    path = write(tmp_path, name, text)
    with pytest.raises(CaseFileError) as info:
        read_cases(path)
    message = str(info.value)
    assert message.startswith(f"--cases={path}: ")
    assert words in message


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({**LN.to_dict(), "dtype": "float8"}, "dtype='float8' is not allowed"),
        ({**LN.to_dict(), "epsilon": 1e-5}, "unknown Case field(s) 'epsilon' (did you mean 'eps'?)"),
        ({"op": "layer_norm", "shape": [4, 8], "dtype": "float32"}, "missing Case field(s) ['eps']"),
        ({**LN.to_dict(), "shape": 8}, "not iterable"),  # TypeError from the Case constructor
        ([1, 2], "expected a table/object of Case fields"),
        ("layer_norm", "expected a table/object of Case fields"),
    ],
)
def test_bad_entry_names_the_file_and_its_index(tmp_path, bad, words):
    path = write(tmp_path, "cases.json", json.dumps([LN.to_dict(), BN.to_dict(), bad]))
    with pytest.raises(CaseFileError) as info:
        read_cases(path)
    message = str(info.value)
    assert message.startswith(f"--cases={path}: entry 2: ")
    assert words in message


def test_bad_toml_entry_names_its_index(tmp_path):
    text = (
        '[[case]]\nop = "layer_norm"\nshape = [4, 8]\ndtype = "float32"\neps = 1e-5\n\n'
        '[[case]]\nop = "rms_norm"\n'
    )
    path = write(tmp_path, "cases.toml", text)
    with pytest.raises(CaseFileError, match=r"entry 1: missing Case field\(s\) \['dtype', 'eps', 'shape'\]"):
        read_cases(path)


def test_parse_error_chains_the_cause(tmp_path):
    with pytest.raises(CaseFileError) as info:
        read_cases(write(tmp_path, "cases.json", "[{"))
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def test_missing_file_names_it(tmp_path):
    path = tmp_path / "absent.json"
    with pytest.raises(CaseFileError, match=r"absent\.json: cannot read"):
        read_cases(path)


def test_undecodable_file_names_it(tmp_path):
    path = tmp_path / "cases.json"
    path.write_bytes(b"\xff\xfe[{}]")
    with pytest.raises(CaseFileError, match=r"cases\.json"):
        read_cases(path)
