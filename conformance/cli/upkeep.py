"""``normconf profile`` (where a run spent its time) and ``normconf cache`` (the graph cache folder)."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.adapter import cache as graph_cache
from conformance.cli import options
from conformance.results.records import read_raw
from conformance.results.schema import SchemaError
from conformance.running import timing

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

PROFILE_HELP = """Where a run spent its time, per backend and per phase: prepare, compile/export (what the
adapter reports as compiling or exporting inside prepare), call, oracle, judging, fingerprint probes,
properties; then the run's wall time x workers, and the seconds no record holds (pytest and xdist,
idle workers).

examples:
  normconf run --profile ci -o out && normconf profile out/results.jsonl
  normconf profile                              # .normconf/results.jsonl"""

CACHE_HELP = """The graph cache: compiled graphs and exports the backends keep between runs (inductor's
FX graph, AOTAutograd and kernel caches for torch-compile; the exported ONNX models of onnx-export and
its variants) and the durations that order the next run's work. Entries are keyed by the library
versions and everything the graph depends on; a stale one is never served, only left behind.

examples:
  normconf cache                                # what it holds, per folder
  normconf cache --clear                        # empty it (the next run compiles and exports again)
  normconf cache --graph-cache /ci/cache        # another folder (as given to normconf run)"""


def build_profile(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(sub, name, "where a run spent its time, per backend and phase", PROFILE_HELP)
    p.add_argument(
        "results", nargs="?", default=".normconf/results.jsonl", help="results file (default %(default)s)"
    )
    return p


def profile(args: argparse.Namespace) -> int:
    try:
        header, records = read_raw(args.results)
    except SchemaError as exc:
        raise options.UsageError(str(exc)) from exc
    for line in timing.lines(timing.profile(header, records)):
        print(line)
    return 0


def build_cache(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(sub, name, "list or clear the graph cache", CACHE_HELP)
    p.add_argument(
        "--graph-cache",
        default=None,
        metavar="DIR",
        help=f"the folder (default ${graph_cache.VARIABLE}, else {graph_cache.DEFAULT})",
    )
    p.add_argument("--clear", action="store_true", help="delete everything in it")
    return p


def cache(args: argparse.Namespace) -> int:
    folder = Path(args.graph_cache or os.environ.get(graph_cache.VARIABLE) or graph_cache.DEFAULT)
    if str(folder) == graph_cache.OFF:
        raise options.UsageError(f"--graph-cache={graph_cache.OFF!r} is not allowed here; allowed: a folder")
    if not folder.is_dir():
        print(f"{folder}: empty (no graph cache yet)")
        return 0
    if args.clear and not (folder / graph_cache.TAG).is_file():
        raise options.UsageError(
            f"--clear: {folder} has no {graph_cache.TAG}, so it is not a graph cache normconf made;"
            " nothing was deleted"
        )
    entries = {entry.name: _usage(entry) for entry in sorted(folder.iterdir())}
    total = sum(size for size, _ in entries.values())
    if args.clear:
        shutil.rmtree(folder)
        print(f"{folder}: cleared ({_mib(total)})")
        return 0
    width = max(map(len, entries), default=0)
    for name, (size, files) in entries.items():
        print(f"{name.ljust(width)}  {_mib(size):>10}  {files:,} files")
    print(f"{folder}: {_mib(total)}; normconf cache --clear empties it")
    return 0


def _usage(path: Path) -> tuple[int, int]:
    """(bytes, files) of a file or a folder's tree, walked once."""
    if path.is_file():
        return path.stat().st_size, 1
    sizes = [f.stat().st_size for f in path.rglob("*") if f.is_file()]
    return sum(sizes), len(sizes)


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"
