"""``normconf judge``: the current tolerances and ledger applied to a results file without rerunning."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.cli import options
from conformance.judging import tolerances
from conformance.judging.ledger import LedgerError
from conformance.judging.tolerances import ToleranceError
from conformance.results.records import write_atomic
from conformance.results.schema import SchemaError
from conformance.running import flags, rejudge
from conformance.running.settings import load_ledger

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

JUDGE_HELP = """Judge the results of RESULTS again under this installation's tolerances and ledger (plus
--ledger files) and write them to OUTPUT, printing every result whose outcome changed. No backend
runs: the inputs and the oracle regenerate from each case, failed and xfailed results are compared
again from the outputs they stored, and the platform (device, CPU features, library versions) is the
one RESULTS recorded, so a ledger change can be checked against runs from other hardware.

examples:
  normconf judge gpu/torch.jsonl.gz -o rejudged.jsonl
  normconf judge old.jsonl -o new.jsonl --ledger my_deviations.toml
  normconf compare old.jsonl new.jsonl         # the changes, with the report's figures"""


def build_judge(sub: Sub, name: str) -> argparse.ArgumentParser:
    p = options.subparser(sub, name, "apply the current tolerances and ledger to a results file", JUDGE_HELP)
    p.add_argument("results", metavar="RESULTS", help="a results file (.jsonl, or .jsonl.gz)")
    p.add_argument(
        "-o", "--output", required=True, metavar="OUTPUT", help="where to write the re-judged file"
    )
    flags.add(p.add_argument, (flags.TOLERANCES, *flags.LEDGER_FLAGS))
    return p


def judge(args: argparse.Namespace) -> int:
    """Exit 0 when the re-judged file has no failed, error or xpassed result, else 1."""
    try:
        table = tolerances.read_tolerances(args.tolerances)
        ledger = load_ledger(args.ledger, builtin=not args.no_builtin_ledger, strict=args.strict_ledger)
        done = rejudge.rejudge(Path(args.results), table, ledger)
    except (LedgerError, ToleranceError, SchemaError) as exc:
        raise options.UsageError(str(exc)) from exc
    write_atomic(Path(args.output), [done.header, *done.records])
    for line in rejudge.changes_text(done):
        print(line)
    outcomes = rejudge.outcome_counts(done)
    print("outcomes: " + ", ".join(f"{name} {count}" for name, count in sorted(outcomes.items())))
    print(f"written: {args.output}")
    bad = sum(outcomes.get(name, 0) for name in ("failed", "error", "xpassed"))
    unobserved = done.header["ledger"]["not_observed"] if args.strict_ledger else []
    return 1 if bad or unobserved else 0
