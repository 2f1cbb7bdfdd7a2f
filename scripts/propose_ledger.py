"""Propose ledger entries from results files: one entry per backend x check x output x op x dtype x dist.

Usage: python scripts/propose_ledger.py RESULTS.jsonl... [--backend NAME] > proposal.toml

Each entry names where it applies by predicates (the measured case ids follow as a comment) and a band
of [1, 2 x the worst measured ratio] with a note that no model exists yet. The reason and the model are
left as TODO: a deviation goes into a family file of conformance/judging/deviations/ (or a ledger file
of your own, docs/tolerances.md#known-deviations) only once someone has understood it, written why, and
ideally written the model of what the backend computes (conformance/judging/models.py).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

from conformance.results.records import read_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--backend", action="append", help="only these backends (repeatable)")
    args = parser.parse_args()
    groups: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
    for path in args.results:
        for r in read_results(path).results:
            if r.outcome not in ("failed", "xfailed") or (args.backend and r.backend not in args.backend):
                continue
            dist = str(r.case.get("dist", "?"))
            for c in r.comparisons:
                # A NaN figure (a non-finite output) needs the widest band, as inf does.
                ratio = math.inf if math.isnan(c.worst_ratio) else c.worst_ratio
                if ratio > 1:
                    key = (r.backend, r.check, c.output, r.op, r.dtype, dist)
                    groups[key][r.case_id] = max(ratio, groups[key].get(r.case_id, 0.0))
    for (backend, check, output, op, dtype, dist), cases in sorted(groups.items()):
        worst = max(cases.values())
        high = "inf" if math.isinf(worst) else f"{2 * worst:.3g}"
        print("[[deviation]]")
        print(f'backend = "{backend}"\ncheck = "{check}"\noutput = "{output}"')
        print(f'op = "{op}"\ndtype = "{dtype}"\ndist = "{dist}"')
        print("".join(f"# measured on {i}\n" for i in sorted(cases)), end="")
        print(f"band = [1.0, {high}]  # measured {min(cases.values()):.3g} .. {worst:.3g}")
        print('note = "TODO: no model yet; write one (model = ...) or say why none can reproduce it"')
        print('reason = "TODO"\n')


if __name__ == "__main__":
    main()
