#!/usr/bin/env python3
"""Independent validator of the packed-AWQ timing protocol (bench/awq_protocol.json).

Reads the raw per-iteration timings written by bench_awq_gemm (--out raw.json), checks them against the
pre-declared protocol (operating points, shapes, iteration counts, correctness gate), recomputes every
median and ratio from the raw numbers (never trusting the bench's own summary) and prints the table
with one 5 % non-inferiority verdict per point for every protocol comparison that declares a margin
(invariant vs native, invariant-split vs native). Exit 1 when the raw data do not follow the protocol.
The methods timed are exactly those the comparisons name, so a protocol without invariant-split (the
original declaration) still validates the raw files measured under it.
Usage: validate_awq_timing.py bench/awq_protocol.json raw.json [--markdown out.md]
"""
import json
import statistics
import sys

SHORT = {"native": "nat", "invariant": "inv", "invariant-split": "split", "cublas_fp16": "cuBLAS"}


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
    tests = [c for c in proto["comparisons"] if "non_inferiority_margin" in c]
    reports = [c for c in proto["comparisons"] if c.get("report_only")]
    methods = []
    for c in proto["comparisons"]:
        for m in (c["numerator"], c["denominator"]):
            if m not in methods:
                methods.append(m)
    order = list(SHORT)
    methods.sort(key=lambda x: order.index(x) if x in order else len(order))
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
            for method in methods:
                t = pt["times_ms"].get(method, [])
                if len(t) != proto["timed_iterations"]:
                    problems.append(f"{key}/{method}: {len(t)} timings, protocol says {proto['timed_iterations']}")
                    continue
                med[method] = statistics.median(t)
                if abs(med[method] - pt.get("median_ms", {}).get(method, med[method])) > 1e-9:
                    problems.append(f"{key}/{method}: bench median {pt['median_ms'][method]} != recomputed {med[method]}")
            if len(med) < len(methods):
                continue
            ratios = [med[c["numerator"]] / med[c["denominator"]] for c in tests]
            verdicts = ["non-inferior" if r <= 1 + c["non_inferiority_margin"] else "INFERIOR" for r, c in zip(ratios, tests)]
            rep = [med[c["numerator"]] / med[c["denominator"]] for c in reports]
            rows.append((shape["name"], m, pt.get("routes"), [med[x] for x in methods], ratios, rep, verdicts))
    name = lambda c: f"{SHORT.get(c['numerator'], c['numerator'])}/{SHORT.get(c['denominator'], c['denominator'])}"
    header = (["shape", "M", "routes"] + [f"{x} ms" for x in methods] + [name(c) for c in tests] +
              [name(c) for c in reports] + [f"verdict {name(c)} ({c['non_inferiority_margin']:.0%})" for c in tests])
    lines = [f"medians of {proto['timed_iterations']} timed iterations after {proto['warmup_iterations']} warm-ups; "
             f"device: {raw.get('device', '?')}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r[0], str(r[1]), str(r[2])] + [f"{v:.4f}" for v in r[3]] + [f"{v:.3f}" for v in r[4]] + \
                [f"{v:.2f}" for v in r[5]] + r[6]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for i, c in enumerate(tests):
        ok = bool(rows) and all(r[6][i] == "non-inferior" for r in rows)
        worst = max((r[4][i] for r in rows), default=float("nan"))
        lines.append(f"overall {c['numerator']} vs {c['denominator']}: "
                     f"{'NON-INFERIOR at every point' if ok else 'NOT non-inferior at every point'} "
                     f"(worst ratio {worst:.3f}, margin {c['non_inferiority_margin']:.0%})")
    for p in problems:
        lines.append(f"PROTOCOL PROBLEM: {p}")
    text = "\n".join(lines)
    print(text)
    if md_out:
        open(md_out, "w").write(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
