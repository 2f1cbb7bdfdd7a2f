"""Propose ledger entries from results files: one entry per backend x check x output x op x dtype x dist.

Usage: python scripts/propose_ledger.py RESULTS.jsonl... [--backend NAME] > proposal.toml

Each entry lists the exact failing case ids (so it stays strict: a listed case that starts passing is
reported as xpassed) and a band of [1, 2 x the worst measured ratio]. The reason is left as TODO:
a deviation goes into conformance/judging/ledger.toml only once someone has understood and written it.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

from conformance.results.records import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--backend", action="append", help="only these backends (repeatable)")
    args = parser.parse_args()
    groups: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
    for path in args.results:
        for r in load(path).results:
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
        print("case = [\n" + "".join(f'    "{i}",\n' for i in sorted(cases)) + "]")
        print(f"band = [1.0, {high}]  # measured {min(cases.values()):.3g} .. {worst:.3g}")
        print('reason = "TODO"\nlink = ""\n')


if __name__ == "__main__":
    main()
