"""conformance.results: atomic JSON Lines writes, typed records read back, schema versions."""

from __future__ import annotations

import json

import pytest

from conformance.model.case import Case
from conformance.results.header import header_record
from conformance.results.records import read_raw, read_results, write_atomic
from conformance.results.result import Result
from conformance.results.schema import SCHEMA_VERSION, SchemaError

HEADER = {"kind": "header", "schema": SCHEMA_VERSION, "time": "2024-01-01T00:00:00+00:00", "environment": {}}


def result(outcome: str = "passed", **kw) -> dict:
    case = Case("layer_norm", (4, 8), "float32", 1e-5)
    return Result(backend="fake-a", case=case.to_dict(), check="forward", outcome=outcome, **kw).to_dict()


def lines(*records: object) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# ---------------------------------------------------------------- write_atomic


def test_write_then_read_round_trips(tmp_path):
    path = tmp_path / "out" / "results.jsonl"  # the parent is created
    records = [HEADER, result("passed"), result("failed", reason="y out of tolerance")]
    write_atomic(path, records)
    header, rows = read_raw(path)
    assert header == HEADER
    assert rows == records[1:]
    assert [r.to_dict() for r in read_results(path).results] == records[1:]
    assert leftovers(path.parent) == []


def test_write_accepts_a_generator(tmp_path):
    path = tmp_path / "results.jsonl"
    write_atomic(path, (r for r in [HEADER, result()]))
    assert len(read_results(path).results) == 1


def test_failure_in_the_middle_keeps_the_old_file(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(lines(HEADER, result("passed")))
    old = path.read_bytes()

    def records():
        yield HEADER
        yield result("failed")
        raise RuntimeError("controller interrupted")

    with pytest.raises(RuntimeError, match="controller interrupted"):
        write_atomic(path, records())
    assert path.read_bytes() == old
    assert leftovers(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_unserialisable_record_keeps_the_old_file(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(lines(HEADER))
    old = path.read_bytes()
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        write_atomic(path, [HEADER, {"kind": "result", "worst_ratio": float("inf")}])
    assert path.read_bytes() == old
    assert leftovers(tmp_path) == []


def test_failure_without_an_old_file_leaves_nothing(tmp_path):
    path = tmp_path / "results.jsonl"

    def records():
        yield HEADER
        raise KeyboardInterrupt  # BaseException too: ^C must not leave a temp file

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, records())
    assert list(tmp_path.iterdir()) == []


def test_successful_write_replaces_the_old_file(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("old\n")
    write_atomic(path, [HEADER])
    assert path.read_text() == json.dumps(HEADER) + "\n"


# ---------------------------------------------------------------- read


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "first record must be the header"),
        ("\n\n", "first record must be the header"),
        (lines(result()), "first record must be the header"),
        (lines(HEADER) + "{not json\n", "corrupt results line"),
        (lines(HEADER)[:-3] + "\n", "corrupt results line"),  # truncated header
        (lines({**HEADER, "schema": 3}), "schema=3 is not allowed; allowed: 1, 2"),
        (lines({**HEADER, "schema": "1"}), "schema='1' is not allowed"),
        (lines({k: v for k, v in HEADER.items() if k != "schema"}), "schema=None is not allowed"),
    ],
)
def test_read_rejects_with_the_file_name(tmp_path, text, words):
    path = tmp_path / "results.jsonl"
    path.write_text(text)
    with pytest.raises(SchemaError) as info:
        read_results(path)
    assert str(info.value).startswith(f"{path}: ")
    assert words in str(info.value)


def test_read_missing_file_names_it(tmp_path):
    with pytest.raises(SchemaError, match=r"absent\.jsonl: cannot read results"):
        read_results(tmp_path / "absent.jsonl")


def test_read_skips_blank_lines_and_kinds_it_does_not_know(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(lines(HEADER) + "\n" + lines({"kind": "note", "text": "x"}, result()))
    loaded = read_results(str(path))
    assert [r.check for r in loaded.results] == ["forward"]
    assert (loaded.fingerprints, loaded.properties) == ((), ())


@pytest.mark.parametrize(
    "text", [lines([1]), lines(HEADER) + "5\n"], ids=["header-not-object", "record-not-object"]
)
def test_read_rejects_a_json_line_that_is_not_an_object(tmp_path, text):
    path = tmp_path / "results.jsonl"
    path.write_text(text)
    with pytest.raises(SchemaError, match=r"results\.jsonl"):
        read_results(path)


# ---------------------------------------------------------------- records


def test_result_to_dict_shape():
    record = result("xfailed", reason="known", duration_s=0.1234567, reproduce="pytest x")
    assert record["kind"] == "result"
    assert record["outcome"] == "xfailed"
    assert record["duration_s"] == 0.123457
    assert record["case"]["id"] == "layer_norm-float32-4x8-eps1e-05-normal"
    assert "extra" not in record
    assert result(extra={"warnings": ["w"]})["extra"] == {"warnings": ["w"]}
    json.dumps(record, allow_nan=False)


def test_header_carries_schema_and_environment(tmp_path):
    header = header_record(tmp_path, tolerances_sha256="abc")
    assert header["kind"] == "header"
    assert header["schema"] == SCHEMA_VERSION == 2
    assert header["tolerances_sha256"] == "abc"
    assert header["environment"]["packages"]["numpy"]
    json.dumps(header, allow_nan=False)
