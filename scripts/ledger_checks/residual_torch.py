"""Verify the suspected cause of every torch-eager / torch-nn / torch-functional / torch-compile / hf-*
failure of the fused residual ops (add_layer_norm, add_rms_norm) in results files by recomputing the
oracle with that cause.

Usage (from /work/main): .venv/bin/python scripts/ledger_checks/residual_torch.py RESULTS.jsonl...
       .venv/bin/python scripts/ledger_checks/residual_torch.py --stale   (the add_rms_norm ledger ids)
Causes (each prints, per failing output, worst ratios: torch vs oracle, model vs oracle, torch vs model):
  exact_sum    the norm read the unrounded x + residual where the case asks for the stored sum (a fused
               graph keeping the sum in float32 registers): the oracle recomputed with
               norm_input="exact". Printed for every record; torch must pass against it to be explained.
  saved_stats  torch's CPU LayerNorm keeps the mean and rstd it saves in the activation dtype for half
               inputs (float32 beside float32 parameters), and reduces dweight / dbias over the rows
               with every partial sum rounded to the activation dtype: the float64 reference on the
               stored sum with those roundings. With one intra-op thread (set here) the model's dbias
               is torch's bit for bit. torch-compile: inductor's decomposition saves them in the
               activation dtype even beside float32 parameters and reduces in float32 (the model
               rounds the statistics only).
  seed         torch-eager's seed LayerNorm computes mean, variance and the normalization in the
               activation dtype: the same module run on the stored sum upcast to float32 (the cause
               removed) must pass against the oracle; the forward is also compared with the emulation
               with activation-dtype statistics (conformance.fingerprint.emulate, stats="activation").
  stale        --stale: the add_rms_norm ids of the shipped ledger's torch entries, rerun: the ratio of
               dx now that dx includes dresidual_out (an entry whose ids all pass is stale).
Rounding-bias failures ('rounds with a bias') print torch's and the model's bias in ulps.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backends.common.torch_support import to_numpy
from backends.torch.eager import LayerNorm, TorchEager
from backends.torch.modules import TorchFunctional, TorchNN
from backends.transformers import hf_norms
from conformance import oracle
from conformance.fingerprint.emulate import Convention, emulate
from conformance.judging import rounding, tolerances
from conformance.judging.verdict import compare_outputs
from conformance.model import residual
from conformance.model.case import Case
from conformance.model.dtypes import round_to
from conformance.model.inputs import for_call, make_inputs
from conformance.model.profiles import cases as profile_cases
from conformance.running.settings import load_ledger

TABLE = tolerances.read_tolerances()
BACKENDS: dict[str, Any] = {b.name: b for b in (TorchNN(), TorchFunctional(), TorchEager())}
GRAD_CHECKS = ("backward", "determinism", "inputs_unchanged", "aliasing")


def backend(name: str) -> Any:
    if name not in BACKENDS and name == "torch-compile":
        from backends.torch.compiled import TorchCompile

        BACKENDS[name] = TorchCompile()
    if name not in BACKENDS:
        BACKENDS[name] = hf_norms.HFNorm(hf_norms.BY_NAME[name])
    return BACKENDS[name]


def run(name: str, case: Case, inputs: dict[str, np.ndarray], grad: bool) -> dict[str, np.ndarray]:
    given = for_call(inputs, grad=grad)
    prepared = backend(name).prepare(case, given, grad=grad)
    prepared()
    return dict(prepared.outputs())


Arrays = Mapping[str, Any]


def ratios(
    case: Case, inputs: Arrays, expected: Arrays, actual: Arrays, names: list[str]
) -> dict[str, float]:
    return {
        c.output: round(c.worst_ratio, 3)
        for c in compare_outputs(case, inputs, expected, actual, tuple(names), TABLE)
    }


def _rows(case: Case, values: np.ndarray) -> np.ndarray:
    """(rows, normalized elements) view of an activation-shaped array."""
    return np.asarray(values, dtype=np.float64).reshape(-1, int(np.prod(case.param_shape)))


def _sequential(terms: np.ndarray, dtype: str) -> np.ndarray:
    """Sum over the rows (axis 0) one row at a time, each partial sum rounded to ``dtype``."""
    acc = np.zeros(terms.shape[1])
    for row in terms:
        acc = round_to(acc + row, dtype).astype(np.float64)
    return acc


def saved_stats(
    case: Case, inputs: dict[str, np.ndarray], *, inductor: bool = False
) -> dict[str, np.ndarray]:
    """The reference on the stored sum with torch's CPU LayerNorm roundings: saved mean and rstd in the
    activation dtype (float32 beside float32 parameters), dweight / dbias reduced over the rows with
    partial sums in the activation dtype. ``inductor``: the statistics in the activation dtype whatever
    the parameters, the reductions wide."""
    h = _rows(case, residual.normalized(case, inputs))
    mean = h.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(((h - mean) ** 2).mean(axis=1, keepdims=True) + case.eps)
    mixed = case.weight_dtype == "float32" and case.dtype != "float64"
    saved = "float32" if mixed and not inductor else case.dtype
    m_s, r_s = (round_to(v, saved).astype(np.float64) for v in (mean, rstd))
    xhat = (h - m_s) * r_s
    w = _rows(case, inputs["weight"]) if case.weight else 1.0
    b = _rows(case, inputs["bias"]) if case.bias else 0.0
    out = {"y": (xhat * w + b).reshape(case.shape)}
    if "dy" in inputs:
        dy = _rows(case, inputs["dy"])
        g = dy * w
        dh = r_s * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
        dh = dh.reshape(case.shape) + np.asarray(inputs["dresidual_out"], dtype=np.float64)
        out["dx"], out["dresidual"] = dh, dh.copy()
        half = case.dtype in ("float16", "bfloat16") and not inductor
        if case.weight:
            terms = dy * xhat
            out["dweight"] = (_sequential(terms, case.dtype) if half else terms.sum(axis=0)).reshape(-1)
        if case.bias:
            out["dbias"] = (_sequential(dy, case.dtype) if half else dy.sum(axis=0)).reshape(-1)
    return out


def seed_upcast(case: Case, inputs: dict[str, np.ndarray], grad: bool) -> dict[str, np.ndarray]:
    """torch-eager's seed LayerNorm on the stored sum upcast to float32: the activation-dtype
    computation removed, nothing else changed (y and dx rounded back to the activation dtype)."""
    act = getattr(torch, case.dtype)
    h = torch.tensor(residual.stored(case, inputs), dtype=torch.float32).requires_grad_(grad)
    param = getattr(torch, case.weight_dtype)
    weight = torch.tensor(inputs["weight"].astype(np.float64), dtype=param) if case.weight else None
    bias = torch.tensor(inputs["bias"].astype(np.float64), dtype=param) if case.bias else None
    module = LayerNorm(case.param_shape, eps=case.eps, weight=weight, bias=bias)
    y = module(h).to(act)
    out = {"y": y, "residual_out": h.to(getattr(torch, case.stream_dtype))}
    if grad:
        wrt = [h, *(p for p in (module.weight, module.bias) if p is not None)]
        dy = torch.tensor(inputs["dy"].astype(np.float64), dtype=act)
        grads = torch.autograd.grad(y, wrt, dy)
        dh = grads[0] + torch.tensor(inputs["dresidual_out"].astype(np.float64))
        out.update({"dx": dh.to(act), "dresidual": dh.to(getattr(torch, case.stream_dtype))})
        names = [n for n, p in (("dweight", module.weight), ("dbias", module.bias)) if p is not None]
        out.update(dict(zip(names, grads[1:], strict=True)))
    return {k: to_numpy(v) for k, v in out.items()}


def _failing(record: dict[str, Any]) -> list[str]:
    return [c["output"] for c in record.get("comparisons", []) if not float(c["worst_ratio"]) <= 1]


def _biased(record: dict[str, Any]) -> list[str]:
    return [
        c["output"]
        for c in record.get("comparisons", [])
        if f"output '{c['output']}' rounds" in record["reason"]
    ]


def verify(record: dict[str, Any]) -> None:
    case = Case.from_dict(record["case"])
    check, name = record["check"], record["backend"]
    grad = check in GRAD_CHECKS
    inputs = make_inputs(case, grad=grad)
    actual = run(name, case, inputs, grad)
    expected = oracle.evaluate(case, inputs, grad=grad)
    failing, biased = _failing(record), _biased(record)
    head = f"{name} {check} {case.id}"
    names = failing or biased
    exact = oracle.evaluate(dataclasses.replace(case, norm_input="exact"), inputs, grad=grad)
    print(f"{head}: torch/oracle {ratios(case, inputs, expected, actual, names)}")
    print(f"    exact_sum torch/oracle(exact) {ratios(case, inputs, exact, actual, names)}")
    models = {}
    if case.op == "add_layer_norm" and name != "torch-eager":
        model = saved_stats(case, inputs, inductor=name == "torch-compile")
        models["saved_stats"] = {**expected, **model}
    if case.op == "add_layer_norm" and name == "torch-eager":
        models["seed_upcast"] = {**expected, **seed_upcast(case, inputs, grad)}
        if not grad:
            emulated = emulate(case, inputs, Convention(stats="activation"))
            models["seed_emulated"] = {**expected, "y": emulated["y"]}
    for label, model in models.items():
        line = f"    {label} model/oracle {ratios(case, inputs, expected, model, names)}"
        if label != "seed_upcast":
            line += f" torch/model {ratios(case, inputs, model, actual, names)}"
            line += f" unexplained {_unexplained(actual, expected, model, names)}"
        print(line)
        if label == "saved_stats" and "dbias" in actual and "dbias" in model:
            same = np.array_equal(actual["dbias"].astype(np.float64), model["dbias"])
            print(f"    saved_stats dbias == torch bit for bit: {same}")
        for out in biased:
            if out in model:
                print(
                    f"    rounding {out}: torch {_bias(actual[out], expected[out], case)}"
                    f" {label} model {_bias(round_to(model[out], case.dtype), expected[out], case)}"
                    f" correctly rounded {_bias(round_to(expected[out], case.dtype), expected[out], case)}"
                )


def _unexplained(actual: Arrays, expected: Arrays, model: Arrays, names: list[str]) -> dict[str, float]:
    """max |torch - model| / max |torch - oracle| per output: far below 1 when the model accounts for
    torch's error, even where what is left (reduction order) exceeds a float32 parameter tolerance."""
    shares = {}
    for out in names:
        a = np.asarray(actual[out]).astype(np.float64)
        with np.errstate(invalid="ignore"):
            off = float(np.nanmax(np.abs(a - expected[out])))
        shares[out] = round(float(np.max(np.abs(a - model[out]))) / off, 3) if off else 0.0
    return shares


