"""normconf judge: a results file judged again under the current tolerances and ledger, no backend run."""

from __future__ import annotations

import gzip
import json

import ml_dtypes
import numpy as np

from conformance.cli import main
from conformance.results import stored

from support.ledger import ARGS, CHECKS, entry, ledger_file
from support.suite import TESTS


def test_stored_outputs_round_trip_exactly_and_only_when_small():
    half = np.linspace(-3, 3, 60).astype(ml_dtypes.bfloat16).reshape(6, 10)
    wide = np.random.default_rng(0).standard_normal((4, 5))
    back = stored.decode(stored.encode({"y": half, "dx": wide, "other": wide}, ("y", "dx")))
    assert set(back) == {"y", "dx"}
    assert np.array_equal(back["y"], half.astype(np.float32)) and back["dx"].dtype == np.float64
    assert np.array_equal(back["dx"], wide)
    assert stored.encode({"y": np.zeros(stored.ELEMENTS + 1)}, ("y",)) is None


def _failed_run(suite, tmp_path):
    run = suite("--backend", "fake-eps-float32", *ARGS, *CHECKS)
    assert run.returncode == 1
    failed = [r for r in run.records if r["outcome"] == "failed"]
    assert failed and all("outputs" in r["extra"] for r in failed)
    return run


def test_judge_applies_a_new_ledger_to_stored_outputs(suite, tmp_path, capsys):
    run = _failed_run(suite, tmp_path)
    mine = ledger_file(tmp_path, entry('"fake-eps-float32"'))
    out = tmp_path / "new.jsonl"
    assert main.main(["judge", str(run.results), "-o", str(out), "--ledger", mine]) == 0
    text = capsys.readouterr().out
    assert "failed -> xfailed" in text and "in full from stored outputs" in text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    header, results = records[0], [r for r in records[1:] if r.get("kind") == "result"]
    assert header["rejudged"]["from"] == str(run.results) and header["ledger"]["files"][-1] == mine
    xfailed = [r for r in results if r["outcome"] == "xfailed"]
    explained = [c["explained"] for r in xfailed for c in r["comparisons"] if "explained" in c]
    assert explained and all(x["passed"] and not x.get("point") for x in explained)
    # Under a model that is not the backend's, the same file stays failed.
    wrong = ledger_file(tmp_path, entry('"fake-eps-float32"', 'model = "fakes.ledger:eps_bfloat16"'))
    assert main.main(["judge", str(run.results), "-o", str(out), "--ledger", wrong]) == 1


def test_judge_without_stored_outputs_judges_the_worst_element_of_a_gzipped_file(suite, tmp_path, capsys):
    run = _failed_run(suite, tmp_path)
    lines = [json.loads(line) for line in run.results.read_text().splitlines()]
    for record in lines[1:]:
        record.get("extra", {}).pop("outputs", None)
    packed = tmp_path / "old.jsonl.gz"
    packed.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in lines).encode()))
    mine = ledger_file(tmp_path, entry('"fake-eps-float32"'))
    out = tmp_path / "new.jsonl"
    assert main.main(["judge", str(packed), "-o", str(out), "--ledger", mine]) == 0
    assert "from recorded figures" in capsys.readouterr().out
    records = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    explained = [
        c["explained"]
        for r in records
        if r.get("kind") == "result"
        for c in r["comparisons"]
        if "explained" in c
    ]
    assert explained and all(x["point"] and x["passed"] for x in explained)


def test_judge_names_an_unreadable_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main.main(["judge", str(bad), "-o", str(tmp_path / "out.jsonl")]) == 2
    assert "cannot read results" in capsys.readouterr().err


def test_compare_names_each_platform_and_the_deviations_a_model_now_explains(suite, tmp_path, capsys):
    run = _failed_run(suite, tmp_path)
    band = entry('"fake-eps-float32"', 'band = [1, 1e9]\nnote = "no model"')
    model = entry('"fake-eps-float32"')
    by_band, by_model = tmp_path / "band.jsonl", tmp_path / "model.jsonl"
    assert (
        main.main(["judge", str(run.results), "-o", str(by_band), "--ledger", ledger_file(tmp_path, band)])
        == 0
    )
    mine = tmp_path / "m"
    mine.mkdir()
    assert (
        main.main(["judge", str(run.results), "-o", str(by_model), "--ledger", ledger_file(mine, model)]) == 0
    )
    capsys.readouterr()
    assert main.main(["compare", str(by_band), str(by_model)]) == 0
    text = capsys.readouterr().out
    assert (
        text.startswith("base: ") and "CPU features: " in text and "fake-eps-float32 on cpu (numpy)" in text
    )
    assert "known deviations changed (no regression)" in text
    assert "xfailed -> xfailed (model eps_float32)" in text


H200 = TESTS / "data" / "h200_torch_functional.jsonl.gz"


def test_the_cuda_entries_explain_the_h200_records_and_nothing_is_xpassed(tmp_path, capsys):
    """The first H200 run's torch-functional records (torch 2.11 on CUDA; every failed and xfailed one and
    three of its xpassed): judged again here, with the platform they recorded, nothing fails and nothing
    is xpassed; the CUDA GroupNorm model reproduces each recorded worst element it is named for."""
    out = tmp_path / "h200.jsonl"
    assert main.main(["judge", str(H200), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "xpassed -> passed: 3" in text and "failed -> xfailed: 8" in text
    records = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert {r["outcome"] for r in records} == {"passed", "xfailed"}
    explained = [c["explained"] for r in records for c in r["comparisons"] if c.get("explained")]
    assert {x["model"] for x in explained} == {"half_statistics"}
    # y of three groups and the gradients of the offset and g32 ones, each judged at its recorded worst.
    assert len(explained) == 7 and all(x["point"] and x["passed"] for x in explained)
    # On the offset groups the model itself is as far from the oracle as the GPU was (y: 8.3 and 45).
    assert {8, 45} <= {round(x["model_ratio"]) for x in explained}
    # The same records judged as if they had run on the CPU: the CUDA entries do not apply.
    lines = [json.loads(line) for line in gzip.decompress(H200.read_bytes()).decode().splitlines()]
    lines[0]["backends"]["torch-functional"]["device"] = "cpu"
    cpu = tmp_path / "cpu.jsonl"
    cpu.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main.main(["judge", str(cpu), "-o", str(out)]) == 1
