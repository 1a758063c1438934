#!/usr/bin/env python3
"""Independent decoder of moesq's checkpoint layouts, written from docs/FORMAT.md alone (pure Python,
no numpy/torch): decodes the routed experts of a moesq checkpoint (§7, paired 4:8), its
compressed-tensors export (§8) and its pair-bitmask export (§9), and checks that the three give the
same fp32 bits. Usage: decode_exports.py MOESQ_DIR CT_DIR PAIR_BITMASK_DIR [--layers N]"""
import json, os, struct, sys

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def e4m3(c):
    s, e, m = c >> 7, (c >> 3) & 15, c & 7
    v = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


def f32(x):  # round a Python float to fp32 (a/b of two fp32 values in double, then fp32, is exact)
    return struct.unpack("<f", struct.pack("<f", x))[0]


def load(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        raw = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + n])
        for k, v in hdr.items():
            if k != "__metadata__":
                b, e = v["data_offsets"]
                out[k] = (v["dtype"], v["shape"], raw[8 + n + b:8 + n + e])
    return out


def nibbles(b):
    for x in b:
        yield x & 15
        yield x >> 4


def gscale(t):
    assert t[0] == "F32", t[0]
    return struct.unpack("<f", t[2])[0]


def dense(packed, scale, g):  # §8: [N, K/2] codes, [N, K/G] scales (G = group_size, 16 or 32)
    N, K = packed[1][0], packed[1][1] * 2
    q, s = list(nibbles(packed[2])), scale[2]
    G = K // scale[1][1]
    return [f32(E2M1[q[i]] * e4m3(s[i // G]) / g) for i in range(N * K)]


def moesq48(vals, meta, scale, g):  # §4
    N, K = vals[1][0], vals[1][1] * 4
    kept, m, s = list(nibbles(vals[2])), list(nibbles(meta[2])), scale[2]
    out = [0.0] * (N * K)
    for grp in range(N * K // 8):
        i0, i1 = m[grp] & 3, m[grp] >> 2
        base = grp * 8
        for j, pos in enumerate((2 * i0, 2 * i0 + 1, 2 * i1, 2 * i1 + 1)):
            out[base + pos] = f32(E2M1[kept[grp * 4 + j]] * e4m3(s[base // 32]) / g)
    return out


def pair_bitmask(sp, mask, scale, g):  # §9
    N, K = sp[1][0], sp[1][1] * 4
    m, b = list(nibbles(mask[2])), sp[2]
    full = bytearray(N * K // 2)
    for c in range(N * K // 8):
        idx = [i for i in range(4) if m[c] >> i & 1]
        assert len(idx) == 2, f"chunk {c}: mask {m[c]:x}"
        full[4 * c + idx[0]], full[4 * c + idx[1]] = b[2 * c], b[2 * c + 1]
    return dense(("U8", [N, K // 2], bytes(full)), scale, g)


def main():
    a, b, c = (load(d) for d in sys.argv[1:4])
    layers = int(sys.argv[sys.argv.index("--layers") + 1]) if "--layers" in sys.argv else 10 ** 9
    n = 0
    for k in sorted(a):
        if not k.endswith(".weight_meta") or int(k.split(".")[2]) >= layers:
            continue
        p = k[: -len(".weight_meta")]
        ref = moesq48(a[p + ".weight_packed"], a[k], a[p + ".weight_scale"], gscale(a[p + ".weight_global_scale"]))
        assert b[p + ".weight_packed"][0] == "U8" and b[p + ".weight_scale"][0] == "F8_E4M3"
        ct = dense(b[p + ".weight_packed"], b[p + ".weight_scale"], gscale(b[p + ".weight_global_scale"]))
        pb = pair_bitmask(c[p + ".weight_sparse_packed"], c[p + ".weight_sparse_mask"], c[p + ".weight_scale"],
                          gscale(c[p + ".weight_global_scale"]))
        pack = lambda v: struct.pack(f"<{len(v)}f", *v)
        assert pack(ref) == pack(ct), f"{p}: compressed-tensors decode differs"
        assert pack(ref) == pack(pb), f"{p}: pair-bitmask decode differs"
        n += 1
    print(f"bitwise equal: {n} projections (moesq §7 = compressed-tensors §8 = pair-bitmask §9)")


if __name__ == "__main__":
    main()
