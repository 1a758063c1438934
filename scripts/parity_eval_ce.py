#!/usr/bin/env python3
"""README's parity column "`eval` − reference CE": for each family fixture, write the reference's
input_ids ([B, T] in tiny-F-reference/reference.safetensors) as one int32 .npy per row, run
`moesq eval tiny-F --data ROW.npy... --seq-len T --json --threads 1` (each row one window, so eval's
nats per predicted token is transformers' shifted cross-entropy over B·(T-1) tokens), and print
eval's value, the reference's `ce` (summary.json) and the difference in nats. Pure Python, no numpy.
Usage: parity_eval_ce.py MOESQ_BIN FIXTURES_DIR [FAMILY...]   (FIXTURES_DIR: tests/fixtures/families;
FAMILY default: every tiny-F with a tiny-F-reference beside it)."""
import json, os, struct, subprocess, sys, tempfile


def input_ids(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        m = hdr["input_ids"]
        width = {"I64": 8, "I32": 4}[m["dtype"]]
        begin, end = m["data_offsets"]
        f.seek(8 + n + begin)
        raw = f.read(end - begin)
    B, T = m["shape"]
    vals = [int.from_bytes(raw[i:i + width], "little", signed=True) for i in range(0, len(raw), width)]
    return [vals[b * T:(b + 1) * T] for b in range(B)]


def write_npy(path, row):
    hdr = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % len(row)
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"  # header block padded to a multiple of 64 bytes
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%di" % len(row), *row))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binary, root = sys.argv[1], sys.argv[2]
    fams = sys.argv[3:] or sorted(d[5:-10] for d in os.listdir(root)
                                  if d.startswith("tiny-") and d.endswith("-reference"))
    with tempfile.TemporaryDirectory() as tmp:
        for fam in fams:
            ref_dir = os.path.join(root, "tiny-%s-reference" % fam)
            rows = input_ids(os.path.join(ref_dir, "reference.safetensors"))
            ref_ce = json.load(open(os.path.join(ref_dir, "summary.json")))["ce"]
            files = []
            for b, row in enumerate(rows):
                files.append(os.path.join(tmp, "%s_%d.npy" % (fam, b)))
                write_npy(files[-1], row)
            out = subprocess.run([binary, "eval", os.path.join(root, "tiny-" + fam), "--data", *files,
                                  "--seq-len", str(len(rows[0])), "--json", "--threads", "1"],
                                 check=True, capture_output=True, text=True).stdout
            ce = json.loads(out)["nats_per_token"]
            print("%-12s eval %.9f  reference %.9f  eval - reference %+.2e" % (fam, ce, ref_ce, ce - ref_ce))


if __name__ == "__main__":
    main()
