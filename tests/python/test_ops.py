"""The expert ops' CPU twins through the module: dispatch_ref → sparse_gemm_ref on a checkpoint's
kernel-layout weights equals W_e · x recomputed in float64 from the dequantized weights (W4A16),
act_quant_ref rows equal dispatch_ref's slots bit for bit, the kernel layout unpacks to the
checkpoint's dequantized weights, and W4A4 stays within the NVFP4 activation error."""
import os
import unittest

from support import KDL_BFLOAT, MODEL, Capsule, bf16_values, cli, moesq, np, tmpdir

# sparse_gemm_ref sums in fp64 and rounds once to fp32 (then × α in fp32): vs a float64 reference.
GEMM_RTOL, GEMM_ATOL = 1e-5, 1e-6
# kernel-layout unpack dec(q)·dec(scale), then / γ in fp32, vs the checkpoint's dequantized fp32.
UNPACK_RTOL = 1e-6
# NVFP4 activations (E2M1 values, 32-blocks): relative Frobenius error of Y, W4A4 vs W4A16.
ACT_QUANT_REL_FRO = 0.2


class Ops(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tmpdir()
        cls.ckpt = os.path.join(cls.tmp.name, "mag")
        cli("compress", MODEL, "--method", "magnitude", "--out", cls.ckpt, "--calib-samples", "2", "--seq-len", "16")
        cls.model = moesq.load(cls.ckpt)
        cls.kw = moesq.kernel_weights(cls.ckpt, 1, "gate_proj")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_kernel_layout_unpacks_to_the_checkpoint_weights(self):
        kw = self.kw
        self.assertEqual((kw.num_experts, kw.M, kw.K, kw.M_pad, kw.K_pad), (32, 128, 256, 128, 256))
        gamma = np.from_dlpack(kw.gamma)
        for e in (0, 5, 31):
            got = np.from_dlpack(kw.unpack_ref(e)) / gamma[e]
            want = np.from_dlpack(self.model.expert_weights(1, e)[0])
            np.testing.assert_allclose(got, want, rtol=UNPACK_RTOL, atol=0)
            self.assertEqual(np.count_nonzero(got), np.count_nonzero(want))

    def run_pipeline(self, T, capacity, quantize, seed):
        x, bits = bf16_values((T, 256), seed=seed)
        rng = np.random.default_rng(seed + 1)
        ids = np.stack([rng.permutation(32)[:4] for _ in range(T)]).astype(np.int32)  # [T, 4] distinct experts
        b = moesq.dispatch_ref(bits, ids, 32, capacity, quantize=quantize)
        counts = np.from_dlpack(b["counts"])
        y = np.from_dlpack(moesq.sparse_gemm_ref(self.kw, b["x"], b["inv_scale"] if quantize else None, b["counts"]))
        return x, ids, counts, np.from_dlpack(b["route_of_slot"]), y, b

    def test_w4a16_grouped_gemm_equals_float64_reference(self):
        for T, capacity in ((1, 4), (3, 4), (37, 8), (64, 2)):  # ragged counts, empty experts, dropped routes
            x, ids, counts, route_of_slot, y, _ = self.run_pipeline(T, capacity, False, seed=T)
            self.assertEqual(y.shape, (32, capacity, 128))
            self.assertEqual(int(counts.sum()), T * 4)
            checked = 0
            for e in range(32):
                W = np.from_dlpack(self.model.expert_weights(1, e)[0]).astype(np.float64)
                for s in range(capacity):
                    if s >= counts[e]:
                        self.assertFalse(y[e, s].any(), "slot past the count must stay 0 (e=%d s=%d)" % (e, s))
                        continue
                    t = route_of_slot[e, s] // 4
                    np.testing.assert_allclose(y[e, s], W @ x[t].astype(np.float64), rtol=GEMM_RTOL, atol=GEMM_ATOL,
                                               err_msg="T=%d e=%d slot=%d" % (T, e, s))
                    checked += 1
            self.assertGreater(checked, 0)

    def test_act_quant_rows_match_dispatch_slots_and_w4a4_error_is_bounded(self):
        x, ids, counts, route_of_slot, y4, b = self.run_pipeline(24, 8, True, seed=3)
        _, bits = bf16_values((24, 256), seed=3)
        rows, inv = (np.from_dlpack(t) for t in moesq.act_quant_ref(bits, True))
        self.assertEqual(rows.shape, (24, 256))
        xb, sb = np.from_dlpack(b["x"]), np.from_dlpack(b["inv_scale"])
        for e in range(32):
            for s in range(min(counts[e], 8)):
                t = route_of_slot[e, s] // 4
                self.assertTrue(np.array_equal(xb[e, s], rows[t]))
                self.assertEqual(sb[e, s], inv[t])
        _, _, _, _, y16, _ = self.run_pipeline(24, 8, False, seed=3)
        self.assertGreater(np.abs(y4).max(), 0.0)
        rel = np.linalg.norm(y4 - y16) / np.linalg.norm(y16)
        self.assertLess(rel, ACT_QUANT_REL_FRO)
        self.assertGreater(rel, 0.0)  # quantization did something

    def test_bfloat16_producer_reads_like_uint16_bits(self):
        # torch.bfloat16 exports DLPack code kDLBfloat/16: the same bits as NumPy's uint16 view.
        _, bits = bf16_values((4, 256), seed=9)
        cap = Capsule(bits, code=KDL_BFLOAT, bits=16)
        a = np.from_dlpack(moesq.act_quant_ref(cap.capsule, True)[0])
        self.assertEqual(cap.deleted, 1)
        b = np.from_dlpack(moesq.act_quant_ref(bits, True)[0])
        self.assertTrue(np.array_equal(a, b))
        self.assertTrue(a.any())


if __name__ == "__main__":
    unittest.main()
