"""The enumeration: every kernel specialization the backends launch for the cases of some profiles, per
target, compiled (in parallel processes) and judged; the figures as JSON and as Markdown tables.

Case sources: the suite's ``ci`` and ``full`` profiles and the benchmark ``sweep`` (conformance.model.sweep).
One specialization is compiled once per target however many cases launch it; its record keeps how
many did and one of them, so a figure leads back to a case.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Any

from backends.triton.kernels import blocks, mode
from backends.triton.kernels.aot import targets
from conformance.model import profiles, sweep
from conformance.model.case import Case

SOURCES = ("ci", "full", "sweep")


def cases(sources: Sequence[str]) -> list[Case]:
    """The cases of the named profiles (``sweep``: the benchmark sweep), each id once."""
    unique: dict[str, Case] = {}
    for source in sources:
        if source == "sweep":
            chosen = sweep.cases("sweep")
        elif source in profiles.PROFILES:
            chosen = profiles.cases(source)
        else:
            allowed = ", ".join((*profiles.PROFILES, "sweep"))
            raise ValueError(f"source={source!r} is not allowed; allowed: {allowed}")
        for case in chosen:
            unique.setdefault(case.id, case)
    return list(unique.values())


@dataclass(frozen=True)
class Found:
    """One specialization on one target, and the cases whose launches need it."""

    key: str
    kernel: str
    launch: Any  # launches.Launch (kept untyped here: that module imports Triton)
    cases: tuple[str, ...]


def specializations(target: targets.Target, sources: Sequence[str]) -> list[Found]:
    """The distinct specializations the backends launch on ``target`` for the sources' cases, in order
    of first appearance."""
    from backends.triton.kernels.aot import build, launches

    bound = blocks.NVIDIA_MAX_REGISTERS if target.vendor == "nvidia" else None
    policy = blocks.native_policy(target.multiprocessors, bound)
    seen: dict[str, tuple[Any, list[str]]] = {}
    for case in cases(sources):
        for backend in launches.BACKENDS:
            for launch in launches.launches(case, backend, policy):
                key = build.specialize(launch, target)[0].key
                entry = seen.setdefault(key, (launch, []))
                if not entry[1] or entry[1][-1] != case.id:
                    entry[1].append(case.id)
    return [Found(key, launch.name, launch, tuple(ids)) for key, (launch, ids) in seen.items()]


# What sample() picks first in each kernel, one specialization per ranking: the widest tile, a chunked
# one, a float64 one, the one with the most flags.
_RANKINGS: tuple[Callable[[Found], Any], ...] = (
    lambda f: -_elements(f),
    lambda f: (f.launch.kwargs.get("ONE_CHUNK", True), -_elements(f)),
    lambda f: not any("float64" in str(a.dtype) for a in _tensors(f)),
    lambda f: -sum(v is True for v in f.launch.kwargs.values()),
)
MAX_SAMPLE = len(_RANKINGS)


def sample(found: Sequence[Found], per_kernel: int) -> list[Found]:
    """A few specializations per kernel, the ones most likely to go wrong first (_RANKINGS);
    deterministic."""
    by_kernel: dict[str, list[Found]] = {}
    for f in found:
        by_kernel.setdefault(f.kernel, []).append(f)
    chosen: list[Found] = []
    for group in by_kernel.values():
        picked: list[Found] = []
        for rank in _RANKINGS[:per_kernel]:
            rest = [f for f in group if f not in picked]
            if rest:  # a kernel with fewer specializations than picks gives them all
                picked.append(min(rest, key=lambda f: (rank(f), f.key)))
        chosen += picked
    return chosen


def variants(found: Sequence[Found]) -> list[Found]:
    """One specialization per kernel and combination of its flags (its boolean constexprs), the one
    with the smallest tile: every branch of every kernel compiled, at little cost."""
    chosen: dict[tuple[str, tuple[tuple[str, bool], ...]], Found] = {}
    for f in sorted(found, key=lambda f: (_elements(f), f.key)):
        flags = tuple(sorted((k, v) for k, v in f.launch.kwargs.items() if isinstance(v, bool)))
        chosen.setdefault((f.kernel, flags), f)
    return list(chosen.values())


def _elements(f: Found) -> int:
    return int(f.launch.kwargs.get("BLOCK_M", 1)) * int(f.launch.kwargs.get("BLOCK_N", 1))


def _tensors(f: Found) -> list[Any]:
    return [a for a in f.launch.args if hasattr(a, "dtype")]


# ------------------------------------------------------------------------------- parallel compiles


@cache
def _found(target: str, sources: tuple[str, ...]) -> dict[str, Found]:
    """specializations() by key, once per process: compile_all fills it before its pool forks, so the
    workers inherit it instead of enumerating again (where processes are spawned, each enumerates)."""
    return {f.key: f for f in specializations(targets.TARGETS[target], sources)}


def _init_worker() -> None:
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")  # as in __main__
    mode.compile_only()


def _compile(job: tuple[str, tuple[str, ...], str]) -> dict[str, Any]:
    from backends.triton.kernels.aot import build

    target, sources, key = job
    found = _found(target, sources)[key]
    return record(build.compile_launch(found.launch, targets.TARGETS[target]), found)


def record(compiled: Any, found: Found) -> dict[str, Any]:
    """The JSON record of one compiled specialization."""
    from backends.triton.kernels.aot import build

    tiles = build.tile_accesses(compiled.accesses) if compiled.accesses is not None else []
    occ = compiled.occupancy
    return {
        "target": compiled.target,
        "kernel": compiled.spec.kernel,
        "specialization": compiled.spec.key,
        "short": compiled.spec.short,
        "warps": compiled.spec.warps,
        "cases": len(found.cases),
        "example_case": found.cases[0],
        "resources": None if compiled.used is None else compiled.used.as_dict(),
        "occupancy": None
        if occ is None
        else {"blocks": occ.blocks, "fraction": occ.fraction, "limiter": occ.limiter},
        "vector_bits": compiled.vector_bits,
        "vectorized": compiled.vectorized,
        "tile_access_bits": sorted({a.bits for a in tiles}),
        "accesses": None if compiled.accesses is None else compiled.accesses.as_dict(),
        "problems": list(compiled.problems),
    }


def compile_all(
    chosen: Sequence[targets.Target],
    sources: Sequence[str],
    jobs: int,
    per_kernel: int | None = None,
    flag_variants: bool = False,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """(target name -> the records of its compiled specializations, target name -> how many it has):
    all of them compiled, or the union of ``per_kernel`` of each kernel (sample) and each kernel's
    flag variants (variants)."""
    work: list[tuple[str, tuple[str, ...], str]] = []
    counts: dict[str, int] = {}
    for target in chosen:
        found = list(_found(target.name, tuple(sources)).values())
        counts[target.name] = len(found)
        picked = found
        if per_kernel is not None or flag_variants:
            subset = (sample(found, per_kernel) if per_kernel else []) + (
                variants(found) if flag_variants else []
            )
            picked = list({f.key: f for f in subset}.values())
        work += [(target.name, tuple(sources), f.key) for f in picked]
    if jobs <= 1:
        done = [_compile(job) for job in work]
    else:
        with ProcessPoolExecutor(jobs, initializer=_init_worker) as pool:
            done = list(pool.map(_compile, work, chunksize=8))
    out: dict[str, list[dict[str, Any]]] = {t.name: [] for t in chosen}
    for rec in done:
        out[rec["target"]].append(rec)
    return out, counts


def default_jobs() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 8))


# ------------------------------------------------------------------------------------- the tables


def _worst(records: Iterable[dict[str, Any]], value: Any, highest: bool = True) -> dict[str, Any] | None:
    ok = [r for r in records if r["resources"] is not None]
    if not ok:
        return None
    return (max if highest else min)(ok, key=lambda r: (value(r), r["specialization"]))


def summary_rows(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (kernel, target): counts and the worst figures with the specialization behind each."""
    rows = []
    for target, records in results.items():
        kernels: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            kernels.setdefault(r["kernel"], []).append(r)
        for kernel, group in sorted(kernels.items()):
            regs = _worst(group, lambda r: r["resources"]["registers"])
            shared = _worst(group, lambda r: r["resources"]["shared"])
            occ = _worst(group, lambda r: r["occupancy"]["fraction"], highest=False)
            expected = [r for r in group if r["vectorized"] is not None]
            vectorized = [r for r in expected if r["vectorized"]]
            rows.append(
                {
                    "kernel": kernel,
                    "target": target,
                    "specializations": len(group),
                    "registers": regs and (regs["resources"]["registers"], regs["short"]),
                    "spills": max((r["resources"]["spills"] for r in group if r["resources"]), default=0),
                    "shared": shared and (shared["resources"]["shared"], shared["short"]),
                    "scratch": max((r["resources"]["scratch"] for r in group if r["resources"]), default=0),
                    "occupancy": occ
                    and (occ["occupancy"]["fraction"], occ["occupancy"]["limiter"], occ["short"]),
                    "vectorized": (len(vectorized), len(expected)),
                    "problems": sum(bool(r["problems"]) for r in group),
                }
            )
    return rows


