"""The run options, declared once: ``pytest conformance`` (the plugin) and ``normconf run`` / ``cases`` /
``judge`` (the CLI) add them from this table, and ``normconf run`` forwards them to pytest from it, so a
flag, its default and its help cannot differ between the two ways of running the suite."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from conformance.running.settings import MAX_TIMEOUTS, Settings, build


class _AddsOptions(Protocol):
    """What pytest's option group and argparse's parser share: ``add(flag, **argparse keywords)``."""

    def __call__(self, *flags: str, **kwargs: Any) -> object: ...


@dataclass(frozen=True)
class Flag:
    """One option. ``help`` may hold ``{default}``, filled with the default of the command that adds it."""

    name: str  # the long flag, e.g. "--call-timeout"
    help: str
    default: object = None
    type: Callable[[str], object] | None = None
    action: str | None = None  # "store_true" or "append"
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")

    def keywords(self, default: object) -> dict[str, Any]:
        words: dict[str, Any] = {"help": self.help.format(default=default), "dest": self.dest}
        if self.action == "append":
            words |= {"action": "append", "default": []}
        elif self.action is not None:
            words["action"] = self.action
        else:
            words["default"] = default
        if self.type is not None:
            words["type"] = self.type
        if self.metavar is not None:
            words["metavar"] = self.metavar
        return words

    def forwarded(self, value: object) -> list[str]:
        """The pytest arguments that pass ``value`` on. A value is passed even where it equals
        pytest's default, so that neither PYTEST_ADDOPTS nor an ini file's addopts can replace it."""
        if self.action == "store_true":
            return [self.name] if value else []
        if self.action == "append":
            items = value if isinstance(value, list | tuple) else ()
            return [arg for item in items for arg in (self.name, str(item))]
        return [] if value is None else [self.name, str(value)]


BACKEND = Flag(
    "--backend",
    "comma list of backend names and keywords: all (default: every backend but the opt-in ones),"
    " frameworks (the opt-in framework backends), kernels (the opt-in CUDA kernel libraries)",
    default="all",
)
OP = Flag("--op", "comma list of ops to run (default: all in the profile)")
DTYPE = Flag("--dtype", "comma list of activation dtypes to run")
PROFILE = Flag("--profile", "case profile: smoke, ci, full (default {default})", default="smoke")
CASES = Flag("--cases", "JSON or TOML file of cases to run instead of a profile", metavar="FILE")
SHARD = Flag(
    "--shard", "run only part K of N (e.g. 2/4): whole cases, dealt round-robin by id", metavar="K/N"
)
CALL_TIMEOUT = Flag(
    "--call-timeout",
    "seconds before a backend call is an error (default {default})",
    300.0,
    type=float,
    metavar="SECONDS",
)
MAX_TIMEOUTS_FLAG = Flag(
    "--max-timeouts",
    "after this many hung cases a backend's remaining tests are errors at once (default {default})",
    MAX_TIMEOUTS,
    type=int,
    metavar="N",
)
TOLERANCES = Flag("--tolerances", "tolerance file (default: the built-in matrix)", metavar="FILE")
LEDGER = Flag(
    "--ledger",
    "a known-deviations file (or folder of them) added to the built-in entries; repeatable",
    action="append",
    metavar="FILE",
)
NO_BUILTIN_LEDGER = Flag(
    "--no-builtin-ledger",
    "use only the --ledger files: the built-in known deviations are left out",
    action="store_true",
)
STRICT_LEDGER = Flag(
    "--strict-ledger",
    "reference runs: a ledger entry not observed here, or a listed case that passes, fails the run",
    action="store_true",
)
SAVE_FAILURES = Flag(
    "--save-failures",
    "write a shrunk, replayable bundle for every failed or xfailed comparison check under DIR",
    metavar="DIR",
)
GRAPH_CACHE = Flag(
    "--graph-cache",
    "folder where backends keep compiled graphs and exports between runs (default .normconf/cache"
    " under the rootdir, or $NORMCONF_CACHE_DIR; 'none': keep none); normconf cache --clear empties it",
    metavar="DIR",
)
NO_PRECOMPILE = Flag(
    "--no-precompile",
    "one-process runs: compile nothing ahead in a second process (by default, with a graph cache and a"
    " free core, a backend with a precompile() hook builds the run's graphs there ahead of its checks)",
    action="store_true",
)

SELECTION = (OP, DTYPE, PROFILE, CASES, SHARD)
LEDGER_FLAGS = (LEDGER, NO_BUILTIN_LEDGER, STRICT_LEDGER)
# What a run of the suite takes, in the order --help lists them; normconf run forwards each to pytest.
RUN = (
    BACKEND,
    *SELECTION,
    CALL_TIMEOUT,
    MAX_TIMEOUTS_FLAG,
    TOLERANCES,
    *LEDGER_FLAGS,
    SAVE_FAILURES,
    GRAPH_CACHE,
    NO_PRECOMPILE,
)


def add(adder: _AddsOptions, flags: Iterable[Flag], defaults: Mapping[str, object] | None = None) -> None:
    """Add ``flags`` through ``adder`` (pytest's ``group.addoption`` or argparse's ``add_argument``);
    ``defaults`` overrides a flag's default by its dest."""
    for flag in flags:
        adder(flag.name, **flag.keywords((defaults or {}).get(flag.dest, flag.default)))


def forward(args: argparse.Namespace, flags: Iterable[Flag]) -> list[str]:
    """pytest arguments for the values of ``flags`` in ``args``."""
    return [arg for flag in flags for arg in flag.forwarded(getattr(args, flag.dest))]


def build_settings(get: Callable[[str], Any], results: Path) -> Settings:
    """Validated settings from the run flags' values, ``get`` reading one by its dest (pytest's
    ``config.getoption``; the CLI reads its namespace, where a command without a flag has its default)."""
    return build(
        backend=get(BACKEND.dest),
        op=get(OP.dest),
        dtype=get(DTYPE.dest),
        profile=get(PROFILE.dest),
        cases_file=get(CASES.dest),
        results=results,
        timeout=get(CALL_TIMEOUT.dest),
        tolerances_path=get(TOLERANCES.dest),
        ledger_path=get(LEDGER.dest),
        save_failures=get(SAVE_FAILURES.dest),
        max_timeouts=get(MAX_TIMEOUTS_FLAG.dest),
        builtin_ledger=not get(NO_BUILTIN_LEDGER.dest),
        strict_ledger=get(STRICT_LEDGER.dest),
    )
