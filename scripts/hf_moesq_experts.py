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
    def __init__(self, model, layer):
        super().__init__()
        self.model, self.layer = model, layer

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1]).float().contiguous().cpu()
        y = torch.from_dlpack(self.model.moe_layer(self.layer, x))
        return y.to(hidden_states.device, hidden_states.dtype).reshape(shape)


def main(hf_dir, ckpt, binary):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hf = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(dev).eval()
    mq = moesq.load(ckpt)
    for l, layer in enumerate(hf.model.layers):
        layer.mlp = MoesqMoe(mq, l)
    tokens = np.random.default_rng(5).integers(0, 256, size=128, dtype=np.int32)
    with torch.no_grad():
        logits = hf(torch.from_numpy(tokens.astype(np.int64))[None].to(dev)).logits[0].float().cpu().numpy()
    z = logits[:-1].astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    nll = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(127), tokens[1:]]))
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "t.npy"), tokens)
        out = subprocess.run([binary, "eval", ckpt, "--data", os.path.join(d, "t.npy"), "--seq-len", "128", "--json"],
                             check=True, capture_output=True, text=True).stdout
    want = json.loads(out)["nats_per_token"]
    mql = np.from_dlpack(mq.logits(tokens))
    print("hf+moesq experts nll %.6f, moesq eval %.6f, |diff| %.2e (tol %.0e); max |logit diff| vs moesq.logits %.3e"
          % (nll, want, abs(nll - want), NLL_TOL, np.abs(mql - logits).max()))
    assert abs(nll - want) <= NLL_TOL
    gen = hf.generate(torch.from_numpy(tokens[:16].astype(np.int64))[None].to(dev), max_new_tokens=8, do_sample=False)
    print("generate:", gen[0, 16:].tolist())
    if moesq.cuda_available():
        eng = moesq.Engine(ckpt)
        gl = np.from_dlpack(eng.logits(tokens))
        print("moesq.Engine (GPU, %s) max |logit diff| vs moesq.logits (CPU) %.3e" % (eng.backend, np.abs(gl - mql).max()))


if __name__ == "__main__":
    main(*sys.argv[1:4])
