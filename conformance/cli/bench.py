"""``normconf bench`` and ``normconf run --bench``: the benchmarks (conformance/bench) in a pytest
subprocess, their options checked before anything runs, and a table of what they measured."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.adapter import registry
from conformance.cli import launch, options
from conformance.model import sweep
from conformance.results import benchjson
from conformance.running import summary

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

DEFAULT_PROFILE = "quick"

BENCH_HELP = f"""Time the backends on the benchmark cases (pytest conformance/bench --benchmark-only) and
print, per backend, case and check: the median time, GB/s and the fraction of the same-run copy's GB/s.
Writes OUTPUT/bench.json (pytest-benchmark JSON, for normconf report --bench) and OUTPUT/bench.log.

bench profiles: {", ".join(sweep.BENCH_PROFILES)} (default {DEFAULT_PROFILE}); docs/benchmarks.md says
what each holds. --cases FILE replaces the profile.

examples:
  normconf bench                                       # quick profile, every available backend
  normconf bench --backend torch-nn,triton --op rms_norm --baseline torch-nn
  normconf bench --bench-profile sweep -o out && normconf report out/bench.json ..."""


def add_bench_options(p: argparse.ArgumentParser, default_profile: str | None) -> None:
    """--bench-profile and --baseline, as ``normconf run --bench`` and ``normconf bench`` take them."""
    p.add_argument(
        "--bench-profile",
        default=default_profile,
        metavar="P",
        help=f"benchmark cases: {', '.join(sweep.BENCH_PROFILES)}"
        + (f" (default {default_profile})" if default_profile else " (default: the benchmarks' own)"),
    )
    p.add_argument("--baseline", metavar="BACKEND", help="backend the benchmark speedups are relative to")


def build_bench(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(sub, name, "time the backends: median, GB/s, fraction of copy", BENCH_HELP)
    p.add_argument(
        "--backend", default="all", help="comma list of backend names and keywords (all, frameworks, kernels)"
    )
    p.add_argument("--op", help="comma list of ops")
    p.add_argument("--dtype", help="comma list of activation dtypes")
    p.add_argument("--cases", metavar="FILE", help="JSON or TOML file of cases instead of a profile")
    add_bench_options(p, DEFAULT_PROFILE)
    p.add_argument(
        "-o",
        "--output",
        default=".normconf/bench",
        metavar="DIR",
        help="output folder (default .normconf/bench)",
    )
    p.add_argument(
        "-p",
        dest="plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="pytest plugin module to load, e.g. one that registers a backend with conformance.register()",
    )
    return p


def bench(args: argparse.Namespace) -> int:
    check_options(args, "normconf bench")
    out = Path(args.output)
    files, status = run_benchmarks(args, out, "normconf bench")
    if status == 4:  # pytest refused its arguments: its own words are in the log
        return launch.failed_start(status, out / "bench.log")
    for f in options.load_benches(files):
        for line in table(f):
            print(line)
    if files:
        print(f"benchmarks: {files[0]}")
    return 0 if status == 0 else 1


def check_options(args: argparse.Namespace, who: str = "normconf run --bench") -> None:
    """Refuse what would stop the benchmarks (no pytest-benchmark, an unknown backend, a bench
    profile, op or dtype without cases, a baseline that is not timed) before anything runs."""
    if not launch.BENCH.is_dir():
        raise options.UsageError(
            f"{who}: no benchmarks in this installation ({launch.BENCH} does not exist yet)"
            + ("; run without --bench" if who.endswith("--bench") else "")
        )
    if importlib.util.find_spec("pytest_benchmark") is None:
        raise options.UsageError(f"{who} needs pytest-benchmark: pip install 'normconf[bench]'")
    profile = args.bench_profile or sweep.DEFAULT_PROFILE
    if profile not in sweep.BENCH_PROFILES:
        raise options.UsageError(
            f"--bench-profile={profile!r} is not allowed; allowed: {', '.join(sweep.BENCH_PROFILES)}"
        )
    if not args.cases and not _selected_cases(profile, args.op, args.dtype):
        raise options.UsageError(
            f"no benchmark case selected: --bench-profile={profile} has no case with --op={args.op} "
            f"--dtype={args.dtype}"
        )
    options.import_plugins(args.plugin)
    try:
        selected = registry.resolve(args.backend, registry.entries())
    except registry.RegistryError as exc:
        raise options.UsageError(str(exc)) from exc
    if args.baseline is not None and args.baseline not in selected:
        raise options.UsageError(
            f"--baseline={args.baseline!r} is not allowed; allowed: a backend this run times "
            f"(--backend {args.backend}): {', '.join(selected)}"
        )


def _selected_cases(profile: str, op: str | None, dtype: str | None) -> list[str]:
    ops = op.split(",") if op else None
    dtypes = dtype.split(",") if dtype else None
    return [
        c.id
        for c in sweep.cases(profile)
        if (ops is None or c.op in ops) and (dtypes is None or c.dtype in dtypes)
    ]


def run_benchmarks(args: argparse.Namespace, out: Path, who: str) -> tuple[list[str], int]:
    """Run conformance/bench with the run's backends and case selection; (JSON files, pytest status)."""
    target = out / "bench.json"
    target.unlink(missing_ok=True)
    command = [str(launch.BENCH), "--benchmark-only", f"--benchmark-json={target}"]
    # The suite's plugin checks --op and --dtype against its profile in every session; the full
    # profile holds every op and dtype, so only the bench profile (checked above) selects.
    command += ["--backend", args.backend, "--profile", "full", "-q"]
    for option in ("op", "dtype", "cases", "bench_profile"):
        if getattr(args, option, None):
            command += [f"--{option.replace('_', '-')}", getattr(args, option)]
    command += [arg for module in args.plugin for arg in ("-p", module)]
    display = launch.Display(sys.stdout, launch.use_bar(sys.stdout))
    print(f"{who}: benchmarks; pytest log {out / 'bench.log'}")
    status = launch.run_pytest(command, out / "bench.log", display.event)
    display.finish()
    if status != 0:
        print(f"{who}: the benchmarks exited with status {status}; see {out / 'bench.log'}", file=sys.stderr)
    return ([str(target)] if target.exists() else []), status


def table(f: benchjson.BenchFile) -> list[str]:
    """One aligned line per timed backend x case x check, then the copy the fractions refer to."""
    head = ["backend", "case", "check", "median", "GB/s", "of copy"]
    rows = [
        [
            b.backend,
            b.case_id,
            b.check,
            _seconds(b.median_s),
            f"{b.gbps:.3g}" if b.gbps is not None else "-",
            f"{b.roofline_fraction:.0%}" if b.roofline_fraction is not None else "-",
        ]
        for b in sorted(f.benchmarks, key=lambda b: (b.backend, b.case_id, b.check))
    ]
    lines = summary.aligned(head, rows)
    lines += [f"copy: {a.name} {_seconds(a.median_s)}, {a.gbps:.3g} GB/s" for a in f.auxiliary if a.gbps]
    return lines


def _seconds(value: float) -> str:
    return f"{value * 1e6:.3g} us" if value < 1e-3 else f"{value * 1e3:.3g} ms"
