#!/usr/bin/env python3
"""One line per kernel launch from an `ncu --csv --metrics ...` report: ID, kernel name, each metric."""
import collections
import csv
import sys

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("  no ncu rows")
    sys.exit()
h = rows[0]
ki, mi, vi, ii = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
k = collections.OrderedDict()
for r in rows[1:]:
    k.setdefault((r[ii], r[ki][:60]), {})[r[mi]] = r[vi]
for (i, n), m in (k.items() if "--by-kernel" not in sys.argv else []):
    print(f"  {i:>3} {n:60s} " + " ".join(f"{a.split('__')[1][:14]}={b}" for a, b in m.items()))
if len(sys.argv) > 2 and sys.argv[2] == "--by-kernel":  # then the launches summed per kernel name, largest first
    tot = collections.defaultdict(lambda: [0, 0.0])
    for (i, n), m in k.items():
        t = tot[n]
        t[0] += 1
        t[1] += float(m.get("gpu__time_duration.sum", "0").replace(",", ""))
    print(f"  by kernel (count, sum of gpu__time_duration): {sum(v[1] for v in tot.values()):.0f} in all")
    for n, (c, s) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
        print(f"  {s:12.0f} {c:5d}  {n}")
