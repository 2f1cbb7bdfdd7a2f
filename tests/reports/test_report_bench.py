"""Benchmark JSON loading (pytest-benchmark's format), the benchmark table, charts and speed diffs."""

from __future__ import annotations

import json

import pytest

from conformance.results import benchjson, diff, runs
from reports import bench

from support.reports import BENCH_SMALL, case, result, write

SMALL = BENCH_SMALL
LN = "layer_norm-float32-64x384-eps1e-05-normal"
RMS = "rms_norm-bfloat16-64x384-eps1e-05-normal"


def test_reads_pytest_benchmark_json_with_normconf_extra_info():
    f = benchjson.read(SMALL)
    assert f.version == "5.1.0" and f.machine["cpu"]["brand_raw"] == "Test CPU @ 2.0GHz"
    assert len(f.benchmarks) == 6
    nn = f.by_key()[("torch-nn", LN, "forward")]
    assert nn.median_s == pytest.approx(20e-6) and nn.bytes == 2 * 64 * 384 * 4
    assert nn.gbps == pytest.approx(nn.bytes / 20e-6 / 1e9, rel=1e-3)
    assert nn.roofline_fraction == pytest.approx(nn.gbps / 20.0, rel=1e-3)
    assert nn.noise == pytest.approx(0.05) and nn.roofline_gbps == pytest.approx(20.0, rel=1e-3)
    assert f.by_key()[("torch-nn", LN, "backward")].check == "backward"
    (copy,) = f.auxiliary
    assert copy.name.endswith("test_copy_bandwidth") and copy.gbps == 20.0


def test_gbps_is_derived_from_bytes_when_missing(tmp_path):
    data = json.loads(SMALL.read_text())
    del data["benchmarks"][1]["extra_info"]["gbps"]
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    nn = benchjson.read(path).by_key()[("torch-nn", LN, "forward")]
    assert nn.gbps == pytest.approx(nn.bytes / nn.median_s / 1e9)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d.pop("benchmarks"),
            "not pytest-benchmark JSON: expected an object with a 'benchmarks' list",
        ),
        (lambda d: d["benchmarks"][1].pop("stats"), "benchmarks[1]: expected an object with 'stats'"),
        (lambda d: d["benchmarks"][1]["extra_info"].pop("backend"), "needs string 'case_id' and 'backend'"),
        (lambda d: d["benchmarks"][1]["extra_info"].update(check="sideways"), "extra_info.check='sideways'"),
        (lambda d: d["benchmarks"][1]["stats"].update(median=-1), "stats.median=-1 is not allowed"),
        (lambda d: d["benchmarks"][1]["extra_info"].update(bytes="many"), "extra_info.bytes='many'"),
    ],
)
def test_malformed_benchmark_files_name_file_entry_and_field(tmp_path, mutate, message):
    data = json.loads(SMALL.read_text())
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(benchjson.BenchError, match=r"bad\.json") as info:
        benchjson.read(path)
    assert message in str(info.value)


def test_unreadable_benchmark_file(tmp_path):
    (tmp_path / "c.json").write_text("{not json")
    with pytest.raises(benchjson.BenchError, match="cannot read benchmark JSON"):
        benchjson.read(tmp_path / "c.json")
    with pytest.raises(benchjson.BenchError, match="cannot read"):
        benchjson.read(tmp_path / "missing.json")


def _table(tmp_path, baseline=None):
    records = [
        result("torch-nn", case(id=LN)),
        result("torch-eager", case(id=LN), outcome="failed", ratios=(3.0,)),
    ]
    loaded = runs.read_runs([write(tmp_path / "r.jsonl", records)])
    return bench.bench_table([benchjson.read(SMALL)], loaded, baseline)


def test_table_has_speedups_against_the_baseline_and_marks_conformance(tmp_path):
    t = _table(tmp_path, "torch-eager")
    assert t.baseline == "torch-eager"
    row = next(r for r in t.rows if r.case_id == LN and r.check == "forward")
    assert row.op == "layer_norm" and row.dtype == "float32" and row.bytes == 2 * 64 * 384 * 4
    assert row.cells["torch-nn"].speedup == pytest.approx(2.5)
    assert row.cells["torch-eager"].speedup == pytest.approx(1.0)
    assert row.cells["torch-eager"].conformance == "failed" and row.cells["torch-nn"].conformance == "passed"
    rms = next(r for r in t.rows if r.case_id == RMS)
    assert (rms.op, rms.dtype) == ("rms_norm", "bfloat16")  # guessed from the id: no results for it
    assert t.auxiliary and "GB/s" in t.auxiliary[0][1]


