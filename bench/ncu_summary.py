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
for (i, n), m in k.items():
    print(f"  {i:>3} {n:60s} " + " ".join(f"{a.split('__')[1][:14]}={b}" for a, b in m.items()))
