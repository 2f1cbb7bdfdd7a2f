"""Headroom of each backend against the tolerance matrix: worst_ratio per backend x output x dtype.

Usage: python scripts/headroom.py RESULTS.jsonl...  (prints a Markdown table)

worst_ratio <= 1 passes; 0.25 means the worst element used a quarter of its allowance. Outcomes
other than passed (xfailed deviations, failures) are left out: they are listed in the ledger or fail.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict

from conformance.case import Case
from conformance.checks import output_dtype
from conformance.results import read


def main() -> None:
    figures: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for path in sys.argv[1:]:
        _, records = read(path)
        for record in records:
            if record["outcome"] != "passed":
                continue
            case = Case.from_dict(record["case"])
            for c in record["comparisons"]:
                dtype = output_dtype(case, c["output"])
                figures[(record["backend"], c["output"], dtype)].append(float(c["worst_ratio"]))
    print("| backend | output | dtype | comparisons | median worst_ratio | max worst_ratio |")
    print("|---|---|---|---:|---:|---:|")
    for (backend, output, dtype), ratios in sorted(figures.items()):
        print(
            f"| {backend} | {output} | {dtype} | {len(ratios)} | "
            f"{statistics.median(ratios):.3g} | {max(ratios):.3g} |"
        )


if __name__ == "__main__":
    main()
