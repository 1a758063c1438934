#!/usr/bin/env python3
"""Independent validator of the packed-AWQ timing protocol (bench/awq_protocol.json).

Reads the raw per-iteration timings written by bench_awq_gemm (--out raw.json), checks them against the
pre-declared protocol (operating points, shapes, iteration counts, correctness gate), recomputes every
median and ratio from the raw numbers (never trusting the bench's own summary) and prints the table
with the non-inferiority verdict. Exit 1 when the raw data do not follow the protocol.
Usage: validate_awq_timing.py bench/awq_protocol.json raw.json [--markdown out.md]
"""
import json
import statistics
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    proto = json.load(open(argv[1]))
    raw = json.load(open(argv[2]))
    md_out = argv[argv.index("--markdown") + 1] if "--markdown" in argv else None
    problems = []
    if raw.get("warmup_iterations") != proto["warmup_iterations"]:
        problems.append(f"warmups {raw.get('warmup_iterations')} != protocol {proto['warmup_iterations']}")
    margin = next(c["non_inferiority_margin"] for c in proto["comparisons"] if c["name"] == "invariant_vs_native")
    rows = []
    for shape in proto["shapes"]:
        for m in proto["operating_points_tokens"]:
            key = f"{shape['name']}/M={m}"
            pt = raw["points"].get(key)
            if pt is None:
                problems.append(f"missing point {key}")
                continue
            if not pt.get("correct", False):
                problems.append(f"{key}: correctness gate failed or missing")
            med = {}
            for method in ("native", "invariant", "cublas_fp16"):
                t = pt["times_ms"].get(method, [])
                if len(t) != proto["timed_iterations"]:
                    problems.append(f"{key}/{method}: {len(t)} timings, protocol says {proto['timed_iterations']}")
                    continue
                med[method] = statistics.median(t)
                if abs(med[method] - pt.get("median_ms", {}).get(method, med[method])) > 1e-9:
                    problems.append(f"{key}/{method}: bench median {pt['median_ms'][method]} != recomputed {med[method]}")
            if len(med) < 3:
                continue
            r_in = med["invariant"] / med["native"]
            rows.append((shape["name"], m, pt.get("routes"), med["native"], med["invariant"], med["cublas_fp16"], r_in,
                         med["native"] / med["cublas_fp16"], med["invariant"] / med["cublas_fp16"],
                         "non-inferior" if r_in <= 1 + margin else "INFERIOR"))
    lines = [f"margin {margin:.0%}; medians of {proto['timed_iterations']} timed iterations after "
             f"{proto['warmup_iterations']} warm-ups; device: {raw.get('device', '?')}", "",
             "| shape | M | routes | native ms | invariant ms | cuBLAS fp16 ms | inv/native | native/cuBLAS | inv/cuBLAS | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.4f} | {r[4]:.4f} | {r[5]:.4f} | {r[6]:.3f} | {r[7]:.2f} | "
                     f"{r[8]:.2f} | {r[9]} |")
    overall = all(r[9] == "non-inferior" for r in rows) and rows
    lines.append("")
    lines.append(f"overall: {'invariant is NON-INFERIOR to native at every point' if overall else 'NOT non-inferior at every point'}")
    for p in problems:
        lines.append(f"PROTOCOL PROBLEM: {p}")
    text = "\n".join(lines)
    print(text)
    if md_out:
        open(md_out, "w").write(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
