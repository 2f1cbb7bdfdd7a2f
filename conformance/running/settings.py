"""Validated run settings built from the pytest options: which backends, which cases, which rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from conformance.adapter import registry
from conformance.judging import ledger, tolerances
from conformance.model import casefile, profiles
from conformance.model.case import OPS, Case
from conformance.model.dtypes import DTYPES
from conformance.properties.catalog import PROPERTIES
from conformance.running.checks import CHECK_NAMES


def load_ledger(
    path: str | Path | Sequence[str | Path] | None = None, *, builtin: bool = True, strict: bool = False
) -> ledger.Ledger:
    """The built-in entries (unless ``builtin`` is False) and those of ``path``, their ``check`` one of
    the checks or properties."""
    return ledger.read_ledger(path, (*CHECK_NAMES, *PROPERTIES), builtin=builtin, strict=strict)


# --max-timeouts: after this many hung cases of one backend (in one process) its remaining tests are
# errors at once.
MAX_TIMEOUTS = 3


class SettingsError(ValueError):
    """A bad option value; the message names the option, the value and the allowed choices."""


@dataclass(frozen=True)
class Settings:
    backends: tuple[str, ...]
    explicit_backends: bool
    cases: tuple[Case, ...]
    profile: str
    cases_file: str | None
    results: Path
    timeout: float
    tolerances: tolerances.ToleranceTable
    ledger: ledger.Ledger
    tolerances_option: str | None
    ledger_option: tuple[str, ...]
    save_failures: Path | None = None
    max_timeouts: int = MAX_TIMEOUTS


def _choices(option: str, value: str | None, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise SettingsError(f"{option}={value!r} is not allowed; allowed: comma list of {', '.join(allowed)}")
    return names


def _cases(
    profile: str, cases_file: str | None, ops: tuple[str, ...] | None, dtypes: tuple[str, ...] | None
) -> tuple[Case, ...]:
    if cases_file is not None:
        chosen = casefile.read_cases(cases_file)
    else:
        if profile not in profiles.PROFILES:
            raise SettingsError(
                f"--profile={profile!r} is not allowed; allowed: {', '.join(profiles.PROFILES)}"
            )
        chosen = profiles.cases(profile)
    selected = tuple(
        c for c in chosen if (ops is None or c.op in ops) and (dtypes is None or c.dtype in dtypes)
    )
    if not selected:
        source = f"--cases={cases_file}" if cases_file else f"--profile={profile}"
        raise SettingsError(f"no case selected: {source} has no case with --op={ops} --dtype={dtypes}")
    return selected


def build(
    *,
    backend: str,
    op: str | None,
    dtype: str | None,
    profile: str,
    cases_file: str | None,
    results: Path,
    timeout: float,
    tolerances_path: str | None,
    ledger_path: str | Sequence[str] | None,
    save_failures: str | None = None,
    max_timeouts: int = MAX_TIMEOUTS,
    builtin_ledger: bool = True,
    strict_ledger: bool = False,
) -> Settings:
    """Validate every option up front so a bad value stops the run before any case runs."""
    try:
        names = registry.resolve(backend, registry.entries())
        if not timeout > 0:
            raise SettingsError(f"--call-timeout={timeout!r} is not allowed; allowed: seconds > 0")
        if isinstance(max_timeouts, bool) or not isinstance(max_timeouts, int) or max_timeouts < 1:
            raise SettingsError(
                f"--max-timeouts={max_timeouts!r} is not allowed; allowed: a whole number >= 1"
            )
        extra = (ledger_path,) if isinstance(ledger_path, str) else tuple(ledger_path or ())
        if not builtin_ledger and not extra:
            raise SettingsError(
                "--no-builtin-ledger without --ledger FILE is not allowed; allowed: --no-builtin-ledger "
                "with one or more --ledger files (the entries that replace the built-in ones)"
            )
        cases = _cases(profile, cases_file, _choices("--op", op, OPS), _choices("--dtype", dtype, DTYPES))
        return Settings(
            backends=tuple(names),
            explicit_backends=backend.strip() != "all",
            cases=cases,
            profile=profile,
            cases_file=cases_file,
            results=results,
            timeout=timeout,
            tolerances=tolerances.read_tolerances(tolerances_path),
            ledger=load_ledger(extra, builtin=builtin_ledger, strict=strict_ledger),
            tolerances_option=tolerances_path,
            ledger_option=extra,
            save_failures=Path(save_failures) if save_failures else None,
            max_timeouts=max_timeouts,
        )
    except (
        registry.RegistryError,
        casefile.CaseFileError,
        tolerances.ToleranceError,
        ledger.LedgerError,
    ) as exc:
        raise SettingsError(str(exc)) from exc


def selection_line(settings: Settings, backends: str) -> str:
    """What a run will run, said before it starts: the profile (or cases file), the case count, and
    the larger profiles where there are any."""
    count = f"{len(settings.cases)} cases"
    if settings.cases_file is not None:
        return f"normconf: cases {settings.cases_file} ({count}), backends {backends}"
    larger = profiles.PROFILES[profiles.PROFILES.index(settings.profile) + 1 :]
    more = f"; --profile {' or '.join(larger)} for more" if larger else ""
    return f"normconf: profile {settings.profile} ({count}{more}), backends {backends}"
