"""The GPU ops' argument checks (python/gpu_ops.cpp, compiled in every build), on the CPU: hand-made
kDLCUDA capsules over host memory are refused by name — wrong dtype (TypeError), shape, K, device,
alignment, stream, layout, M, max_tokens, out, accumulate (ValueError) — before anything touches CUDA,
and each producer's deleter runs exactly once. With every check passed and no GPU, the call fails with
moesq.Error saying why (no CUDA in the build, or no visible device). Also the CPU-side pieces the GPU
path uses: moesq.MoeLayer's host load, KernelWeights.packed / inv_gamma, act_quant_ref on fp32 rows.
tests/python/gpu/test_gpu_ops.py runs the ops themselves on a GPU."""
import os
import unittest

from support import (KDL_BFLOAT, KDL_CPU, KDL_CUDA, KDL_FLOAT, KDL_INT, KDL_UINT, MODEL, Capsule, bf16_values, cli,
                     moesq, np, tmpdir)


def cuda_bf16(shape, device_id=0):
    return Capsule(np.zeros(shape, np.uint16), device_type=KDL_CUDA, code=KDL_BFLOAT, bits=16, device_id=device_id)


def cuda_of(array, code, bits, device_id=0):
    return Capsule(array, device_type=KDL_CUDA, code=code, bits=bits, device_id=device_id)


def cuda_i32(shape, device_id=0):
    return cuda_of(np.zeros(shape, np.int32), KDL_INT, 32, device_id)


def cuda_f32(shape):
    return cuda_of(np.zeros(shape, np.float32), KDL_FLOAT, 32)


def cuda_u8(shape):
    return cuda_of(np.zeros(shape, np.uint8), KDL_UINT, 8)


# What a call that passed every argument check says on this machine.
if not moesq.built_with_cuda():
    NO_GPU = "this moesq module was built without CUDA"
else:
    NO_GPU = "no CUDA device is visible"


