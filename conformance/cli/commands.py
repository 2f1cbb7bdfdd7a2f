"""The ``normconf`` commands: each a parser builder and a function returning the exit status."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.adapter import listing
from conformance.cli import bench as benchmarks
from conformance.cli import judge, launch, options, upkeep
from conformance.failures import replay
from conformance.results import diff, render
from conformance.results.records import Record
from conformance.running import flags, shard, summary
from conformance.running.settings import selection_line

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


RUN_HELP = """Run the conformance suite (pytest conformance) over the available backends and write
OUTPUT/results.jsonl, OUTPUT/report.html, OUTPUT/summary.md and pytest's log OUTPUT/pytest.log.

examples:
  normconf run                                  # smoke profile, every available backend
  normconf run --profile ci                     # the larger grid (make conformance runs it)
  normconf run --backend torch-nn --op rms_norm --dtype bfloat16 -o out
  normconf run --shard 1/2 -o out/shard1        # on machine A (and --shard 2/2 on machine B)
  normconf report out/shard1/results.jsonl out/shard2/results.jsonl -o report.html"""


def build_run(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(sub, name, "run the suite and write results and the report", RUN_HELP)
    # The suite's own flags, with pytest conformance's defaults (the smoke profile among them).
    flags.add(p.add_argument, flags.RUN)
    p.add_argument(
        "-o", "--output", default=".normconf", metavar="DIR", help="output folder (default .normconf)"
    )
    p.add_argument(
        "-n", "--workers", default="auto", help="pytest-xdist workers: a number, auto (default) or 0"
    )
    p.add_argument(
        "-p",
        dest="plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="pytest plugin module to load, e.g. one that registers a backend with conformance.register()",
    )
    p.add_argument("--bench", action="store_true", help="also run the benchmarks (conformance/bench)")
    benchmarks.add_bench_options(p, None)
    return p


def run(args: argparse.Namespace) -> int:
    # Backend names are checked by the pytest plugin, which also sees conftest and -p registrations.
    chosen = options.selection(args)
    options.parse_shard(args.shard)
    _check_workers(args.workers)
    if args.bench:
        benchmarks.check_options(args)
    elif args.baseline or args.bench_profile:
        flag = "--baseline" if args.baseline else "--bench-profile"
        raise options.UsageError(f"{flag} without --bench is not allowed; allowed: with --bench")
    out = Path(args.output)
    results = out / "results.jsonl"
    results.unlink(missing_ok=True)
    display = launch.Display(sys.stdout, launch.use_bar(sys.stdout))
    log = out / "pytest.log"
    print(f"{selection_line(chosen, args.backend)}; pytest log {log}")
    status = launch.run_pytest(_pytest_args(args, results), log, display.event)
    display.finish()
    if status == 4 or not results.exists():
        return launch.failed_start(status, log)
    if status not in (0, 1):
        # pytest stopped early (interrupted, internal error): the results hold the tests that ran.
        print(
            f"normconf run: pytest exited with status {status}; the results are partial, see {log}",
            file=sys.stderr,
        )
    bench, bench_status = benchmarks.run_benchmarks(args, out, "normconf run") if args.bench else ([], 0)
    _summarize(results, bench, out, args.baseline, args.shard)
    return 0 if status == 0 and bench_status == 0 else 1


def _check_workers(workers: str) -> None:
    if workers != "0" and importlib.util.find_spec("xdist") is None:
        raise options.UsageError(f"-n {workers}: pytest-xdist is not installed; install it or pass -n 0")
    if workers not in ("auto", "logical") and not workers.isdigit():
        raise options.UsageError(f"-n={workers!r} is not allowed; allowed: a number, auto or 0")


def _pytest_args(args: argparse.Namespace, results: Path) -> list[str]:
    command = [str(launch.SUITE), "--results", str(results), "-q"]
    # A cases file replaces the profile: the profile is not passed beside it.
    passed = [flag for flag in flags.RUN if not (flag is flags.PROFILE and args.cases)]
    command += flags.forward(args, passed)
    command += [arg for module in args.plugin for arg in ("-p", module)]
    return command + (["-n", args.workers] if args.workers != "0" else [])


def _summarize(
    results: Path, bench: list[str], out: Path, baseline: str | None, part: str | None = None
) -> None:
    runs = tuple(options.load_runs([str(results)]))
    records: list[Record] = [*runs[0].records, *runs[0].fingerprints]
    for block in (
        summary.table(records),
        summary.worst_failures(records),
        summary.fingerprint_differences(records),
    ):
        if block:
            print("\n".join(block))
    if part is None:  # one shard holds part of the cases: only the union can tell an idle backend
        for line in summary.idle_lines(runs[0].records):
            print(line)
    data = render.ReportInput(runs=runs, benches=tuple(options.load_benches(bench)), baseline=baseline)
    for fmt, name in (("html", "report.html"), ("md", "summary.md")):
        options.write_text(str(out / name), options.renderer(fmt)(data))
    print(f"results: {results}\nreport:  {out / 'report.html'}\nsummary: {out / 'summary.md'}")


REPORT_HELP = """Render results files into one report. Several files may be the shards of one run
(merged) or separate runs (machines, devices, versions), which the report compares.

