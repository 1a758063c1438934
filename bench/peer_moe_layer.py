#!/usr/bin/env python3
"""bf16 PyTorch peer for bench_moe_layer: one whole MoE layer at a real model's shapes written the way
a PyTorch user writes it with the grouped GEMM PyTorch ships (torch._grouped_mm): router linear with
fp32 logits, softmax + top-k + renormalisation, routes sorted by expert, gate|up grouped MM, SwiGLU,
down grouped MM, weighted index_add_ into the output. Like bench_moe_layer, `--layers` layers of
weights run per replay so the experts stream from HBM, the layer is replayed from a CUDA graph when
capture works (eager otherwise: the JSON says which), and the time is µs per layer.
Writes {"rows": [{"T", "us", "mode"}...]} for bench_moe_layer --peer-json.
Usage: peer_moe_layer.py --out P.json [--batch 1,64,512] [--layers 4] [--reps 200]"""
import argparse
import json

import torch

SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8), "qwen3-235b-a22b": (4096, 1536, 128, 8)}  # H, I, E, top-k


def moe_layer(x, router, gate_up, down, topk):
    """x [T, H] bf16; router [E, H]; gate_up [E, H, 2I] (column-major B per expert); down [E, I, H]."""
    T = x.shape[0]
    E = router.shape[0]
    logits = (x.float() @ router.float().t())
    p = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(p, topk, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int32, device=x.device).index_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = order // topk
    xs = x.index_select(0, rows)
    h = torch._grouped_mm(xs, gate_up, offs=offs, out_dtype=torch.bfloat16)
    I = h.shape[1] // 2
    a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    y = torch._grouped_mm(a, down, offs=offs, out_dtype=torch.bfloat16)
    y = y.float() * w.reshape(-1)[order, None]
    return torch.zeros(T, x.shape[1], device=x.device, dtype=torch.float32).index_add_(0, rows, y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--batch", default="1,64,512")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    H, I, E, k = SHAPES[args.model]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers.append((torch.randn(E, H, device=dev, dtype=torch.bfloat16) * 0.02,
                       (torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02).transpose(1, 2),
                       (torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * 0.02).transpose(1, 2)))
    rows = []
    for T in [int(b) for b in args.batch.split(",")]:
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)

        def step():
            out = None
            for r, gu, dn in layers:
                out = moe_layer(x, r, gu, dn, k)
            return out

        row = {"T": T}
        try:
            # check: the layer against a per-token loop in fp32 on layer 0
            y = moe_layer(x, *layers[0], k)
            r, gu, dn = layers[0]
            p = torch.softmax(x.float() @ r.float().t(), -1)
            w, ids = torch.topk(p, k, -1)
            w = w / w.sum(-1, keepdim=True)
            t = 0
            want = torch.zeros(H, device=dev)
            for j in range(k):
                e = int(ids[t, j])
                hh = x[t].float() @ gu[e].float()
                want += w[t, j] * ((torch.nn.functional.silu(hh[:I]) * hh[I:]) @ dn[e].float())
            row["check_rel_err"] = float((y[t] - want).norm() / want.norm().clamp_min(1e-30))
            mode = "graph"
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step()
                run = g.replay
            except Exception as exc:  # capture refused: time eagerly and say so
                mode, run = "eager (%s)" % type(exc).__name__, step
            for _ in range(3):
                run()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(args.reps):
                run()
            e1.record()
            e1.synchronize()
            row["us"] = e0.elapsed_time(e1) * 1e3 / (args.reps * args.layers)
            row["mode"] = mode
        except Exception as exc:  # record, never hide
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump({"model": args.model, "layers": args.layers, "rows": rows}, f, indent=1)
    import os
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
