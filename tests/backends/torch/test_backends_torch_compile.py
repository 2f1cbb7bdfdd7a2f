"""torch-compile: compiled once per key and reused across shapes, compile time reported apart from
run time, judged by the same checks and tolerances as every backend, unavailable without a compiler;
the add ops' residual conventions in one graph, and which sum that graph normalizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conformance import fingerprint, oracle
from conformance.adapter.backend import BackendUnavailable, Unsupported
from conformance.fingerprint import sums
from conformance.judging import tolerances
from conformance.model.case import Case
from conformance.model.dtypes import round_to, unit_roundoff
from conformance.model.inputs import make_inputs
from conformance.model.outputs import grad_outputs
from conformance.running import checks
from conformance.running.settings import load_ledger

from support.suite import ROOT

torch = pytest.importorskip("torch")
torch_compile = pytest.importorskip("backends.torch.compiled")
# Inductor's first compile in a process imports a module that uses a deprecated torch.jit API; the
# warning is torch's internal business (the suite records it in a result, these tests ignore it).
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def backend():
    try:
        backend = torch_compile.TorchCompile()
        backend.capabilities()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    return backend


def test_one_compile_serves_every_shape_of_a_key(backend) -> None:
    first, second = (Case("rms_norm", shape, "float32", 1e-5) for shape in ((4, 48), (16, 200)))
    compiled = backend.prepare(first, make_inputs(first), grad=False)
    reused = backend.prepare(second, make_inputs(second), grad=False)
    assert compiled.info()["graphs_compiled"] == 1 and compiled.info()["compile_s"] > 0
    assert reused.info()["graphs_compiled"] == 0 and reused.info()["compile_s"] == 0.0
    assert reused.info()["compile_key"] == compiled.info()["compile_key"]
    assert reused.info()["dynamic"] is True and reused.info()["fullgraph"] is True
    assert compiled.info()["compiled_on"] == reused.info()["compiled_on"] == "8x64"  # canonical shape


@pytest.mark.parametrize("check", ["forward", "backward"])
def test_passes_the_suite_checks(backend, check: str) -> None:
    case = Case("add_rms_norm", (8, 96), "float32", 1e-5)
    ctx = checks.CheckContext(tolerances.read_tolerances(), load_ledger(), timeout=300)
    result = checks.run_check(check, backend, backend.capabilities(), case, ctx)
    assert result.outcome == "passed", result.reason
    assert "compile_s" in result.extra["info"]


def test_dtype_mixes_follow_eager_torch(backend) -> None:
    case = Case("layer_norm", (4, 8), "float64", 1e-5, param_dtype="float32")
    with pytest.raises(Unsupported, match="param_dtype=float32"):
        backend.prepare(case, make_inputs(case, grad=True), grad=True)


def test_unavailable_without_a_cpp_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import cpp_builder

    def missing() -> str:
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(torch_compile.common, "device", lambda: torch.device("cpu"))
    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    with pytest.raises(BackendUnavailable, match="needs a C\\+\\+ compiler"):
        torch_compile.TorchCompile().capabilities()


def test_channel_ops_are_declared_only_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(torch_compile.OPS_VARIABLE, raising=False)
    assert torch_compile.declared_ops() == {"layer_norm", "rms_norm", "add_rms_norm", "add_layer_norm"}
    monkeypatch.setenv(torch_compile.OPS_VARIABLE, "all")
    assert {"batch_norm", "group_norm", "instance_norm"} <= torch_compile.declared_ops()
    monkeypatch.setenv(torch_compile.OPS_VARIABLE, "rms_norm,batch_norm")
    assert torch_compile.declared_ops() == {"rms_norm", "batch_norm"}
    monkeypatch.setenv(torch_compile.OPS_VARIABLE, "group_norm,instance_norm")
    assert torch_compile.declared_ops() == {"group_norm", "instance_norm"}
    monkeypatch.setenv(torch_compile.OPS_VARIABLE, "group_nrom")
    with pytest.raises(BackendUnavailable, match="NORMCONF_TORCH_COMPILE_OPS='group_nrom' is not allowed"):
        torch_compile.declared_ops()


def test_canonical_case_keeps_rank_size_one_dims_and_fields() -> None:
    canon = torch_compile._canonical
    assert canon(Case("layer_norm", (12, 100), "float16", 1e-5, dist="offset", seed=3)) == Case(
        "layer_norm", (8, 64), "float16", 1e-5
    )
    assert canon(Case("rms_norm", (1, 5, 6, 7), "bfloat16", 1e-6, norm_ndim=2)).shape == (1, 8, 64, 80)
    assert canon(Case("batch_norm", (4, 3, 1, 7), "float32", 1e-5, training=True)).shape == (8, 64, 1, 12)


def test_canonical_group_case_keeps_groups_layout_and_one_channel_groups() -> None:
    canon = torch_compile._canonical
    case = Case(
        "group_norm", (2, 8, 5, 5), "float16", 1e-5, num_groups=4, dist="offset", layout="channels_last"
    )
    # C = 4 G would be 16; 8 and 12 (2 G, 3 G) are taken by the batch and spatial dims.
    assert canon(case) == Case(
        "group_norm", (8, 16, 12, 20), "float16", 1e-5, num_groups=4, layout="channels_last"
    )
    assert canon(Case("group_norm", (3, 32, 7), "float32", 1e-5, num_groups=32)).shape == (8, 32, 12)
    assert canon(Case("group_norm", (1, 6, 1, 9), "float32", 1e-5, num_groups=3)).shape == (1, 6, 1, 8)
    modes = {"track_running_stats": True, "training": True, "momentum": None}
    assert canon(Case("instance_norm", (2, 4, 6, 7), "bfloat16", 1e-5, **modes)) == Case(
        "instance_norm", (8, 64, 12, 20), "bfloat16", 1e-5, **modes
    )


def test_group_norm_in_channels_last_passes_and_reaches_the_graph_so(backend, monkeypatch) -> None:
    monkeypatch.setenv(torch_compile.OPS_VARIABLE, "group_norm")
    case = Case("group_norm", (2, 4, 3, 5), "float32", 1e-5, num_groups=2, layout="channels_last")
    ctx = checks.CheckContext(tolerances.read_tolerances(), load_ledger(), timeout=300)
    result = checks.run_check("backward", backend, backend.capabilities(), case, ctx)
    assert result.outcome == "passed", result.reason
    info = result.extra["info"]
    assert info["memory_format"] == info["dy_memory_format"] == "channels_last"
    assert info["compile_key"].endswith("|groups=2|layout=channels_last")
    assert info["compiled_on"] == "8x4x12x20"


def test_instance_norm_momentum_none_is_one_step_of_the_average(backend, monkeypatch) -> None:
    monkeypatch.setenv(torch_compile.OPS_VARIABLE, "instance_norm")
    case = Case(
        "instance_norm", (3, 2, 8), "float32", 1e-5, track_running_stats=True, training=True, momentum=None
    )
    ctx = checks.CheckContext(tolerances.read_tolerances(), load_ledger(), timeout=300)
    result = checks.run_check("training", backend, backend.capabilities(), case, ctx)
    assert result.outcome == "passed", result.reason


# Prepares the listed cases (backward) in one fresh process with its own inductor cache and prints a
# digest of the last one's dx: what a case computes must not depend on what the process compiled first.
ORDER_PROBE = """
import hashlib, json, sys
from backends.torch.compiled import TorchCompile
from conformance.model.case import Case
from conformance.model.inputs import make_inputs
backend = TorchCompile()
for fields in json.loads(sys.argv[1]):
    case = Case(**{**fields, "shape": tuple(fields["shape"])})
    prepared = backend.prepare(case, make_inputs(case), grad=True)
    prepared(); prepared.synchronize()