examples:
  normconf report .normconf/results.jsonl -o report.html
  normconf report shard1.jsonl shard2.jsonl -o report.html
  normconf report cpu.jsonl gpu.jsonl --bench cpu-bench.json gpu-bench.json -o report.html
  normconf report results.jsonl --format md >> "$GITHUB_STEP_SUMMARY\""""


def build_report(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(sub, name, "render results (+ benchmark JSON) into HTML or Markdown", REPORT_HELP)
    p.add_argument("results", nargs="+", metavar="RESULTS", help="results files (JSON Lines)")
    p.add_argument("--bench", nargs="+", default=[], metavar="BENCH_JSON", help="pytest-benchmark JSON files")
    p.add_argument("-o", "--output", help="output file, - for stdout (default report.html; md: stdout)")
    p.add_argument("--format", default="html", help="html (default) or md")
    p.add_argument("--baseline", metavar="BACKEND", help="backend the benchmark speedups are relative to")
    p.add_argument("--title", default="normconf report", help="report title")
    _threshold_options(p)
    return p


def report(args: argparse.Namespace) -> int:
    render_fn = options.renderer(args.format)
    loaded = options.load_runs(args.results)
    benches = options.load_benches(args.bench)
    _check_baseline(args.baseline, benches)
    data = render.ReportInput(
        tuple(loaded), tuple(benches), args.baseline, args.title, options.thresholds(args)
    )
    target = args.output or ("report.html" if args.format == "html" else "-")
    options.write_text(target, render_fn(data))
    if target != "-":
        print(f"report: {target}", file=sys.stderr)
    return 0


CONVENTIONS_HELP = """The conventions table alone: fingerprint question x backend, from the fingerprint
records of one or more runs (answers that differ from normconf's reference marked; in HTML each
answer opens its evidence). The table of a porting guide: which eps, momentum, variance and
precision each backend uses.

examples:
  normconf conventions .normconf/results.jsonl
  normconf conventions .normconf/results.jsonl --format html -o conventions.html"""


def build_conventions(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(
        sub, name, "the fingerprint conventions table of runs, Markdown or HTML", CONVENTIONS_HELP
    )
    p.add_argument("results", nargs="+", metavar="RESULTS", help="results files (JSON Lines)")
    p.add_argument("-o", "--output", default="-", help="output file, - for stdout (the default)")
    p.add_argument("--format", default="md", help="md (default) or html")
    p.add_argument("--title", default="normconf conventions", help="title")
    return p


def conventions(args: argparse.Namespace) -> int:
    render_fn = options.renderer(args.format, render.CONVENTIONS_GROUP)
    data = render.ReportInput(tuple(options.load_runs(args.results)), title=args.title)
    options.write_text(args.output, render_fn(data))
    if args.output != "-":
        print(f"conventions: {args.output}", file=sys.stderr)
    return 0


def _check_baseline(baseline: str | None, benches: list[Any]) -> None:
    if baseline is None:
        return
    known = sorted({b.backend for f in benches for b in f.benchmarks})
    if baseline not in known:
        raise options.UsageError(
            f"--baseline={baseline!r} is not allowed; allowed: a backend of the benchmark files: "
            f"{', '.join(known) or '(no --bench files given)'}"
        )


def _threshold_options(p: argparse.ArgumentParser) -> None:
    t = diff.Thresholds()
    p.add_argument(
        "--growth",
        type=float,
        default=t.growth,
        help=f"worst_ratio growth factor that counts (default {t.growth:g})",
    )
    p.add_argument(
        "--min-ratio",
        type=float,
        default=t.min_ratio,
        help=f"ignore growth ending below this worst_ratio (default {t.min_ratio:g})",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=t.speed,
        help=f"least relative change in median time that counts, or the runs' noise (default {t.speed:g})",
    )


COMPARE_HELP = """Compare two runs: new failures, fixed cases, worst_ratio growth beyond --growth, and,
with --bench, benchmarks slower or faster beyond the measured noise. Exit 1 on a regression
(a new failure, error growth or a slowdown), so CI can gate on it.

example:
  normconf compare main/results.jsonl branch/results.jsonl --bench main/bench.json branch/bench.json"""


def build_compare(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(sub, name, "what changed between two runs (exit 1 on a regression)", COMPARE_HELP)
    p.add_argument("base", metavar="BASE", help="results file of the base run")
    p.add_argument("new", metavar="NEW", help="results file of the new run")
    p.add_argument(
        "--bench", nargs=2, default=[], metavar=("BASE_JSON", "NEW_JSON"), help="benchmark JSON of each run"
    )
    p.add_argument("--limit", type=int, default=50, help="lines shown per list (default 50)")
    _threshold_options(p)
    return p


def compare(args: argparse.Namespace) -> int:
    t = options.thresholds(args)
    base, new = (options.load_runs([path])[0] for path in (args.base, args.new))
    benches = options.load_benches(args.bench)
    d = diff.diff(
        base.records,
        new.records,
        t,
        benches[0].by_key() if benches else None,
        benches[1].by_key() if benches else None,
    )
    if not d.common:
        raise options.UsageError(
            f"{args.base} and {args.new} share no backend x case x check; nothing to compare"
        )
    print(f"base: {diff.platform(base.header)}")
    print(f"new:  {diff.platform(new.header)}")
    print(
        f"normconf compare: {d.common} results in common, {d.only_base} only in {args.base}, "
        f"{d.only_new} only in {args.new}; {d.still_failing} still failing"
        + (f"; {d.benchmarks_compared} benchmarks compared" if args.bench else "")
    )
    for line in diff.text(d, t, args.limit):
        print(line)
    verdict = "REGRESSION" if d.regression else "no regression"
    counts = f"{len(d.new_failures)} new failures, {len(d.growth)} error growths, {len(d.slower)} slower"
    print(f"verdict: {verdict} ({counts})")
    return 1 if d.regression else 0


BACKENDS_HELP = """List every registered backend: one line each with whether it can run here (or why not),
how many ops and dtypes it supports and where it comes from.

examples:
  normconf backends                     # one line per backend
  normconf backends -v                  # every capability, feature, limit and note
  normconf backends --json              # the same as JSON
  normconf backends -p my_adapters      # with the backends that module registers"""


def build_backends(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(
        sub, name, "list backends: available or why not, ops and dtypes, origin", BACKENDS_HELP
    )
    p.add_argument("-v", "--verbose", action="store_true", help="every capability and note of each backend")
    p.add_argument("--json", action="store_true", help="print every backend's fields as JSON")
    p.add_argument(
        "-p",
        dest="plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (one that registers a backend with conformance.register())",
    )
    return p


def backends(args: argparse.Namespace) -> int:
    options.import_plugins(args.plugin)
    listed = options.survey_backends()
    if args.json:
        sys.stdout.write(options.dump_json([listing.as_json(item) for item in listed]))
    elif args.verbose:
        print("\n".join(line for item in listed for line in listing.describe(item)))
    else:
        print("\n".join(listing.short(listed)))
    return 0


def build_cases(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(
        sub, name, "list the case ids a run would use", "List the cases of a profile or cases file."
    )
    flags.add(p.add_argument, flags.SELECTION)
    p.add_argument("--json", action="store_true", help="print every case's fields as JSON")
    return p


def cases(args: argparse.Namespace) -> int:
    chosen = list(options.selection(args).cases)
    part = options.parse_shard(args.shard)
    if part is not None:
        chosen = shard.select(chosen, part, lambda c: c.id, lambda c: c.id)
    if args.json:
        sys.stdout.write(options.dump_json([c.to_dict() for c in chosen]))
    else:
        for case in chosen:
            print(case.id)
        source = f"--cases {shlex.quote(args.cases)}" if args.cases else f"--profile {args.profile}"
        print(f"{len(chosen)} cases ({source})", file=sys.stderr)
    return 0


REPLAY_HELP = """Replay a bundle that --save-failures wrote: its inputs through a backend (by default the one
that failed), judged against the oracle under the tolerance matrix, with the figures the run recorded.
Exit status: 0 the outputs now pass, 1 they still fail, 2 a usage problem, 3 the backend cannot run it.

examples:
  normconf run --backend my-backend --save-failures bundles
  normconf replay bundles/<backend>--<check>--<case id> --json
  normconf replay BUNDLE --backend torch-eager   # the same inputs through another backend"""


def build_replay(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(sub, name, "replay a saved failure bundle against a backend", REPLAY_HELP)
    replay.add_arguments(p)
    return p


Builder = Callable[["Sub", str], argparse.ArgumentParser]
COMMANDS: dict[str, tuple[Builder, Callable[[argparse.Namespace], int]]] = {
    "run": (build_run, run),
    "report": (build_report, report),
    "conventions": (build_conventions, conventions),
    "compare": (build_compare, compare),
    "judge": (judge.build_judge, judge.judge),
    "replay": (build_replay, replay.replay),
    "bench": (benchmarks.build_bench, benchmarks.bench),
    "backends": (build_backends, backends),
    "cases": (build_cases, cases),
    "profile": (upkeep.build_profile, upkeep.profile),
    "cache": (upkeep.build_cache, upkeep.cache),
}
