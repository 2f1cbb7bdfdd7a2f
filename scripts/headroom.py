"""Headroom of each backend against the tolerance matrix: worst_ratio per backend x output x dtype.

Usage: python scripts/headroom.py RESULTS.jsonl...  (prints a Markdown table)

worst_ratio <= 1 passes; 0.25 means the worst element used a quarter of its allowance. Outcomes
other than passed (xfailed deviations, failures) are left out: they are listed in the ledger or fail.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict

from conformance.model.case import Case
from conformance.model.outputs import output_dtype
from conformance.results.records import read_results


def main() -> None:
    figures: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for path in sys.argv[1:]:
        for record in read_results(path).results:
            if record.outcome != "passed":
                continue
            case = Case.from_dict(dict(record.case))
            for c in record.comparisons:
                figures[(record.backend, c.output, output_dtype(case, c.output))].append(c.worst_ratio)
    print("| backend | output | dtype | comparisons | median worst_ratio | max worst_ratio |")
    print("|---|---|---|---:|---:|---:|")
    for (backend, output, dtype), ratios in sorted(figures.items()):
        print(
            f"| {backend} | {output} | {dtype} | {len(ratios)} | "
            f"{statistics.median(ratios):.3g} | {max(ratios):.3g} |"
        )


if __name__ == "__main__":
    main()
