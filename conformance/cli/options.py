"""Helpers shared by the ``normconf`` commands: option validation, file loading, usage errors."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from conformance.adapter import listing, registry
from conformance.results import benchjson, diff, render, runs
from conformance.results.records import SchemaError
from conformance.running import settings, shard

EXIT_CODES = """exit status:
  0  success (run: every check passed or is a known deviation; compare: no regression)
  1  run: a check failed or errored (with --strict-ledger also: a ledger entry not observed or a listed
     case that passed); compare: a regression
  2  usage error: bad option, missing or corrupt file, other schema version, unknown name"""


class UsageError(Exception):
    """Reported as ``normconf <command>: error: ...`` with exit status 2."""


def subparser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, description: str
) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def load_runs(paths: Sequence[str]) -> list[runs.Run]:
    try:
        return runs.load(paths)
    except SchemaError as exc:
        raise UsageError(str(exc)) from exc


def load_benches(paths: Sequence[str]) -> list[benchjson.BenchFile]:
    try:
        return [benchjson.read(p) for p in paths]
    except benchjson.BenchError as exc:
        raise UsageError(str(exc)) from exc


def ledger_options(p: argparse.ArgumentParser) -> None:
    """--ledger (repeatable), --no-builtin-ledger and --strict-ledger, as the pytest plugin has them."""
    p.add_argument(
        "--ledger",
        action="append",
        default=[],
        metavar="FILE",
        help="a known-deviations file (or folder of them) added to the built-in entries; repeatable",
    )
    p.add_argument(
        "--no-builtin-ledger",
        action="store_true",
        help="use only the --ledger files, not the built-in entries",
    )
    p.add_argument(
        "--strict-ledger",
        action="store_true",
        help="reference runs: a ledger entry not observed here, or a listed case that passes, fails the run",
    )


def selection(args: argparse.Namespace, backend: str = "all") -> settings.Settings:
    """Validate backend/op/dtype/profile/cases options the way the pytest plugin does."""
    try:
        return settings.build(
            backend=backend,
            op=args.op,
            dtype=args.dtype,
            profile=args.profile,
            cases_file=args.cases,
            results=Path("unused"),  # only pytest writes results; nothing here reads this
            timeout=getattr(args, "call_timeout", 300.0),
            tolerances_path=getattr(args, "tolerances", None),
            ledger_path=getattr(args, "ledger", None),
            builtin_ledger=not getattr(args, "no_builtin_ledger", False),
            max_timeouts=getattr(args, "max_timeouts", settings.MAX_TIMEOUTS),
        )
    except settings.SettingsError as exc:
        raise UsageError(str(exc)) from exc


def parse_shard(spec: str | None) -> shard.Shard | None:
    try:
        return shard.parse(spec) if spec else None
    except shard.ShardError as exc:
        raise UsageError(str(exc)) from exc


def renderer(fmt: str, group: str = render.GROUP) -> render.Renderer:
    try:
        return render.load(fmt, group)
    except render.RendererError as exc:
        raise UsageError(str(exc)) from exc


def thresholds(args: argparse.Namespace) -> diff.Thresholds:
    t = diff.Thresholds(growth=args.growth, min_ratio=args.min_ratio, speed=args.speed)
    if not (t.growth > 1 and t.min_ratio >= 0 and t.speed >= 0):
        raise UsageError(
            f"--growth={t.growth:g} --min-ratio={t.min_ratio:g} --speed={t.speed:g} are not allowed; "
            "allowed: growth > 1, min-ratio >= 0, speed >= 0"
        )
    return t


def list_backends() -> str:
    try:
        return listing.render(registry.entries())
    except registry.RegistryError as exc:
        raise UsageError(str(exc)) from exc


def write_text(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    except OSError as exc:
        raise UsageError(f"-o {path}: cannot write: {exc}") from exc


def dump_json(value: object) -> str:
    return json.dumps(value, indent=2) + "\n"