print(hashlib.sha256(prepared.outputs()["dx"].tobytes()).hexdigest())
"""


def _dx_digest(tmp_path, name: str, cases: list[dict[str, object]]) -> str:
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name)}
    done = subprocess.run(
        [sys.executable, "-c", ORDER_PROBE, json.dumps(cases)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.heavy(70)
def test_a_case_computes_the_same_whatever_compiled_first(tmp_path) -> None:
    # Without a canonical first compile, a float16 LayerNorm backward first compiled on 8 x 7 gets
    # kernels whose dx on 12 x 100 offset rows is ~70x more accurate than when 12 x 100 compiles it.
    offset = {"op": "layer_norm", "shape": [12, 100], "dtype": "float16", "eps": 1e-5, "dist": "offset"}
    small = {"op": "layer_norm", "shape": [8, 7], "dtype": "float16", "eps": 1e-5}
    assert _dx_digest(tmp_path, "small-first", [small, offset]) == _dx_digest(tmp_path, "alone", [offset])


# Builds the case's canonical graph ahead (the precompile hook, twice) or prepares the case, in a fresh
# process on the graph cache ``sys.argv[2]``; prints the hook's answers, or inductor's FX graph cache
# counters and a digest of dx.
AHEAD_PROBE = """
import hashlib, json, os, sys
os.environ["NORMCONF_CACHE_DIR"] = sys.argv[2]
from torch._dynamo.utils import counters
from backends.torch.compiled import TorchCompile
from conformance.model.case import Case
from conformance.model.inputs import make_inputs
backend = TorchCompile()
case = Case("layer_norm", (12, 100), "float16", 1e-5, dist="offset")
if sys.argv[1] == "ahead":
    print(json.dumps([backend.precompile(case, grad=True), backend.precompile(case, grad=True)]))
