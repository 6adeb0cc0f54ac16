"""Summarize Nsight Compute's SASS source page: where a kernel's warps stall, by instruction and by opcode.

    ncu --clock-control none -k regex:_dot_kernel --launch-skip 2 --launch-count 1 --section SourceCounters \\
        --section WarpStateStats -o REPORT python3 benchmarks/ncu_matmul.py Q4_K --xperm
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SRC.csv
    python benchmarks/ncu_source_summary.py SRC.csv [--top 40]

Prints the sampled stall columns summed by opcode, then the --top instructions by all samples with their
per-reason columns (the columns whose names mention stall or sampling; which ones exist depends on the ncu version).
"""
from __future__ import annotations

import argparse
import collections
import csv
import sys


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    lines = open(args.csv, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"#"') or ("Source" in ln and "Address" in ln)),
                 0)                                   # the header row (ncu prints notes above it)
    rows = list(csv.DictReader(lines[start:]))
    if not rows:
        print("no rows", file=sys.stderr)
        return 1
    cols = list(rows[0].keys())
    src = next((c for c in cols if c.strip().lower() == "source"), cols[min(2, len(cols) - 1)])
    stall = [c for c in cols if "stall" in c.lower() or "sampl" in c.lower()]
    allc = next((c for c in stall if "all samples" in c.lower()), stall[0] if stall else None)
    print("columns:", cols)
    if allc is None:
        return 1
    by_op: dict = collections.defaultdict(lambda: collections.Counter())
    for r in rows:
        op = r[src].strip().split(" ")[0].split(".")[0] if r[src].strip() else "?"
        if op.startswith("@"):
            op = r[src].strip().split(" ")[1].split(".")[0]
        for c in stall:
            by_op[op][c] += _num(r[c])
    total = sum(v[allc] for v in by_op.values()) or 1.0
    print(f"\nsamples by opcode ({allc}; total {total:.0f}):")
    for op, v in sorted(by_op.items(), key=lambda kv: -kv[1][allc])[:25]:
        print(f"  {op:10s} {v[allc]:9.0f} {100 * v[allc] / total:5.1f} %")
    print(f"\ntop {args.top} instructions:")
    for r in sorted(rows, key=lambda r: -_num(r[allc]))[:args.top]:
        extra = {c: r[c] for c in stall if _num(r[c]) and c != allc}
        print(f"  {_num(r[allc]):7.0f}  {r.get('Address', '')}  {r[src].strip()[:70]:70s} {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
