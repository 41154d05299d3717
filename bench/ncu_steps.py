#!/usr/bin/env python3
"""ncu_steps.py — per-step kernel time table from an Nsight Compute CSV.

Input: the output of
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        --log-file OUT.csv <program>
(one row per kernel launch, in launch order). A step of the kiln executor ends
with its sampling kernel (kiln_sample), so the launches are cut there into
steps. For each step (or the steps named by --steps), prints every kernel
name with its launch count and summed duration, and the step's total, so the
time of a forward can be attributed: GEMMs, attention, norms, the rest.
ncu runs kernels one at a time, so totals leave out launch gaps and the
overlap programmatic dependent launch gives: compare them with the step times
the benchmark measures.
"""
import argparse
import collections
import csv
import re
import sys


def short(name):
    """cuBLASLt and kiln kernel names, shortened to what tells them apart."""
    name = re.sub(r"\(.*$", "", name)  # argument lists
    if name.startswith("void "):
        name = name[5:]
    return name[:70]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--steps", default="", help="comma-separated step indices to print (default: all)")
    ap.add_argument("--end", default="kiln_sample", help="kernel that ends a step")
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own log lines start with ==
    for r in csv.DictReader(lines):
        if not (r.get("ID") or "").isdigit():
            continue  # the units row
        v = r.get("gpu__time_duration.sum")
        if v is None:
            continue
        try:
            ns = float(v.replace(",", ""))
        except ValueError:
            continue
        rows.append((short(r["Kernel Name"]), r.get("Grid Size", ""), ns))
    if not rows:
        sys.exit(f"{a.csv}: no kernel rows with gpu__time_duration.sum")
    unit = 1e-3  # ncu reports ns with --print-units base; shown in µs
    steps, cur = [], []
    for row in rows:
        cur.append(row)
        if row[0].startswith(a.end):
            steps.append(cur)
            cur = []
    if cur:
        steps.append(cur)
    want = {int(s) for s in a.steps.split(",") if s.strip()} if a.steps else None
    print(f"{len(rows)} kernels in {len(steps)} steps (a step ends with {a.end})")
    for i, st in enumerate(steps):
        total = sum(r[2] for r in st) * unit
        print(f"step {i}: {len(st)} kernels, {total:.1f} us")
        if want is not None and i not in want:
            continue
        agg = collections.OrderedDict()
        for name, grid, ns in st:
            k = (name, grid)
            c, t = agg.get(k, (0, 0.0))
            agg[k] = (c + 1, t + ns)
        for (name, grid), (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
            print(f"    {t * unit:10.1f} us {100 * t * unit / total:5.1f}%  {c:4d} x {t * unit / c:8.2f} us  grid {grid:>14}  {name}")


if __name__ == "__main__":
    main()
