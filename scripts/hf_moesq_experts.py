#!/usr/bin/env python3
"""transformers' Qwen3MoeForCausalLM (the tiny fixture) with every sparse MoE block replaced by
moesq's experts loaded from a moesq-compressed checkpoint (moesq.Model.moe_layer: route + paired 4:8
NVFP4 experts + combine, tensors crossing as DLPack); its logits are compared with `moesq eval` on the
same checkpoint and model.generate() is run. Usage: hf_moesq_experts.py HF_DIR MOESQ_CKPT MOESQ_BINARY

W4A4 tolerance: NVFP4 activation rounding turns an input difference of one float32 ulp into a whole
E2M1 step wherever a value sits on a rounding boundary, and those flips cascade through the layers.
So the W4A4 comparison is judged against that floor MEASURED in this run: the same swapped model is
run again with every MoE input multiplied by (1 ± 2^-23) (random signs, 4 seeds); the spread of its
nll is the floor. The per-layer max |MoE input difference| against moesq's own layer-by-layer
forward (Model.embed / attention_block / moe_input / moe_layer) shows where the two first part."""
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
    def __init__(self, model, layer, act_quant, noise_seed=None, seen=None):
        super().__init__()
        self.model, self.layer, self.act_quant = model, layer, act_quant
        self.noise_seed, self.seen = noise_seed, seen

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1]).float().contiguous().cpu()
        if self.noise_seed is not None:  # one-ulp relative perturbation (the floor probe)
            g = torch.Generator().manual_seed(self.noise_seed * 1000 + self.layer)
            sign = torch.randint(0, 2, x.shape, generator=g).float() * 2 - 1
            x = (x * (1 + sign * 2.0**-23)).contiguous()
        if self.seen is not None:
            self.seen[self.layer] = x.numpy().copy()
        y = torch.from_dlpack(self.model.moe_layer(self.layer, x, act_quant=self.act_quant))
        return y.to(hidden_states.device, hidden_states.dtype).reshape(shape)


def nll_of(logits, tokens):
    z = logits[:-1].astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(tokens) - 1), tokens[1:]]))


def hf_nll(hf, mq, tokens, dev, act_quant, noise_seed=None, seen=None):
    for l, layer in enumerate(hf.model.layers):
        layer.mlp = MoesqMoe(mq, l, act_quant, noise_seed, seen)
    with torch.no_grad():
        logits = hf(torch.from_numpy(tokens.astype(np.int64))[None].to(dev)).logits[0].float().cpu().numpy()
    return logits, nll_of(logits, tokens)


def moesq_moe_inputs(mq, tokens, act_quant):
    """moesq's own forward, layer by layer: the MoE input of every layer float32 [T, H]."""
    own = lambda t: np.array(np.from_dlpack(t))  # a writable copy: NumPy cannot export read-only arrays
    h, xs = own(mq.embed(tokens)), []
    for l in range(mq.config["num_layers"]):
        h = own(mq.attention_block(l, h))
        x = own(mq.moe_input(l, h))
        xs.append(x)
        h = h + own(mq.moe_layer(l, x, act_quant=act_quant))
    return xs


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
        xs = moesq_moe_inputs(mq, tokens, act_quant)
        per_layer = " ".join("%.1e" % np.abs(seen[l] - xs[l]).max() for l in range(len(xs)))
        floor = [abs(hf_nll(hf, mq, tokens, dev, act_quant, noise_seed=s)[1] - nll) for s in range(4)]
        tol = max(NLL_TOL, 4 * max(floor))  # the measured one-ulp floor, with a factor 4 of headroom
        print("act-quant %s: hf+moesq experts nll %.6f, moesq eval %.6f, |diff| %.2e (tol %.2e = max(%.0e, 4 x "
              "floor)); one-ulp floor |dnll| over 4 seeds %s; max |logit diff| vs moesq.logits %.3e; per-layer "
              "max |MoE input diff| vs moesq's layer-by-layer forward: %s"
              % (flag, nll, want, abs(nll - want), tol, NLL_TOL, " ".join("%.2e" % f for f in floor),
                 np.abs(mql - logits).max(), per_layer))
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
