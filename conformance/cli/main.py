"""The ``normconf`` command line: run, report, conventions, compare, judge, replay, backends, cases.

Exit status: 0 success (and, for ``run``, every check passed; for ``compare``, no regression);
1 a check failed, errored or went stale, or ``compare`` found a regression; 2 a usage error (bad
option, missing or corrupt file, a results file of another schema version, an unknown name).
Renderers are found through the ``normconf.renderers`` entry points, never imported by name.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from conformance.cli.commands import COMMANDS
from conformance.cli.options import EXIT_CODES, UsageError

# The exit status of a command whose reader went away (SIGPIPE's 128 + 13, as `yes | head` gives).
BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        # As argparse does for its own errors: the command's usage, then what was wrong.
        sys.stderr.write(args.usage())
        print(f"normconf {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"normconf {args.command}: interrupted", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `normconf cases | head`: the reader has what it wanted. Point stdout at /dev/null so that
        # the interpreter's final flush does not fail again, and end quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="normconf",
        description="Conformance suite for normalization layers: run it, report it, compare runs.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (build, func) in COMMANDS.items():
        command = build(sub, name)
        command.set_defaults(func=func, usage=command.format_usage)
    return parser


if __name__ == "__main__":
    sys.exit(main())