def _bias(actual: np.ndarray, expected: np.ndarray, case: Case) -> str:
    found = rounding.bias(actual, expected, case.dtype)
    return "-" if found is None else f"{found.bias:+.3f}/{found.drift:+.3f}"


def stale() -> None:
    """Rerun the add_rms_norm ids of the shipped ledger's torch entries (every profile)."""
    known = {c.id: c for profile in ("smoke", "ci", "full") for c in profile_cases(profile)}
    for entry in load_ledger().entries:
        names = entry.match["backend"]
        ids = [i for i in entry.match.get("case", ()) if i.startswith("add_rms_norm")]
        if not ids or not any(n.startswith(("torch-", "hf-")) for n in names):
            continue
        for name in names:
            for case_id in ids:
                case = known[case_id]
                inputs = make_inputs(case, grad=True)
                checks = entry.match["check"]
                actual = run(name, case, inputs, checks != ("forward",))
                expected = oracle.evaluate(case, inputs, grad=True)
                got = ratios(case, inputs, expected, actual, list(entry.match["output"]))
                print(f"ledger[{entry.index}] {name} {'/'.join(checks)} {case_id}: {got} band {entry.band}")


def main() -> None:
    torch.set_num_threads(1)  # the partial-sum order of the one-thread kernels (see saved_stats)
    if sys.argv[1:] == ["--stale"]:
        stale()
        return
    for path in sys.argv[1:]:
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            torch_made = str(record.get("backend", "")).startswith(("torch-", "hf-"))
            if record.get("kind") == "result" and record["outcome"] in ("failed", "xfailed") and torch_made:
                verify(record)


if __name__ == "__main__":
    main()
