#!/usr/bin/env python3
"""Summarizes an Nsight Systems run of bench_refine_layer (bench/device_refine.sh STEPS=nsys).

Reads two CSV exports of `nsys stats`: the GPU kernel trace (cuda_gpu_trace: Start (ns), Duration (ns),
Name, Strm) and the CUDA API summary (cuda_api_sum). Prints, over the steady part of the run (the
middle 80 % of the kernel timeline): the wall span, the time the GPU had at least one kernel running
(busy %), the mean number of kernels in flight while busy, the kernel count per second, and the API
calls that took the most host time with their mean duration (a launch whose mean grows with the
thread count points at the issue rate; busy % well under 100 points at the host).

Usage: nsys_summary.py GPU_TRACE.csv API_SUM.csv
"""
import csv
import sys


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if "," in l]  # nsys prints a banner line before the CSV
    return list(csv.DictReader(lines))


def col(row, *names):
    for n in names:
        for k in row:
            if k.strip().startswith(n):
                return row[k]
    raise KeyError(names)


def main():
    trace = rows(sys.argv[1])
    kern = []
    for r in trace:
        name = col(r, "Name")
        if not name or "memcpy" in name.lower() or "memset" in name.lower():
            continue
        start, dur = int(float(col(r, "Start"))), int(float(col(r, "Duration")))
        kern.append((start, start + dur))
    if not kern:
        print("nsys: no kernels in the trace")
        return
    kern.sort()
    t0, t1 = kern[0][0], max(e for _, e in kern)
    lo, hi = t0 + (t1 - t0) // 10, t1 - (t1 - t0) // 10
    sel = [(max(s, lo), min(e, hi)) for s, e in kern if e > lo and s < hi]
    busy, cur_s, cur_e, work = 0, None, None, 0
    for s, e in sel:
        work += e - s
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = hi - lo
    print(f"nsys window {span / 1e6:.1f} ms (middle 80 %): {len(sel)} kernels = {len(sel) / (span / 1e9):,.0f} per s; "
          f"GPU busy {100.0 * busy / span:.1f} %; kernels in flight while busy {work / max(busy, 1):.2f}")
    api = rows(sys.argv[2])
    api.sort(key=lambda r: -float(col(r, "Total Time")))
    for r in api[:6]:
        print(f"  api {col(r, 'Name'):<32} calls {int(float(col(r, 'Num Calls'))):>9,}  "
              f"total {float(col(r, 'Total Time')) / 1e6:10.1f} ms  mean {float(col(r, 'Avg')) / 1e3:8.2f} us")


if __name__ == "__main__":
    main()
