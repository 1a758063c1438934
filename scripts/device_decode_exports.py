#!/usr/bin/env python3
"""Independent numpy + safetensors decoder of moesq's two export layouts (docs/FORMAT.md §8, §9),
compared bit for bit with the weights moesq itself dequantizes (moesq.load(dir).expert_weights).
compressed-tensors nvfp4-pack-quantized: weight_packed U8 [N, K/2] (low nibble = lower k), E2M1 codes;
weight_scale F8_E4M3 [N, K/16]; weight_global_scale F32 γ (divisor): w = e2m1 · e4m3 / γ in fp32.
pair-bitmask: weight_sparse_packed U8 [N, K/4] = the two kept bytes of every 4-byte chunk of the dense
packing, weight_sparse_mask U8 [N, K/16] one nibble per chunk (low nibble = even chunk), bit i = byte
i kept. Usage: device_decode_exports.py MOESQ_DIR CT_DIR PAIR_BITMASK_DIR"""
import glob
import os
import sys

import numpy as np
import torch
from safetensors import safe_open

import moesq

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        v = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        t[c] = -v if s else v
    return t


E4M3 = e4m3_table()


def tensors(d):
    """Routed-expert tensors of a checkpoint as numpy (F8_E4M3 scales as their uint8 codes). Read
    through torch: safetensors' numpy loader has no bfloat16 / float8 (the other tensors)."""
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, framework="pt") as st:
            for k in st.keys():
                if ".mlp.experts." not in k:
                    continue
                t = st.get_tensor(k)
                out[k] = (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).numpy()
    return out


def dense_from_codes(packed, scale_codes, gamma):
    N, half = packed.shape
    codes = np.empty((N, half * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 15
    codes[:, 1::2] = packed >> 4
    s = np.repeat(E4M3[scale_codes.view(np.uint8)], 16, axis=1)
    return (E2M1[codes] * s) / np.float32(gamma)


def unpack_pair_bitmask(sp, mask):
    N, quarter = sp.shape
    K = quarter * 4
    dense = np.zeros((N, K // 2), dtype=np.uint8)
    nib = np.empty((N, K // 8), dtype=np.uint8)
    nib[:, 0::2] = mask & 15
    nib[:, 1::2] = mask >> 4
    kept = sp.reshape(N, K // 8, 2)
    for c in range(K // 8):
        bits = [[i for i in range(4) if (v >> i) & 1] for v in nib[:, c]]
        for n in range(N):
            assert len(bits[n]) == 2, "chunk (%d, %d) mask nibble %x has not exactly two bits" % (n, c, nib[n, c])
            dense[n, c * 4 + bits[n][0]] = kept[n, c, 0]
            dense[n, c * 4 + bits[n][1]] = kept[n, c, 1]
    return dense


def main(moesq_dir, ct_dir, pb_dir):
    ref = moesq.load(moesq_dir)
    ct, pb = tensors(ct_dir), tensors(pb_dir)
    L, E = ref.config["num_layers"], ref.config["num_experts"]
    checked = 0
    for l in range(L):
        for e in range(E):
            want = [np.from_dlpack(t) for t in ref.expert_weights(l, e)]
            for p, proj in enumerate(("gate_proj", "up_proj", "down_proj")):
                pre = "model.layers.%d.mlp.experts.%d.%s." % (l, e, proj)
                g = ct[pre + "weight_global_scale"].reshape(-1)[0]
                a = dense_from_codes(ct[pre + "weight_packed"], ct[pre + "weight_scale"], g)
                dense = unpack_pair_bitmask(pb[pre + "weight_sparse_packed"], pb[pre + "weight_sparse_mask"])
                b = dense_from_codes(dense, pb[pre + "weight_scale"], pb[pre + "weight_global_scale"].reshape(-1)[0])
                for name, got in (("compressed-tensors", a), ("pair-bitmask", b)):
                    if not np.array_equal(got.view(np.uint32), want[p].view(np.uint32)):
                        bad = np.argwhere(got.view(np.uint32) != want[p].view(np.uint32))[0]
                        sys.exit("MISMATCH %s %s at %s: %r vs moesq %r" % (name, pre, bad, got[tuple(bad)], want[p][tuple(bad)]))
                checked += 1
    print("decode_exports: %d projections, both layouts bit-exact vs moesq's dequantized weights" % checked)
    for name, d in (("compressed-tensors", ct_dir), ("pair-bitmask", pb_dir)):
        check_config(name, d)


def check_config(name, d):
    """The exported config.json through transformers' own config classes."""
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(d)
    qc = cfg.quantization_config if isinstance(cfg.quantization_config, dict) else cfg.quantization_config.to_dict()
    assert qc["quant_method"] == "compressed-tensors", (d, qc.get("quant_method"))
    line = "config %s: AutoConfig -> %s, quant_method %s, format %s, %d ignored" % (
        name, type(cfg).__name__, qc["quant_method"], qc.get("format"), len(qc.get("ignore", [])))
    try:  # the library vLLM/llm-compressor use to read quantization_config, when installed
        from compressed_tensors.quantization import QuantizationConfig
        q = QuantizationConfig.model_validate({k: v for k, v in qc.items() if k != "paired48_sparse"})
        line += ", compressed_tensors.QuantizationConfig ok (%s groups)" % len(q.config_groups)
    except ImportError:
        line += ", compressed_tensors package absent (not validated by it)"
    print(line)


if __name__ == "__main__":
    main(*sys.argv[1:4])