def test_default_baseline_is_the_most_benchmarked_backend(tmp_path):
    assert _table(tmp_path).baseline == "torch-eager"  # a tie broken by name


def test_charts_group_by_op_dtype_check_with_roofline(tmp_path):
    t = _table(tmp_path)
    assert [c.title for c in t.charts] == [
        "layer_norm forward: GB/s",
        "layer_norm backward: GB/s",
        "rms_norm forward: GB/s",
    ]
    chart = t.charts[0]
    assert len(chart.bars) == 2 and all(0 < b.width <= chart.plot for b in chart.bars)
    assert chart.roofline is not None and 0 < chart.roofline <= chart.plot
    assert chart.ticks[0] == (0.0, "0") and chart.ticks[-1][0] == pytest.approx(chart.plot)


@pytest.mark.parametrize(("top", "step"), [(20.0, 5.0), (7.3, 2.0), (0.04, 0.01), (999.0, 200.0)])
def test_nice_step(top, step):
    assert bench.nice_step(top) == pytest.approx(step)


def test_speed_changes_count_only_beyond_the_noise():
    def b(median, iqr):
        return benchjson.Benchmark("n", "c", "x", "forward", median, iqr, 0.0, median, 10, 100, 1.0, 0.1)

    key = ("x", "c", "forward")
    t = diff.Thresholds(speed=0.05)
    slower, faster = diff.speed({key: b(10e-6, 0.2e-6)}, {key: b(11e-6, 0.2e-6)}, t)
    assert [s.change for s in slower] == [pytest.approx(0.1)] and not faster
    noisy = diff.speed({key: b(10e-6, 2e-6)}, {key: b(11e-6, 2e-6)}, t)
    assert noisy == ([], [])  # 10% slower, but each run's IQR is 20% of its median
    slower, faster = diff.speed({key: b(10e-6, 0.1e-6)}, {key: b(5e-6, 0.1e-6)}, t)
    assert not slower and faster[0].change == pytest.approx(-0.5)


def _with_device(tmp_path):
    """bench_small.json with torch-nn's layer_norm forward (median 20 us) measured on a device too."""
    data = json.loads(SMALL.read_text())
    data["benchmarks"][1]["extra_info"].update(
        device_ms=0.005, launches=3, h2d_copies=1, device_roofline_fraction=0.8, device_method="fake"
    )
    path = tmp_path / "device.json"
    path.write_text(json.dumps(data))
    return path


def test_device_fields_are_read_and_the_host_time_derived(tmp_path):
    f = benchjson.read(_with_device(tmp_path))
    nn = f.by_key()[("torch-nn", LN, "forward")]
    assert (nn.device_ms, nn.launches, nn.h2d_copies, nn.device_roofline_fraction) == (0.005, 3, 1, 0.8)
    assert nn.host_ms == pytest.approx(0.020 - 0.005)
    other = f.by_key()[("torch-nn", LN, "backward")]
    assert other.device_ms is None and other.host_ms is None  # a CPU record, or an older file


def test_tables_and_compare_show_device_and_host_time(tmp_path):
    records = [result("torch-nn", case(id=LN))]
    loaded = runs.read_runs([write(tmp_path / "r.jsonl", records)])
    t = bench.bench_table([benchjson.read(_with_device(tmp_path))], loaded, None)
    cell = next(r for r in t.rows if r.case_id == LN and r.check == "forward").cells["torch-nn"]
    assert cell.device_us == pytest.approx(5.0) and cell.host_us == pytest.approx(15.0)
    assert (cell.launches, cell.h2d_copies) == (3, 1)

    def b(median, device_ms):
        return benchjson.Benchmark(
            "n", LN, "torch-nn", "forward", median, 0.0, 0.0, median, 10, 100, 1.0, 0.1, device_ms
        )

    key = ("torch-nn", LN, "forward")
    slower, _ = diff.speed({key: b(10e-6, 0.004)}, {key: b(20e-6, 0.005)}, diff.Thresholds(speed=0.05))
    line = diff._speed_line(slower[0])
    assert "median 10 us -> 20 us (+100%" in line
    assert line.endswith("; device 4 us -> 5 us, host 6 us -> 15 us")