def markdown(results: dict[str, list[dict[str, Any]]], counts: dict[str, int], sources: Sequence[str]) -> str:
    """The figures tables (docs/triton.md): one line per kernel and target."""
    lines = [
        f"Triton {metadata.version('triton')}. Cases: {', '.join(sources)}."
        " Specializations compiled per target: "
        + ", ".join(
            f"{t} {len(r)}" + ("" if len(r) == counts[t] else f" of {counts[t]}") for t, r in results.items()
        )
        + ". Registers: per thread (AMD: unified vector registers per lane); occupancy: the lowest"
        " over the kernel's specializations, with what limits it; row tiles at 128 bits: the"
        " specializations expected to vectorize (row length a multiple of 16, at least 128 bits per"
        " thread) whose every row tile access is 128 bits wide.",
        "",
        "| kernel | target | specializations | most registers (at) | spills | most shared B (at) | scratch B"
        " | lowest occupancy (limiter, at) | row tiles at 128 bits | failing |",
        "|---|---|---:|---|---:|---|---:|---|---:|---:|",
    ]
    for row in sorted(summary_rows(results), key=lambda r: (r["kernel"], _target_order(r["target"]))):
        regs = row["registers"] or (math.nan, "-")
        shared = row["shared"] or (math.nan, "-")
        occ = row["occupancy"] or (math.nan, "-", "-")
        done, expected = row["vectorized"]
        lines.append(
            f"| `{row['kernel']}` | {row['target']} | {row['specializations']} | {regs[0]} ({regs[1]}) "
            f"| {row['spills']} | {shared[0]} ({shared[1]}) | {row['scratch']} "
            f"| {100 * occ[0]:.1f}% ({occ[1]}, {occ[2]}) | {done}/{expected} | {row['problems']} |"
        )
    return "\n".join(lines) + "\n"


def _target_order(name: str) -> int:
    return list(targets.TARGETS).index(name)