else:
    prepared = backend.prepare(case, make_inputs(case, grad=True), grad=True)
    prepared(); prepared.synchronize()
    dx = hashlib.sha256(prepared.outputs()["dx"].tobytes()).hexdigest()
    fx = counters["inductor"]
    print(json.dumps({"hits": fx["fxgraph_cache_hit"], "misses": fx["fxgraph_cache_miss"], "dx": dx}))
"""


def _ahead_probe(tmp_path, what: str, graphs: str) -> object:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", AHEAD_PROBE, what, str(tmp_path / graphs)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.heavy(45)
def test_a_graph_built_ahead_is_the_graph_prepare_loads(tmp_path) -> None:
    # What conformance/running/precompile.py relies on: the hook compiles the canonical graph prepare()
    # would compile (same FX graph cache entry, same kernels), so a run that loads it computes the same.
    assert _ahead_probe(tmp_path, "ahead", "shared") == ["built", "cached"]
    loaded, alone = _ahead_probe(tmp_path, "run", "shared"), _ahead_probe(tmp_path, "run", "alone")
    assert loaded["misses"] == 0 and loaded["hits"] >= 1, loaded  # type: ignore[index]
    assert alone["misses"] >= 1, alone  # type: ignore[index]
    assert loaded["dx"] == alone["dx"]  # type: ignore[index]


# ------------------------------------------------------------------ the add ops' residual stream
ADD_CASES = [
    Case("add_layer_norm", (4, 48), "bfloat16", 1e-5),
    Case("add_layer_norm", (4, 48), "bfloat16", 1e-5, residual_dtype="float32"),
    Case("add_layer_norm", (4, 48), "bfloat16", 1e-5, norm_input="exact"),
    Case("add_rms_norm", (4, 48), "float16", 1e-6, residual_dtype="float32", norm_input="exact"),
]
# Test-local bound, as tests/backends/torch/test_backends_torch.py's: a wrong convention is off by far more.
BOUND_ULPS = 16.0


@pytest.mark.parametrize("case", ADD_CASES, ids=[c.id for c in ADD_CASES])
def test_add_ops_match_the_oracle_through_both_outputs(backend, case: Case) -> None:
    inputs = make_inputs(case, grad=True)
    prepared = backend.prepare(case, inputs, grad=True)
    prepared()
    out = prepared.outputs()
    expected = oracle.evaluate(case, inputs, grad=True)
    assert set(out) == {"y", "residual_out", *grad_outputs(case)}
    u = max(unit_roundoff(d) for d in (case.dtype, case.weight_dtype, case.stream_dtype))
    for key, value in out.items():
        err = np.max(np.abs(value.astype(np.float64) - expected[key]))
        assert err <= BOUND_ULPS * u * max(1.0, float(np.max(np.abs(expected[key])))), key
    assert prepared.info()["compile_key"].endswith(f"|sum={case.norm_input}")
    # The aliasing check sees the compiled graph's own tensors: its backward, too, returns one tensor for
    # dx and dresidual where both receive dL/dh unconverted (the declared alias), two where casts part them.
    buffers = prepared.buffers()
    assert {"x", "residual", "dresidual_out", "residual_out", "dx", "dresidual"} <= set(buffers)
    shared = buffers["dx"].data_ptr() == buffers["dresidual"].data_ptr()
    assert shared == (case.residual_dtype is None and case.norm_input == "rounded")


def _oracle_y(case: Case, inputs: dict[str, np.ndarray], norm_input: str) -> np.ndarray:
    y = oracle.evaluate(dataclasses.replace(case, norm_input=norm_input), inputs, grad=False)["y"]
    return round_to(y, case.dtype)


@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
def test_info_records_the_sum_the_fingerprint_finds(backend, op: str) -> None:
    """sum_read reads the sum from the case's own y; the fingerprint's question asks its crafted probe.
    Both must name the same sum for the default (rounded) convention in bfloat16."""
    record = fingerprint.ask(backend, backend.capabilities(), fingerprint.QUESTIONS[f"{op}.sum"], timeout=300)
    assert record.outcome == "answered" and record.matched, record
    for case, answer in (
        (Case(op, (16, 200), "bfloat16", 1e-5), record.answer),
        (Case(op, (16, 200), "bfloat16", 1e-5, norm_input="exact"), "exact"),
    ):
        given = make_inputs(case, grad=False)
        prepared = backend.prepare(case, given, grad=False)
        prepared()
        read = sums.sum_read(case, given, prepared.outputs()["y"])
        assert read["sum_normalized"] == answer, read["sum_evidence"]