class GpuArgs(unittest.TestCase):
    def refuse(self, exc, pattern, fn, *caps, **kw):
        with self.assertRaisesRegex(exc, pattern):
            fn(*[c.capsule if isinstance(c, Capsule) else c for c in caps],
               **{k: (v.capsule if isinstance(v, Capsule) else v) for k, v in kw.items()})
        for c in list(caps) + list(kw.values()):
            if isinstance(c, Capsule) and c.deleted:  # consumed: exactly once
                self.assertEqual(c.deleted, 1)

    def test_act_quant_refusals(self):
        self.refuse(TypeError, r"moesq.act_quant: argument 'x' has dtype int32, expected bfloat16 or uint16",
                    moesq.act_quant, cuda_i32((4, 64)))
        self.refuse(ValueError, r"argument 'x' has shape \[4\], expected \[\*, \*\]", moesq.act_quant, cuda_bf16((4,)))
        self.refuse(ValueError, "argument 'x' has K=48 columns; NVFP4 activations need a positive multiple of 32",
                    moesq.act_quant, cuda_bf16((4, 48)))
        host = Capsule(np.zeros((4, 64), np.uint16), device_type=KDL_CPU, code=KDL_BFLOAT, bits=16)
        self.refuse(ValueError, "argument 'x' is on cpu; this op needs CUDA memory", moesq.act_quant, host)
        self.assertEqual(host.deleted, 1)
        self.refuse(ValueError, r"argument 'x_lo' has shape \[4, 32\], expected \[4, 64\]", moesq.act_quant,
                    cuda_bf16((4, 64)), x_lo=cuda_bf16((4, 32)))
        self.refuse(ValueError, r"argument 'x_lo' is on cuda:1 but 'x' is on cuda:0", moesq.act_quant,
                    cuda_bf16((4, 64)), x_lo=cuda_bf16((4, 64), device_id=1))
        self.refuse(ValueError, r"argument 'x_lo' is only read by the NVFP4 quantizer \(quantize=True\)",
                    moesq.act_quant, cuda_bf16((4, 64)), x_lo=cuda_bf16((4, 64)), quantize=False)
        self.refuse(ValueError, "argument 'layout' is \"row\", not one of mma-fragment, k-major", moesq.act_quant,
                    cuda_bf16((4, 64)), layout="row")
        self.refuse(TypeError, "argument 'stream' is a str, expected a CUDA stream handle", moesq.act_quant,
                    cuda_bf16((4, 64)), stream="s")
        self.refuse(TypeError, "argument 'stream' is a bool", moesq.act_quant, cuda_bf16((4, 64)), stream=True)
        self.refuse(ValueError, "argument 'stream' is -3; a stream handle is >= 0", moesq.act_quant,
                    cuda_bf16((4, 64)), stream=-3)
        with self.assertRaisesRegex(TypeError, "argument 'x' is a list, expected a DLPack tensor"):
            moesq.act_quant([[0.0] * 64])

    def test_misaligned_view_is_refused(self):
        big = np.zeros(4 * 64 + 8, np.uint16)
        self.assertEqual(big.ctypes.data % 16, 0)
        view = big[1:1 + 4 * 64].reshape(4, 64)  # contiguous, 2 bytes past an aligned start
        cap = cuda_of(view, KDL_BFLOAT, 16)
        self.refuse(ValueError, r"argument 'x' starts at 0x[0-9a-f]+, not 16-byte aligned", moesq.act_quant, cap)
        self.assertEqual(cap.deleted, 1)

    def test_dispatch_refusals(self):
        x = lambda: cuda_bf16((5, 64))  # noqa: E731
        self.refuse(ValueError, r"moesq.dispatch: argument 'num_experts' is 0, outside \[1, 65536\]", moesq.dispatch,
                    x(), cuda_i32((5, 2)), 0, 4)
        self.refuse(ValueError, r"argument 'capacity' is -1, outside", moesq.dispatch, x(), cuda_i32((5, 2)), 8, -1)
        ids64 = cuda_of(np.zeros((5, 2), np.int64), KDL_INT, 64)
        self.refuse(TypeError, "argument 'topk_ids' has dtype int64, expected int32", moesq.dispatch, x(), ids64, 8, 4)
        self.refuse(ValueError, r"argument 'topk_ids' has shape \[4, 2\], expected \[5, \*\]", moesq.dispatch, x(),
                    cuda_i32((4, 2)), 8, 4)
        self.refuse(ValueError, "argument 'topk_ids' has top_k=0 columns", moesq.dispatch, x(), cuda_i32((5, 0)), 8, 4)
        self.refuse(ValueError, "argument 'topk_ids' is on cuda:1 but 'x' is on cuda:0", moesq.dispatch, x(),
                    cuda_i32((5, 2), device_id=1), 8, 4)

    def test_sparse_gemm_refusals(self):
        E, cap, K_pad, MT = 4, 3, 256, 8  # M_pad = 128

        def call(**over):
            args = dict(x=cuda_bf16((E, cap, K_pad)), counts=cuda_i32((E,)), w=cuda_u8((E, MT, K_pad // 256, 1408)),
                        w_inv_gamma=cuda_f32((E,)), M=128)
            args.update(over)
            return args

        g = moesq.sparse_gemm
        self.refuse(ValueError, r"moesq.sparse_gemm: argument 'x' has K_pad=128 columns; the kernel layout needs a "
                    "positive multiple of 256", g, **call(x=cuda_bf16((E, cap, 128))))
        self.refuse(ValueError, r"argument 'x' has E=1025 experts, outside \[1, 1024\]", g, **call(x=cuda_bf16((1025, 1, 256))))
        self.refuse(ValueError, r"argument 'counts' has shape \[3\], expected \[4\]", g, **call(counts=cuda_i32((3,))))
        self.refuse(ValueError, r"argument 'w' has shape \[4, 8, 2, 1408\], expected \[4, \*, 1, 1408\]", g,
                    **call(w=cuda_u8((E, MT, 2, 1408))))
        self.refuse(TypeError, "argument 'w' has dtype int32, expected uint8", g, **call(w=cuda_i32((E, MT, 1, 1408))))
        self.refuse(ValueError, r"argument 'M' is 112 but w holds M_pad=128 rows \(M rounded up to 16\): M must be in "
                    r"\(112, 128\]", g, **call(M=112))
        self.refuse(ValueError, "argument 'M' is 129", g, **call(M=129))
        self.refuse(ValueError, r"argument 'x_inv_scale' has shape \[4, 2\], expected \[4, 3\]", g,
                    **call(x_inv_scale=cuda_f32((E, 2))))
        self.refuse(ValueError, r"argument 'max_tokens' is 4, outside \[0, 3\]", g, **call(max_tokens=4))
        self.refuse(ValueError, "argument 'out_dtype' is float16, not one of float32, bfloat16", g,
                    **call(out_dtype="float16"))
        self.refuse(ValueError, r"argument 'out' has shape \[4, 3, 127\], expected \[4, 3, 128\]", g,
                    **call(out=cuda_f32((E, cap, 127))))
        self.refuse(ValueError, "argument 'out_dtype' is bfloat16 but out is float32", g,
                    **call(out=cuda_f32((E, cap, 128)), out_dtype="bfloat16"))
        self.refuse(ValueError, "argument 'w_inv_gamma' is on cpu", g,
                    **call(w_inv_gamma=np.ones(E, np.float32)))
        # Every check passed: only the missing GPU stops it, with every capsule released once.
        args = call(x_inv_scale=cuda_f32((E, cap)), out=cuda_f32((E, cap, 128)))
        if not moesq.cuda_available():
            self.refuse(moesq.Error, "moesq.sparse_gemm: " + NO_GPU, g, **args)
            for k, c in args.items():
                if isinstance(c, Capsule):
                    self.assertEqual(c.deleted, 1, k)

    def test_valid_calls_without_a_gpu_say_why(self):
        if moesq.cuda_available():
            self.skipTest("a GPU is visible: tests/python/gpu/test_gpu_ops.py covers the launches")
        for fn, args in ((moesq.act_quant, (cuda_bf16((4, 64)),)),
                         (moesq.dispatch, (cuda_bf16((4, 64)), cuda_i32((4, 2)), 8, 4))):
            caps = [a for a in args if isinstance(a, Capsule)]
            with self.assertRaisesRegex(moesq.Error, NO_GPU):
                fn(*[a.capsule if isinstance(a, Capsule) else a for a in args])
            self.assertEqual([c.deleted for c in caps], [1] * len(caps))
        with self.assertRaisesRegex(moesq.Error, "moesq.sparse_gemm_config: " + NO_GPU):
            moesq.sparse_gemm_config(32, 128, 256, 4)

    def test_moe_layer_host_load_and_refusals(self):
        L = moesq.MoeLayer(MODEL, 1)
        self.assertEqual((L.layer, L.hidden_size, L.num_experts, L.top_k), (1, 256, 32, 4))
        self.assertEqual((L.backend, L.expert_format, L.act_quant, L.device, L.weight_bytes),
                         ("bf16", "bf16", False, None, 0))
        self.assertIn("moesq.MoeLayer(dir=", repr(L))
        with self.assertRaisesRegex(moesq.Error, r"layer 4 outside \[0, 4\)"):
            moesq.MoeLayer(MODEL, 4)
        with self.assertRaisesRegex(moesq.Error, "needs a paired-4:8-nvfp4 checkpoint"):
            moesq.MoeLayer(MODEL, 0, experts="sparse-w4a4")
        with self.assertRaisesRegex(moesq.Error, '"marlin" is not one of'):
            moesq.MoeLayer(MODEL, 0, experts="marlin")
        self.refuse(ValueError, r"MoeLayer.forward: argument 'x' has shape \[2, 128\], expected \[\*, 256\]",
                    L.forward, cuda_bf16((2, 128)))
        self.refuse(TypeError, "argument 'x' has dtype float32, expected bfloat16 or uint16", L.forward,
                    cuda_f32((2, 256)))
        self.refuse(ValueError, r"argument 'x_lo' has shape \[3, 256\], expected \[2, 256\]", L.forward,
                    cuda_bf16((2, 256)), x_lo=cuda_bf16((3, 256)))
        self.refuse(TypeError, "argument 'out' has dtype bfloat16, expected float32", L.forward, cuda_bf16((2, 256)),
                    out=cuda_bf16((2, 256)))
        self.refuse(ValueError, "argument 'accumulate' is True but no out tensor is given", L.forward,
                    cuda_bf16((2, 256)), accumulate=True)
        self.refuse(ValueError, "argument 'x' is on cpu; this op needs CUDA memory", L, np.zeros((2, 256), np.uint16))
        with self.assertRaisesRegex(ValueError, "MoeLayer.to: argument 'device' is -1"):
            L.to(-1)
        self.assertIsNone(L.device)  # nothing was uploaded by a refused call
        if not moesq.cuda_available():
            self.refuse(moesq.Error, "MoeLayer: " + NO_GPU, L.forward, cuda_bf16((2, 256)))
            self.assertIsNone(L.device)


class CpuPiecesOfTheGpuPath(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tmpdir()
        cls.ckpt = os.path.join(cls.tmp.name, "mag")
        cli("compress", MODEL, "--method", "magnitude", "--out", cls.ckpt, "--calib-samples", "2", "--seq-len", "16")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_kernel_weights_export_packed_bytes_and_inverse_scales(self):
        kw = moesq.kernel_weights(self.ckpt, 1, "down_proj")
        packed = np.from_dlpack(kw.packed)
        self.assertEqual(packed.shape, (32, kw.M_pad // 16, kw.K_pad // 256, 1408))
        self.assertEqual(packed.dtype, np.uint8)
        self.assertTrue(packed.any())
        gamma = np.from_dlpack(kw.gamma)
        np.testing.assert_array_equal(np.from_dlpack(kw.inv_gamma), (np.float32(1) / gamma).astype(np.float32))
        self.assertFalse(np.array_equal(packed[3], packed[4]))  # experts differ; the GPU test runs these bytes

    def test_moe_layer_reads_a_paired_checkpoint_as_w4a4(self):
        L = moesq.MoeLayer(self.ckpt, 2)
        self.assertEqual((L.backend, L.expert_format, L.act_quant), ("sparse-w4a4", "paired-4:8-nvfp4", True))
        self.assertEqual(moesq.MoeLayer(self.ckpt, 2, experts="sparse-w4a16").act_quant, False)
        self.assertEqual(moesq.MoeLayer(self.ckpt, 2, experts="bf16").backend, "bf16")

    def test_act_quant_ref_on_fp32_rows(self):
        x, bits = bf16_values((6, 96), seed=5)
        a = np.from_dlpack(moesq.act_quant_ref(bits)[0])
        b = np.from_dlpack(moesq.act_quant_ref(x)[0])  # exact bf16 values as fp32: the same codes and scales
        np.testing.assert_array_equal(a, b)
        self.assertTrue(a.any())
        lo = (x * np.float32(1.0 / 300)).astype(np.float32)  # rows that are not bf16: other codes somewhere
        c = np.from_dlpack(moesq.act_quant_ref(x + lo)[0])
        self.assertFalse(np.array_equal(a, c))
        with self.assertRaisesRegex(ValueError, "argument 'x' is float32; quantize=False"):
            moesq.act_quant_ref(x, False)


if __name__ == "__main__":
    unittest.main()
