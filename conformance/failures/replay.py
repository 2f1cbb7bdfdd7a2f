"""Replay a saved failure bundle against any backend: ``python -m conformance.replay BUNDLE --backend NAME``.

Runs the bundle's inputs through the backend, compares with the oracle under the tolerance matrix,
and prints the same figures the suite recorded. Exit status: 0 the outputs now pass, 1 they still
fail, 2 a usage problem (unreadable bundle, unknown backend), 3 the backend cannot run the case.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from conformance.adapter import registry
from conformance.adapter.backend import BackendUnavailable
from conformance.failures import bundle
from conformance.failures.shrink import runner
from conformance.judging import tolerances
from conformance.results.result import ComparisonRecord

PASSED, FAILED, USAGE, UNSUPPORTED = 0, 1, 2, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The replay options, for ``python -m conformance.replay`` and ``normconf replay`` alike."""
    parser.add_argument("bundle", help="a bundle folder written by --save-failures (or its bundle.json)")
    parser.add_argument("--backend", help="backend to replay against (default: the one that failed)")
    parser.add_argument(
        "-p", dest="plugins", action="append", default=[], help="import MODULE first (registers adapters)"
    )
    parser.add_argument("--tolerances", help="tolerance file (default: the built-in matrix)")
    parser.add_argument("--call-timeout", type=float, default=300.0, help="seconds before a call is an error")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def line(c: ComparisonRecord) -> str:
    verdict = "ok  " if c.passed else "FAIL"
    if c.problem:
        return f"{verdict} {c.output}: {c.problem}"
    return (
        f"{verdict} {c.output}: worst_ratio {c.worst_ratio:.6g}, mismatched {c.mismatched}/{c.numel}, "
        f"max_abs {c.max_abs:.6g}, max_rel {c.max_rel:.6g}, max_ulp {c.max_ulp:.6g}; "
        f"at {list(c.worst_index)} actual {c.actual_at_worst!r} vs expected {c.expected_at_worst!r} "
        f"({c.tolerance.source})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.replay", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return replay(parser.parse_args(argv))


def replay(args: argparse.Namespace) -> int:
    if args.plugins and "" not in sys.path:
        sys.path.insert(0, "")  # a -p module in the current folder imports, as under python -m
    try:
        for module in args.plugins:
            importlib.import_module(module)
        saved = bundle.read(args.bundle)
        name = args.backend or saved.backend
        backend = registry.entries()[registry.resolve(name, registry.entries())[0]].load()
        caps = backend.capabilities()
        table = tolerances.read_tolerances(args.tolerances)
    except (ImportError, bundle.BundleError, registry.RegistryError, registry.BackendLoadError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return USAGE
    except (BackendUnavailable, tolerances.ToleranceError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return USAGE
    why = caps.why_not(saved.case, grad=saved.grad)
    if why is not None:
        print(f"replay: {name} cannot run {saved.case.id}: {why}", file=sys.stderr)
        return UNSUPPORTED
    attempt = runner(backend, saved.outputs, saved.grad, table, args.call_timeout)(saved.case, saved.inputs)
    if attempt is None:
        print(f"replay: {name} refused or failed to run {saved.case.id}", file=sys.stderr)
        return UNSUPPORTED
    _warn_if_oracle_moved(saved, attempt.expected)
    if args.json:
        print(json.dumps([c.to_dict() for c in attempt.comparisons], allow_nan=False))
    else:
        print(f"{name} {saved.meta['check']} {saved.case.id} (bundle of {saved.backend})")
        for c in attempt.comparisons:
            print("  " + line(c))
    return FAILED if attempt.failing else PASSED


def _warn_if_oracle_moved(saved: bundle.Bundle, expected: Mapping[str, np.ndarray]) -> None:
    """The stored oracle outputs are a cross-check: if today's oracle differs, say so."""
    moved = [n for n in saved.outputs if not np.array_equal(saved.expected[n], expected[n], equal_nan=True)]
    if moved:
        print(
            f"replay: note: the oracle's {moved} differ from the bundle's saved expectation", file=sys.stderr
        )


if __name__ == "__main__":
    sys.exit(main())
