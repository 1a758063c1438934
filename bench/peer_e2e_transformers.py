#!/usr/bin/env python3
"""PyTorch peer for `moesq bench e2e`: transformers' Qwen3MoeForCausalLM with random bf16 weights at
Qwen3-30B-A3B shapes (hidden 2048, 32 q / 4 kv heads of 128, 128 experts top-8, expert intermediate
768, vocab 151936), eager, on one GPU. TTFT = one prefill forward of B prompts of --prompt-len random
tokens (use_cache, host clock after synchronize); TPOT = median of --gen greedy decode steps with the
returned KV cache. Run with --layers L < 48 to bound memory/time: the JSON also gives the times scaled
to 48 layers (× 48 / L, which also scales the embedding + lm_head part: an upper bound).

Writes JSON {"rows": [{"batch", "ttft_ms", "tpot_ms", "ttft_ms_48", "tpot_ms_48", ...}], ...}.
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def sync_ms(t0):
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    cfg = Qwen3MoeConfig(hidden_size=2048, num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=4,
                         head_dim=128, num_experts=128, num_local_experts=128, num_experts_per_tok=8,
                         moe_intermediate_size=768, intermediate_size=6144, vocab_size=151936, norm_topk_prob=True,
                         max_position_embeddings=a.prompt_len + a.gen + 8, decoder_sparse_step=1, mlp_only_layers=[],
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(cfg)
    model.eval()
    experts_impl = "default"
    for impl in ("grouped_mm",):  # transformers 5.x MoE kernels, where the API exists
        try:
            model.set_experts_implementation(impl)
            experts_impl = impl
        except Exception as e:  # noqa: BLE001 - report, keep the default
            experts_impl = f"default ({type(e).__name__})"
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.inference_mode():
        # Warm-up at the measured prompt length (first-use kernel selection and allocator growth).
        warm = torch.randint(0, cfg.vocab_size, (1, a.prompt_len), device="cuda", generator=g)
        out = model(warm, use_cache=True, logits_to_keep=1)
        for _ in range(3):
            out = model(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
        del out
        torch.cuda.synchronize()
        for B in [int(x) for x in a.batch.split(",")]:
            ids = torch.randint(0, cfg.vocab_size, (B, a.prompt_len), device="cuda", generator=g)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            nxt = out.logits[:, -1:].argmax(-1)
            ttft = sync_ms(t0)
            pkv = out.past_key_values
            steps = []
            for _ in range(a.gen):
                t0 = time.perf_counter()
                out = model(nxt, past_key_values=pkv, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
                steps.append(sync_ms(t0))
                pkv = out.past_key_values
            tpot = statistics.median(steps)
            scale = 48.0 / a.layers
            rows.append({"batch": B, "prompt_len": a.prompt_len, "gen": a.gen, "ttft_ms": ttft, "tpot_ms": tpot,
                         "ttft_ms_48": ttft * scale, "tpot_ms_48": tpot * scale, "tok_s_48": B * 1e3 / (tpot * scale)})
            print(json.dumps(rows[-1]), flush=True)
            del out, pkv
            torch.cuda.empty_cache()
    res = {"peer": "transformers Qwen3MoeForCausalLM eager bf16, random weights", "transformers": transformers.__version__,
           "torch": torch.__version__, "layers": a.layers, "experts_implementation": experts_impl,
           "weight_bytes": params, "device": torch.cuda.get_device_name(), "rows": rows}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
