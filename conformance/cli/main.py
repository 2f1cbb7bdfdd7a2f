"""The ``normconf`` command line: run, report, conventions, compare, judge, backends, cases.

Exit status: 0 success (and, for ``run``, every check passed; for ``compare``, no regression);
1 a check failed, errored or went stale, or ``compare`` found a regression; 2 a usage error (bad
option, missing or corrupt file, a results file of another schema version, an unknown name).
Renderers are found through the ``normconf.renderers`` entry points, never imported by name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from conformance.cli.commands import COMMANDS
from conformance.cli.options import EXIT_CODES, UsageError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"normconf {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"normconf {args.command}: interrupted", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="normconf",
        description="Conformance suite for normalization layers: run it, report it, compare runs.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (build, func) in COMMANDS.items():
        build(sub, name).set_defaults(func=func)
    return parser


if __name__ == "__main__":
    sys.exit(main())
