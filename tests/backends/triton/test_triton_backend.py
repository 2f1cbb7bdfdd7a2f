"""The triton and triton-inplace adapters and their run mode: capabilities, outputs, the residual
conventions and the aliasing contract through the suite's own checks, recorded info, and what happens
when Triton cannot run or was imported by someone else first."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from backends.triton import backend as triton_backend  # noqa: E402
from backends.triton.kernels import mode  # noqa: E402
from conformance import BackendUnavailable, Case, Unsupported  # noqa: E402
from conformance.adapter import listing, registry  # noqa: E402
from conformance.judging import tolerances  # noqa: E402
from conformance.model.dtypes import numpy_dtype  # noqa: E402
from conformance.model.inputs import make_inputs  # noqa: E402
from conformance.model.outputs import output_dtype, output_shape, produced  # noqa: E402
from conformance.running import checks  # noqa: E402
from conformance.running.settings import load_ledger  # noqa: E402

from support.suite import ROOT  # noqa: E402

RUN = mode.select()
BACKEND = triton_backend.TritonBackend()
IN_PLACE = triton_backend.TritonInPlaceBackend()


def test_capabilities_declare_ops_dtypes_features_and_the_mode():
    caps = BACKEND.capabilities()
    assert caps.ops == {
        "layer_norm",
        "rms_norm",
        "add_rms_norm",
        "add_layer_norm",
        "group_norm",
        "instance_norm",
    }
    assert caps.dtypes == {"float64", "float32", "float16", "bfloat16"}
    assert {"backward", "weight_offset", "param_dtype", "multi_axis", "running_stats"} <= caps.features
    assert {"residual_dtype", "exact_sum"} <= caps.features
    assert caps.aliases == {"dresidual": "dx"}
    assert caps.notes["mode"].startswith(RUN.name)
    assert caps.device == RUN.device
    assert caps.why_not(Case("batch_norm", (4, 3), "float32", 1e-5)) is not None


def test_the_in_place_variant_declares_its_buffers_and_no_backward():
    caps = IN_PLACE.capabilities()
    assert caps.ops == {"add_rms_norm", "add_layer_norm"}
    assert caps.aliases == {"y": "x", "residual_out": "residual"}
    assert "exact_sum" in caps.features and "backward" not in caps.features
    wide = Case("add_rms_norm", (4, 24), "bfloat16", 1e-6, residual_dtype="float32")
    assert "residual_dtype" in (caps.why_not(wide) or "") and "residual_dtype" in caps.notes
    assert caps.why_not(Case("add_rms_norm", (4, 24), "bfloat16", 1e-6), grad=True) is not None


def test_channels_last_is_left_out_with_the_reason():
    caps = BACKEND.capabilities()
    case = Case("group_norm", (2, 4, 3, 5), "float32", 1e-5, num_groups=2, layout="channels_last")
    assert "channels_last" not in caps.features and "channels_last" in (caps.why_not(case) or "")
    assert "contiguous" in caps.notes["channels_last"]


@pytest.mark.skipif(RUN.device != "cpu", reason="a GPU is present: the kernels run natively")
def test_without_a_gpu_the_interpreter_is_switched_on():
    assert RUN.interpreted and os.environ["TRITON_INTERPRET"] == "1"
    assert "Triton interpreter" in BACKEND.capabilities().device_name


@pytest.mark.parametrize(
    "case",
    [
        Case("layer_norm", (3, 4, 10), "bfloat16", 1e-5, norm_ndim=2),
        Case("rms_norm", (5, 33), "float16", 1e-6, param_dtype="float32", weight_offset=1.0),
        Case("add_rms_norm", (4, 24), "bfloat16", 1e-6),
        Case("add_rms_norm", (4, 24), "float16", 1e-6, residual_dtype="float32", weight_offset=1.0),
        Case("add_layer_norm", (2, 3, 8), "bfloat16", 1e-5, norm_ndim=2, norm_input="exact"),
        Case("add_layer_norm", (4, 24), "bfloat16", 1e-5, residual_dtype="float32", param_dtype="float32"),
        Case("layer_norm", (4, 24), "float64", 1e-5, weight=False, bias=False),
        Case("group_norm", (2, 6, 5), "bfloat16", 1e-5, num_groups=3, param_dtype="float32"),
        Case("instance_norm", (2, 3, 6), "float32", 1e-5, weight=False, bias=False),
        Case("instance_norm", (2, 3, 6), "float16", 1e-5, track_running_stats=True),
        Case(
            "instance_norm",
            (2, 3, 6),
            "bfloat16",
            1e-5,
            track_running_stats=True,
            training=True,
            momentum=None,
        ),
    ],
    ids=lambda c: c.id,
)
def test_outputs_have_the_contract_keys_shapes_and_dtypes(case):
    inputs = make_inputs(case, grad=True)
    pristine = {k: v.copy() for k, v in inputs.items()}
    prepared = BACKEND.prepare(case, inputs, grad=True)
    prepared()
    prepared.synchronize()
    first = prepared.outputs()
    assert set(first) == set(produced(case, True))
    for name, value in first.items():
        assert value.shape == output_shape(case, name)
        assert value.dtype == numpy_dtype(output_dtype(case, name)), name
    prepared()
    second = prepared.outputs()
    for name in first:
        assert first[name].tobytes() == second[name].tobytes(), name
    for name, value in inputs.items():
        assert value.tobytes() == pristine[name].tobytes(), name


def test_info_records_the_mode_and_the_launch_shapes():
    case = Case("rms_norm", (2, 8200), "float32", 1e-6)
    prepared = BACKEND.prepare(case, make_inputs(case, grad=True), grad=True)
    info = prepared.info()
    assert info["mode"] == RUN.name and info["triton"]
    assert info["forward_chunks"] == 3 and info["backward_chunks"] == 3


def test_info_records_the_group_and_channel_launches():
    # Groups of 2 channels x 4100 values: three chunks; channel rows of 4100 values: two.
    case = Case("group_norm", (1, 4, 4100), "float32", 1e-5, num_groups=2)
    info = BACKEND.prepare(case, make_inputs(case, grad=True), grad=True).info()
    assert info["forward_chunks"] == 3 and info["backward_chunks"] == 3
    assert info["channel_sums_chunks"] == 2
    # Every group row (2) and channel row (4) has a program, whatever this machine's tile.
    assert info["forward_programs"] * info["forward_block_m"] >= 2
    assert info["channel_sums_programs"] * info["channel_sums_block_m"] >= 4


def test_a_training_call_starts_from_the_prepared_running_statistics():
    case = Case("instance_norm", (4, 3, 10), "float32", 1e-5, track_running_stats=True, training=True)
    inputs = make_inputs(case, grad=False)
    prepared = BACKEND.prepare(case, inputs, grad=False)
    prepared()
    first = prepared.outputs()
    prepared()
    second = prepared.outputs()
    # One update from the inputs each time, not two compounded.
    for name in ("running_mean", "running_var"):
        assert first[name].tobytes() == second[name].tobytes()
        assert not np.array_equal(first[name], inputs[name])


def test_forward_only_preparation_returns_forward_outputs():
    case = Case("add_rms_norm", (4, 24), "float32", 1e-6)
    inputs = make_inputs(case, grad=False)
    prepared = BACKEND.prepare(case, inputs, grad=False)
    prepared()
    assert set(prepared.outputs()) == {"y", "residual_out"}


# The residual stream's conventions on small rows: (residual_dtype, norm_input).
CONVENTIONS = [(None, "rounded"), (None, "exact"), ("float32", "rounded"), ("float32", "exact")]
CTX = checks.CheckContext(tolerances.read_tolerances(), load_ledger(), timeout=300)


def _add_case(op, stream, norm_input, dtype="bfloat16", shape=(6, 40)):
    eps = 1e-6 if op == "add_rms_norm" else 1e-5
    return Case(op, shape, dtype, eps, residual_dtype=stream, norm_input=norm_input)


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
@pytest.mark.parametrize(("stream", "norm_input"), CONVENTIONS)
@pytest.mark.parametrize("check", ["forward", "backward", "aliasing"])
def test_each_residual_convention_passes_the_suite_checks(op, stream, norm_input, check):
    case = _add_case(op, stream, norm_input)
    result = checks.run_check(check, BACKEND, BACKEND.capabilities(), case, CTX)
    assert result.outcome == "passed", result.reason
    if check == "aliasing":
        assert result.extra["info"]["memory_evidence"] == "buffers()"


@pytest.mark.parametrize(("stream", "shared"), [(None, True), ("float32", False)])
def test_dx_and_dresidual_share_one_buffer_only_with_one_stream_dtype(stream, shared):
    case = _add_case("add_layer_norm", stream, "rounded")
    prepared = BACKEND.prepare(case, make_inputs(case, grad=True), grad=True)
    prepared()
    buffers = prepared.buffers()
    assert (buffers["dx"].data_ptr() == buffers["dresidual"].data_ptr()) is shared
    # Every other output has memory of its own, apart from every input.
    inputs = {"x", "residual", "weight", "bias", "dy", "dresidual_out"}
    places = {name: buffers[name].data_ptr() for name in buffers if name != "dresidual"}
    assert len(set(places.values())) == len(places) and inputs < set(places)


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
@pytest.mark.parametrize("norm_input", ["rounded", "exact"])
@pytest.mark.parametrize("check", ["forward", "aliasing", "inputs_unchanged", "determinism"])
def test_the_in_place_variant_passes_the_suite_checks(op, norm_input, check):
    case = _add_case(op, None, norm_input, shape=(3, 4, 10))
    result = checks.run_check(check, IN_PLACE, IN_PLACE.capabilities(), case, CTX)
    assert result.outcome == "passed", result.reason


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
def test_the_in_place_variant_writes_the_given_arrays_with_the_out_of_place_bits(op):
    case = _add_case(op, None, "exact", dtype="float16")
    inputs = make_inputs(case, grad=False)
    given = {k: v.copy() for k, v in inputs.items()}
    out_of_place = BACKEND.prepare(case, inputs, grad=False)
    out_of_place()
    expected = out_of_place.outputs()
    prepared = IN_PLACE.prepare(case, given, grad=False)
    for _ in range(2):  # each call starts again from the inputs as given
        prepared()
        outputs = prepared.outputs()
        for name in ("y", "residual_out"):
            assert outputs[name].tobytes() == expected[name].tobytes(), name
    if RUN.device == "cpu":
        # On the CPU the kernel's buffers are the caller's arrays themselves.
        assert given["x"].tobytes() == expected["y"].tobytes()
        assert given["residual"].tobytes() == expected["residual_out"].tobytes()
    assert given["weight"].tobytes() == inputs["weight"].tobytes()


@pytest.mark.skipif(RUN.device != "cpu", reason="on a GPU the kernel writes device copies")
def test_the_in_place_variant_refuses_arrays_it_cannot_write():
    case = _add_case("add_rms_norm", None, "rounded")
    inputs = make_inputs(case, grad=False)
    inputs["residual"].flags.writeable = False
    with pytest.raises(Unsupported, match="writable"):
        IN_PLACE.prepare(case, inputs, grad=False)


def test_no_way_to_run_is_backend_unavailable_with_the_reason(monkeypatch):
    def unavailable():
        raise mode.ModeUnavailable("triton is not installed (pip install 'normconf[triton]')")

    monkeypatch.setattr(mode, "select", unavailable)
    with pytest.raises(BackendUnavailable, match="triton is not installed"):
        BACKEND.capabilities()
    entry = registry.Entry("triton", "test", triton_backend.TritonBackend)
    assert "available: no (triton is not installed" in "\n".join(
        listing.describe(listing.survey({"triton": entry})[0])
    )


def test_select_reports_a_missing_triton(monkeypatch):
    monkeypatch.setattr(mode.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(mode.ModeUnavailable, match="not installed"):
        mode.select.__wrapped__()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_kernels_refuse_to_import_before_the_mode_is_chosen():
    done = _python("import backends.triton.kernels.functions")
    assert done.returncode != 0
    assert "call select() before importing the kernels" in done.stderr


@pytest.mark.skipif(RUN.device != "cpu", reason="the interpreter is only chosen without a GPU")
def test_interpreted_kernels_run_even_when_triton_was_imported_first():
    # Another backend can import Triton before normconf sets TRITON_INTERPRET (torch.export does,
    # for one); the kernels must still run interpreted.
    done = _python(
        "import torch, triton\n"
        "from backends.triton.kernels import mode\n"
        "assert mode.select().interpreted\n"
        "from backends.triton.kernels import functions as F\n"
        "x = torch.randn(5, 40, requires_grad=True)\n"
        "y = F.rms_norm(x, (40,), None, eps=1e-6)\n"
        "torch.autograd.grad(y, [x], torch.ones_like(y))\n"
        "print('ok')\n"
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_kernels_call_only_triton_builtins():
    # Triton's own @jit library functions (tl.sum, tl.zeros, tl.cdiv) cannot be called from an
    # interpreted kernel when Triton was imported before TRITON_INTERPRET was set (see above).
    import triton.language as tl

    folder = Path(mode.__file__).parent
    for name in ("common", "layer_norm", "rms_norm", "group_norm", "reduce"):
        tree = ast.parse((folder / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                chain, target = [], node.func
                while isinstance(target, ast.Attribute):
                    chain.append(target.attr)
                    target = target.value
                if isinstance(target, ast.Name) and target.id == "tl":
                    obj = tl
                    for attr in reversed(chain):
                        obj = getattr(obj, attr)
                    assert tl.core.is_builtin(obj), f"{name}.py calls tl.{'.'.join(reversed(chain))}"


def test_triton_graph_is_unavailable_without_cuda_with_the_reason():
    # Its calls replay a CUDA graph: here, where the kernels run interpreted, there is none to capture.
    with pytest.raises(BackendUnavailable, match="replays CUDA graphs: needs a CUDA device"):
        triton_backend.TritonGraphBackend().capabilities()
