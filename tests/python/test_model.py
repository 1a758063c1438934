"""moesq.load / Model against the CLI: logits give `moesq eval`'s nats/token on the same ids (bf16 and
a compressed W4A4 checkpoint), a compressed-tensors export gives bitwise the same logits, one MoE layer
equals route + experts + combine recomputed in float64 from the model's own weights, and outputs
cross as zero-copy DLPack views."""
import gc
import os
import unittest

from support import MODEL, bf16_values, cli, cli_json, moesq, nll_nats, np, random_tokens, tmpdir

# The CLI reduces the same fp32 logits in fp64 with its own log-sum-exp order.
NLL_RTOL = 1e-9
# fp32 BLAS expert GEMMs (K = 256 / 128) against a float64 recomputation.
MOE_RTOL, MOE_ATOL = 1e-4, 1e-5


class ModelVsCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tmpdir()
        cls.compressed = os.path.join(cls.tmp.name, "mag")
        cli("compress", MODEL, "--method", "magnitude", "--out", cls.compressed, "--calib-samples", "2", "--seq-len", "16")
        cls.ct = os.path.join(cls.tmp.name, "mag_ct")
        cli("export", cls.compressed, "--format", "compressed-tensors", "--out", cls.ct)
        cls.tokens = random_tokens(96, 256, seed=7)
        cls.npy = os.path.join(cls.tmp.name, "tokens.npy")
        np.save(cls.npy, cls.tokens)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check_eval(self, ckpt):
        m = moesq.load(ckpt)
        logits = np.from_dlpack(m.logits(self.tokens))
        self.assertEqual(logits.shape, (96, 256))
        self.assertGreater(np.abs(logits).max(), 0.0)
        want = cli_json("eval", ckpt, "--data", self.npy, "--seq-len", "96")["nats_per_token"]
        got = nll_nats(logits, self.tokens)
        self.assertAlmostEqual(got, want, delta=NLL_RTOL * abs(want), msg=ckpt)
        return m, logits

    def test_bf16_logits_match_cli_eval(self):
        m, _ = self.check_eval(MODEL)
        self.assertFalse(m.act_quant)
        self.assertEqual(m.expert_format, "bf16")

    def test_compressed_logits_match_cli_eval_and_export_is_bitwise_equal(self):
        m, logits = self.check_eval(self.compressed)
        self.assertTrue(m.act_quant)
        self.assertEqual((m.expert_format, m.act_block), ("paired-4:8-nvfp4", 32))
        mct = moesq.load(self.ct)
        self.assertEqual((mct.expert_format, mct.act_block), ("paired-4:8-nvfp4", 32))
        self.assertTrue(np.array_equal(np.from_dlpack(mct.logits(self.tokens)), logits))
        # W4A16 on request: a different (not larger-error-free) result.
        w4a16 = np.from_dlpack(m.logits(self.tokens, act_quant=False))
        self.assertFalse(np.array_equal(w4a16, logits))

    def test_int64_tokens_and_torch_style_producers(self):
        m = moesq.load(MODEL)
        a = np.from_dlpack(m.logits(self.tokens[:20]))
        b = np.from_dlpack(m.logits(self.tokens[:20].astype(np.int64)))
        self.assertTrue(np.array_equal(a, b))

    def test_one_moe_layer_equals_float64_recomputation(self):
        m = moesq.load(MODEL)
        h = m.attention_block(0, m.embed(self.tokens[:40]))
        xt = m.moe_input(0, h)  # a moesq.Tensor goes back in as it is (NumPy's from_dlpack views are read-only)
        x = np.from_dlpack(xt)
        y = np.from_dlpack(m.moe_layer(0, xt, act_quant=False))
        ids, w = (np.from_dlpack(t) for t in m.route(0, xt))
        self.assertEqual(ids.shape, (40, m.config["top_k"]))
        want = np.zeros((40, m.config["hidden_size"]))
        cache = {}
        for r in range(40):
            for j in range(ids.shape[1]):
                e = int(ids[r, j])
                if e not in cache:
                    cache[e] = [np.from_dlpack(t).astype(np.float64) for t in m.expert_weights(0, e)]
                g, u, d = cache[e]
                xr = x[r].astype(np.float64)
                a, b = g @ xr, u @ xr
                want[r] += w[r, j] * (d @ (a / (1.0 + np.exp(-a)) * b))
        self.assertGreater(np.abs(y).max(), 0.0)
        np.testing.assert_allclose(y, want, rtol=MOE_RTOL, atol=MOE_ATOL)

    def test_outputs_are_zero_copy_views_that_outlive_the_tensor(self):
        m = moesq.load(MODEL)
        t = m.embed(self.tokens[:8])
        self.assertEqual((t.shape, t.dtype, t.device), ((8, 256), "float32", "cpu"))
        a, b = np.from_dlpack(t), np.from_dlpack(t)
        self.assertTrue(np.shares_memory(a, b))
        copy = a.copy()
        del t
        gc.collect()
        self.assertTrue(np.array_equal(a, copy))
        # The input side reads the caller's memory: a bf16-exact array round-trips through route().
        x, _ = bf16_values((5, 256), seed=1)
        ids, _ = m.route(0, x)
        self.assertEqual(np.from_dlpack(ids).shape, (5, 4))


if __name__ == "__main__":
    unittest.main()
