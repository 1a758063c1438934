#!/usr/bin/env python3
"""transformers' Qwen3MoeForCausalLM (the tiny fixture) with every sparse MoE block replaced by
moesq's experts loaded from a moesq-compressed checkpoint (moesq.Model.moe_layer: route + paired 4:8
NVFP4 experts + combine, tensors crossing as DLPack); its logits are compared with `moesq eval` on the
same checkpoint and model.generate() is run. Usage: hf_moesq_experts.py HF_DIR MOESQ_CKPT MOESQ_BINARY"""
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
    def __init__(self, model, layer, act_quant):
        super().__init__()
        self.model, self.layer, self.act_quant = model, layer, act_quant

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1]).float().contiguous().cpu()
        y = torch.from_dlpack(self.model.moe_layer(self.layer, x, act_quant=self.act_quant))
        return y.to(hidden_states.device, hidden_states.dtype).reshape(shape)


def nll_of(logits, tokens):
    z = logits[:-1].astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(tokens) - 1), tokens[1:]]))


def main(hf_dir, ckpt, binary):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hf = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(dev).eval()
    mq = moesq.load(ckpt)
    tokens = np.random.default_rng(5).integers(0, 256, size=128, dtype=np.int32)
    ok = True
    # W4A16 first (no activation rounding to flip), then the checkpoint's W4A4 deployment.
    for act_quant, flag in ((False, "none"), (True, "nvfp4")):
        for l, layer in enumerate(hf.model.layers):
            layer.mlp = MoesqMoe(mq, l, act_quant)
        with torch.no_grad():
            logits = hf(torch.from_numpy(tokens.astype(np.int64))[None].to(dev)).logits[0].float().cpu().numpy()
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "t.npy"), tokens)
            out = subprocess.run([binary, "eval", ckpt, "--data", os.path.join(d, "t.npy"), "--seq-len", "128",
                                  "--act-quant", flag, "--json"], check=True, capture_output=True, text=True).stdout
        want, nll = json.loads(out)["nats_per_token"], nll_of(logits, tokens)
        mql = np.from_dlpack(mq.logits(tokens, act_quant=act_quant))
        print("act-quant %s: hf+moesq experts nll %.6f, moesq eval %.6f, |diff| %.2e (tol %.0e); max |logit diff| "
              "vs moesq.logits %.3e" % (flag, nll, want, abs(nll - want), NLL_TOL, np.abs(mql - logits).max()))
        ok &= abs(nll - want) <= NLL_TOL
    gen = hf.generate(torch.from_numpy(tokens[:16].astype(np.int64))[None].to(dev), max_new_tokens=8, do_sample=False)
    print("generate:", gen[0, 16:].tolist())
    if moesq.cuda_available():
        eng = moesq.Engine(ckpt)
        gl = np.from_dlpack(eng.logits(tokens))
        print("moesq.Engine (GPU, %s) max |logit diff| vs moesq.logits (CPU) %.3e" % (eng.backend, np.abs(gl - mql).max()))
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    main(*sys.argv[1:4])
