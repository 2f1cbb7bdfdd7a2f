"""Verify the suspected cause of every torch-eager / torch-nn / torch-functional / torch-compile / hf-*
failure of the fused residual ops (add_layer_norm, add_rms_norm) in results files by recomputing the
oracle with that cause.

Usage (from the repository root): python scripts/ledger_checks/residual_torch.py RESULTS.jsonl...
       python scripts/ledger_checks/residual_torch.py --stale   (the add_rms_norm ledger ids)
Causes (each prints, per failing output, worst ratios: torch vs oracle, model vs oracle, torch vs model;
confirmed where torch fails against the oracle and passes against the model):
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
               removed) must pass against the oracle (seed_upcast); the forward is also compared with
               the emulation with activation-dtype statistics (seed_emulated:
               conformance.fingerprint.emulate, stats="activation").
  stale        --stale: the add_rms_norm ids of the shipped ledger's torch entries, rerun: the ratio of
               dx now that dx includes dresidual_out (an entry whose ids all pass is stale).
Rounding-bias failures ('rounds with a bias') print torch's and the model's bias in ulps (measured).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import common
import numpy as np
import torch

from backends.common.torch_support import to_numpy
from backends.torch.eager import LayerNorm
from conformance.fingerprint.emulate import Convention, emulate
from conformance.judging import rounding
from conformance.model import residual
from conformance.model.case import ADD_LAYER_NORM, ADD_OPS, Case
from conformance.model.dtypes import round_to
from conformance.model.profiles import cases as profile_cases
from conformance.results.result import Result
from conformance.running.settings import load_ledger


def _rows(case: Case, values: np.ndarray) -> np.ndarray:
    """(rows, normalized elements) view of an activation-shaped array."""
    return np.asarray(values, dtype=np.float64).reshape(-1, int(np.prod(case.param_shape)))


def _sequential(terms: np.ndarray, dtype: str) -> np.ndarray:
    """Sum over the rows (axis 0) one row at a time, each partial sum rounded to ``dtype``."""
    acc = np.zeros(terms.shape[1])
    for row in terms:
        acc = round_to(acc + row, dtype).astype(np.float64)
    return acc


def saved_stats(case: Case, inputs: common.Arrays, *, inductor: bool = False) -> dict[str, np.ndarray]:
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


def seed_upcast(case: Case, inputs: common.Arrays, grad: bool) -> dict[str, np.ndarray]:
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


def _biased(record: Result) -> list[str]:
    return [c.output for c in record.comparisons if f"output '{c.output}' rounds" in record.reason]


def _unexplained(
    actual: common.Arrays, expected: common.Arrays, model: common.Arrays, names: list[str]
) -> common.Ratios:
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


def models(record: Result, case: Case, inputs: common.Arrays, grad: bool) -> dict[str, common.Arrays]:
    """The models of the record's backend: saved_stats (torch's kernels, inductor's decomposition), or
    for torch-eager's seed module the cause removed (seed_upcast) and, forward, emulated (seed_emulated)."""
    if case.op != ADD_LAYER_NORM:
        return {}
    reference = common.expected(case, inputs)
    if record.backend != "torch-eager":
        return {
            "saved_stats": {
                **reference,
                **saved_stats(case, inputs, inductor=record.backend == "torch-compile"),
            }
        }
    found: dict[str, common.Arrays] = {"seed_upcast": {**reference, **seed_upcast(case, inputs, grad)}}
    if not grad:
        emulated = emulate(case, inputs, Convention(stats="activation"))
        found["seed_emulated"] = {**reference, "y": emulated["y"]}
    return found


def modelled(
    record: Result, label: str, model: common.Arrays, actual: common.Arrays, names: list[str]
) -> common.Finding:
    """torch against the oracle and against one model (seed_upcast: the model itself against the oracle)."""
    case = common.case_of(record)
    inputs = common.inputs_of(case)
    reference = common.expected(case, inputs)
    now = common.ratios(case, inputs, reference, actual, names)
    alone = common.ratios(case, inputs, reference, model, names)
    if label == "seed_upcast":
        return common.Finding(
            record, label, common.explains(now, alone), f"torch/oracle {now} model/oracle {alone}"
        )
    against = common.ratios(case, inputs, model, actual, names)
    detail = f"torch/oracle {now} model/oracle {alone} torch/model {against}"
    detail += f" unexplained {_unexplained(actual, reference, model, names)}"
    if "dbias" in actual and "dbias" in model:
        same = np.array_equal(actual["dbias"].astype(np.float64), model["dbias"])
        detail += f"; dbias == torch bit for bit: {same}"
    return common.Finding(record, label, common.explains(now, against), detail)


def biases(
    record: Result, label: str, model: common.Arrays, actual: common.Arrays
) -> Iterator[common.Finding]:
    case = common.case_of(record)
    reference = common.expected(case, common.inputs_of(case))
    for out in _biased(record):
        if out in model:
            detail = (
                f"{out} torch {_bias(actual[out], reference[out], case)} {label} model"
                f" {_bias(round_to(model[out], case.dtype), reference[out], case)} correctly rounded"
                f" {_bias(round_to(reference[out], case.dtype), reference[out], case)}"
            )
            yield common.Finding(record, "rounding", None, detail)


def verify(record: Result) -> Iterator[common.Finding]:
    case = common.case_of(record)
    grad = common.grad_of(record)
    inputs = common.inputs_of(case)
    actual = common.run(common.backend(record.backend), case, inputs, grad=grad)
    names = list(common.failing(record)) or _biased(record)
    reference = common.expected(case, inputs)
    now = common.ratios(case, inputs, reference, actual, names)
    exact = common.ratios(case, inputs, common.expected(case, inputs, norm_input="exact"), actual, names)
    yield common.Finding(
        record, "exact_sum", common.explains(now, exact), f"torch/oracle {now} torch/oracle(exact) {exact}"
    )
    for label, model in models(record, case, inputs, grad).items():
        yield modelled(record, label, model, actual, names)
        yield from biases(record, label, model, actual)


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
                inputs = common.inputs_of(case)
                checks = entry.match["check"]
                actual = common.run(common.backend(name), case, inputs, grad=checks != ("forward",))
                got = common.ratios(
                    case, inputs, common.expected(case, inputs), actual, entry.match["output"]
                )
                print(f"ledger[{entry.index}] {name} {'/'.join(checks)} {case_id}: {got} band {entry.band}")


def findings(paths: list[str]) -> Iterator[common.Finding]:
    torch_made = lambda name: name.startswith(("torch-", "hf-"))  # noqa: E731
    for record in common.records(paths, backends=torch_made, ops=ADD_OPS):
        yield from verify(record)


def main() -> None:
    torch.set_num_threads(1)  # the partial-sum order of the one-thread kernels (see saved_stats)
    if sys.argv[1:] == ["--stale"]:
        stale()
        return
    common.report(findings(sys.argv[1:]))


if __name__ == "__main__":
    main()
