"""Helpers shared by the ``normconf`` commands: option validation, file loading, usage errors."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conformance.adapter import listing, registry
from conformance.results import benchjson, diff, render, runs
from conformance.results.schema import SchemaError
from conformance.running import flags, settings, shard

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
        return runs.read_runs(paths)
    except SchemaError as exc:
        raise UsageError(str(exc)) from exc


def load_benches(paths: Sequence[str]) -> list[benchjson.BenchFile]:
    try:
        return [benchjson.read(p) for p in paths]
    except benchjson.BenchError as exc:
        raise UsageError(str(exc)) from exc


def selection(args: argparse.Namespace, backend: str = "all") -> settings.Settings:
    """Validate the run flags ``args`` has the way the pytest plugin does (the others at their defaults);
    the backend is ``backend``: names are checked by the plugin, which also sees -p registrations."""
    defaults = {flag.dest: flag.default for flag in flags.RUN}

    def get(dest: str) -> Any:
        return backend if dest == flags.BACKEND.dest else getattr(args, dest, defaults[dest])

    try:
        # Only pytest writes results; nothing here reads this path.
        return flags.build_settings(get, Path("unused"))
    except settings.SettingsError as exc:
        raise UsageError(str(exc)) from exc


def parse_shard(spec: str | None) -> shard.Shard | None:
    try:
        return shard.parse(spec) if spec else None
    except shard.ShardError as exc:
        raise UsageError(str(exc)) from exc


def renderer(fmt: str, group: str = render.GROUP) -> render.Renderer:
    try:
        return render.find_renderer(fmt, group)
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


def survey_backends() -> list[listing.Listed]:
    try:
        return listing.survey(registry.entries())
    except registry.RegistryError as exc:
        raise UsageError(str(exc)) from exc


def import_plugins(modules: Sequence[str]) -> None:
    """Import each ``-p MODULE`` (from the current folder first, as ``python -m`` would) so that the
    backends it registers are known."""
    if modules and "" not in sys.path:
        sys.path.insert(0, "")
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise UsageError(f"-p {module}: cannot import: {type(exc).__name__}: {exc}") from exc


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
