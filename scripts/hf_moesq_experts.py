#!/usr/bin/env python3
"""transformers' Qwen3MoeForCausalLM (the tiny fixture) with every sparse MoE block replaced by
moesq's experts loaded from a moesq-compressed checkpoint (moesq.Model.moe_layer: route + paired 4:8
NVFP4 experts + combine, tensors crossing as DLPack); its logits are compared with `moesq eval` on the
same checkpoint and model.generate() is run. Usage: hf_moesq_experts.py HF_DIR MOESQ_CKPT MOESQ_BINARY

W4A4 tolerance: transformers' attention and moesq's sum in different orders, so the MoE inputs of the
two forwards differ by ~1e-6 (measured below in W4A16, where nothing amplifies it). NVFP4 activation
rounding turns such a difference into a whole E2M1 step wherever a value sits on a rounding boundary,
and the flips cascade through the layers. So W4A4 is judged against that floor MEASURED in this run:
moesq's own layer-by-layer forward (Model.embed / attention_block / moe_input / moe_layer) is re-run
with each layer's MoE input moved by ±δ_l (random signs, 4 seeds), δ_l = the W4A16 run's max |MoE
input difference| at layer l; the largest |Δ nll| over the seeds is the floor, the tolerance 2 × it.
The per-layer max |MoE input difference| (hf vs moesq's layer-by-layer forward) shows where they part."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import Qwen3MoeForCausalLM

import moesq

NLL_TOL = 2e-3  # nats/token: transformers' fp32 attention vs moesq's CPU attention (summation order)


class MoesqMoe(torch.nn.Module):
    def __init__(self, model, layer, act_quant, seen=None):
        super().__init__()
        self.model, self.layer, self.act_quant = model, layer, act_quant
        self.seen = seen

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1]).float().contiguous().cpu()
        if self.seen is not None:
            self.seen[self.layer] = x.numpy().copy()
        y = torch.from_dlpack(self.model.moe_layer(self.layer, x, act_quant=self.act_quant))
        return y.to(hidden_states.device, hidden_states.dtype).reshape(shape)


def nll_of(logits, tokens):
    z = logits[:-1].astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(tokens) - 1), tokens[1:]]))


def hf_nll(hf, mq, tokens, dev, act_quant, seen=None):
    for l, layer in enumerate(hf.model.layers):
        layer.mlp = MoesqMoe(mq, l, act_quant, seen)
    with torch.no_grad():
        logits = hf(torch.from_numpy(tokens.astype(np.int64))[None].to(dev)).logits[0].float().cpu().numpy()
    return logits, nll_of(logits, tokens)


def moesq_layers(mq, tokens, act_quant, hf, dev, delta=None, seed=0):
    """moesq's own forward, layer by layer: (the MoE input of every layer float32 [T, H], nll). With
    `delta` [layers], each layer's MoE input moves by ±delta[l] (random signs from `seed`). The final
    norm and lm_head are transformers' (hf.model.norm, hf.lm_head; float32)."""
    own = lambda t: np.array(np.from_dlpack(t))  # a writable copy: NumPy cannot export read-only arrays
    rng = np.random.default_rng(seed)
    h, xs = own(mq.embed(tokens)), []
    for l in range(mq.config["num_layers"]):
        h = own(mq.attention_block(l, h))
        x = own(mq.moe_input(l, h))
        if delta is not None:
            x = (x + delta[l] * np.where(rng.random(x.shape) < 0.5, -1.0, 1.0)).astype(np.float32)
        xs.append(x)
        h = h + own(mq.moe_layer(l, x, act_quant=act_quant))
    with torch.no_grad():
        z = hf.lm_head(hf.model.norm(torch.from_numpy(h).to(dev)[None]))[0].float().cpu().numpy()
    return xs, nll_of(z, tokens)


def main(hf_dir, ckpt, binary):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hf = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(dev).eval()
    mq = moesq.load(ckpt)
    tokens = np.random.default_rng(5).integers(0, 256, size=128, dtype=np.int32)
    ok = True
    # W4A16 first (no activation rounding to flip), then the checkpoint's W4A4 deployment.
    for act_quant, flag in ((False, "none"), (True, "nvfp4")):
        seen = {}
        logits, nll = hf_nll(hf, mq, tokens, dev, act_quant, seen=seen)
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "t.npy"), tokens)
            out = subprocess.run([binary, "eval", ckpt, "--data", os.path.join(d, "t.npy"), "--seq-len", "128",
                                  "--act-quant", flag, "--json"], check=True, capture_output=True, text=True).stdout
        want = json.loads(out)["nats_per_token"]
        mql = np.from_dlpack(mq.logits(tokens, act_quant=act_quant))
        xs, own_nll = moesq_layers(mq, tokens, act_quant, hf, dev)
        diff = [float(np.abs(seen[l] - xs[l]).max()) for l in range(len(xs))]
        line = ("act-quant %s: hf+moesq experts nll %.6f, moesq eval %.6f, |diff| %.2e; moesq layer-by-layer nll %.6f; "
                "max |logit diff| vs moesq.logits %.3e; per-layer max |MoE input diff| hf vs moesq: %s"
                % (flag, nll, want, abs(nll - want), own_nll, np.abs(mql - logits).max(), " ".join("%.1e" % d for d in diff)))
        if not act_quant:
            delta, tol = diff, NLL_TOL
        else:  # the floor of this input difference, measured
            floor = [abs(moesq_layers(mq, tokens, act_quant, hf, dev, delta, s)[1] - own_nll) for s in range(4)]
            tol = max(NLL_TOL, 2 * max(floor))
            line += "; floor |dnll| at the W4A16 input differences, 4 seeds: %s" % " ".join("%.2e" % f for f in floor)
        print(line + "; tol %.2e -> %s" % (tol, "ok" if abs(nll - want) <= tol else "FAIL"))
        ok &= abs(nll - want) <= tol
    for l, layer in enumerate(hf.model.layers):
        layer.mlp = MoesqMoe(mq, l, None)
    gen = hf.generate(torch.from_numpy(tokens[:16].astype(np.int64))[None].to(dev), max_new_tokens=8, do_sample=False)
    print("generate:", gen[0, 16:].tolist())
    if moesq.cuda_available():
        eng = moesq.Engine(ckpt)
        gl = np.from_dlpack(eng.logits(tokens))
        print("moesq.Engine (GPU, %s) max |logit diff| vs moesq.logits (CPU) %.3e" % (eng.backend, np.abs(gl - mql).max()))
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    main(*sys.argv[1:4])
