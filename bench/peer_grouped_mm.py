#!/usr/bin/env python3
"""Dense bf16 peer for bench_gemm: torch._grouped_mm (CUTLASS grouped GEMM) on the shapes of
bench/bench_gemm.cu, timed the same way (CUDA events, warm-up, median, weights rotated through
sets larger than L2). Writes JSON {"rows": [{"name", "G", "N", "us"}...]} that bench_gemm merges.

Token counts per expert cycle {N, 3N/4, N/2, N/4}, each rounded UP (so N = 1 gives 1 everywhere),
exactly as bench_gemm.cu does.
"""
import argparse
import json
import statistics

import torch

SHAPES = [  # (name, M, K, G list, N list) — paper Table 8
    ("qwen3-30b-a3b.gate_up", 1536, 2048, [8, 32, 128], [1, 8, 16, 64, 256, 1024]),
    ("qwen3-30b-a3b.down", 2048, 768, [8, 32, 128], [1, 8, 16, 64, 256, 1024]),
    ("kimi-k2.5.gate_up", 4096, 7168, [384], [8, 32, 128, 256]),
]
ROTATE_BYTES = 512 << 20  # weights rotated through at least this many bytes (L2 is 50-60 MB)


def counts_for(G, N):
    cyc = [N, (3 * N + 3) // 4, (N + 1) // 2, (N + 3) // 4]
    return [cyc[e % 4] for e in range(G)]


def time_us(fn, reps, warmup=5):
    for _ in range(warmup):
        fn(0)
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(i)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help='run rows whose "name/G/N" contains this (as bench_gemm --only)')
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    dev = torch.device("cuda")
    for name, M, K, Gs, Ns in SHAPES:
        for G in Gs:
            wbytes = G * M * K * 2
            nsets = max(1, min(16, -(-ROTATE_BYTES // wbytes)))
            # [G, M, K] storage viewed as [G, K, M]: the column-major B operand _grouped_mm wants.
            ws = [torch.randn(G, M, K, device=dev, dtype=torch.bfloat16).transpose(1, 2) for _ in range(nsets)]
            for N in (Ns[:2] if args.quick else Ns):
                if args.only and args.only not in f"{name}/{G}/{N}":
                    continue
                counts = counts_for(G, N)
                S = sum(counts)
                x = torch.randn(S, K, device=dev, dtype=torch.bfloat16)
                offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0).to(torch.int32)
                row = {"name": name, "G": G, "N": N, "tokens": S}
                try:
                    ref = torch._grouped_mm(x, ws[0], offs=offs, out_dtype=torch.bfloat16)
                    # check first: expert 0 against a plain matmul
                    want = x[: counts[0]].float() @ ws[0][0].float()
                    err = (ref[: counts[0]].float() - want).norm() / want.norm().clamp_min(1e-30)
                    row["check_rel_err"] = float(err)
                    row["us"] = time_us(lambda i: torch._grouped_mm(x, ws[i % nsets], offs=offs,
                                                                     out_dtype=torch.bfloat16), args.reps)
                except Exception as exc:  # record, never hide: the bench prints what failed
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
                del x
            del ws
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
