"""moesq.compress_expert (SGPTQ on the CPU) reproduces `moesq compress --method sgptq` bit for bit on
layer-0 experts: the calibration rows are rebuilt in Python from the same token windows (embed →
attention → MoE input → route), and the dequantized weights must equal the CLI checkpoint's."""
import os
import unittest

from support import MODEL, cli, moesq, np, random_tokens, tmpdir

SEQS, SEQ_LEN = 4, 64


class CompressExpert(unittest.TestCase):
    def test_sgptq_expert_equals_cli_compress(self):
        with tmpdir() as d:
            tokens = random_tokens(SEQS * SEQ_LEN, 256, seed=11)
            np.save(os.path.join(d, "calib.npy"), tokens)
            out = os.path.join(d, "sgptq")
            cli("compress", MODEL, "--method", "sgptq", "--out", out, "--calib", os.path.join(d, "calib.npy"),
                "--calib-samples", str(SEQS), "--seq-len", str(SEQ_LEN), "--threads", "1")
            ref, comp = moesq.load(MODEL), moesq.load(out)
            X = np.concatenate([np.from_dlpack(ref.moe_input(0, ref.attention_block(0, ref.embed(
                tokens[s * SEQ_LEN:(s + 1) * SEQ_LEN])))) for s in range(SEQS)])
            ids = np.from_dlpack(ref.route(0, X)[0])
            compared = 0
            for e in range(32):
                rows = np.nonzero((ids == e).any(axis=1))[0]  # route order: rows ascending
                if len(rows) < 8:
                    continue
                g, u, dn = ref.expert_weights(0, e)  # moesq.Tensors, passed straight back in
                r = moesq.compress_expert(g, u, dn, np.ascontiguousarray(X[rows]), method="sgptq", layer=0, expert=e)
                self.assertEqual(r["format"], "paired-4:8-nvfp4")
                self.assertFalse(r["fallback"])
                want = [np.from_dlpack(t) for t in comp.expert_weights(0, e)]
                for name, w in zip(("gate", "up", "down"), want):
                    got = np.from_dlpack(r[name])
                    self.assertTrue(np.array_equal(got, w), "expert %d %s differs from the CLI's" % (e, name))
                    self.assertGreater(np.count_nonzero(got), 0)
                self.assertEqual(r["gate_global_scale"], r["up_global_scale"])  # shared γ of gate|up
                compared += 1
                if compared == 4:
                    break
            self.assertEqual(compared, 4)

    def test_methods_and_bad_method(self):
        ref = moesq.load(MODEL)
        g, u, dn = ref.expert_weights(2, 3)
        x = np.random.default_rng(0).standard_normal((50, 256)).astype(np.float32)
        self.assertEqual(moesq.compress_expert(g, u, dn, x, method="rtn-nvfp4")["format"], "nvfp4")
        mag = moesq.compress_expert(g, u, dn, x, method="magnitude")
        gate = np.from_dlpack(mag["gate"]).reshape(128, 32, 8)
        self.assertTrue((np.count_nonzero(gate, axis=2) <= 4).all())  # paired 4:8: ≤ 4 of 8 kept
        with self.assertRaisesRegex(moesq.Error, "--method"):
            moesq.compress_expert(g, u, dn, x, method="bogus")
        with self.assertRaisesRegex(ValueError, "argument 'down' has shape \\[128, 256\\], expected \\[256, 128\\]"):
            moesq.compress_expert(g, u, g, x)


if __name__ == "__main__":
    unittest.main()
