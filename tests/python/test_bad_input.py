"""Bad tensors and arguments raise with a message naming the function, the argument and what was
expected: wrong dtype (TypeError), wrong shape or non-contiguous (ValueError), CUDA memory on the
CPU path (ValueError), a consumed capsule, a non-tensor, out-of-range ids / layers; the producer's
deleter is called exactly once even when the check fails. Library errors arrive as moesq.Error with
the library's message (naming the file)."""
import os
import unittest

from support import KDL_CUDA, KDL_FLOAT, KDL_INT, MODEL, Capsule, bf16_values, moesq, np


class BadInput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.m = moesq.load(MODEL)

    def test_wrong_dtype(self):
        with self.assertRaisesRegex(TypeError, r"Model.logits: argument 'tokens' has dtype int16, expected int32 or int64"):
            self.m.logits(np.zeros(4, dtype=np.int16))
        with self.assertRaisesRegex(TypeError, "argument 'tokens' has dtype float64, expected int32 or int64"):
            self.m.logits(np.zeros(4, dtype=np.float64))
        with self.assertRaisesRegex(TypeError, "argument 'x' has dtype int32, expected float32"):
            self.m.moe_layer(0, np.zeros((2, 256), dtype=np.int32))

    def test_wrong_shape_and_layout(self):
        with self.assertRaisesRegex(ValueError, r"Model.moe_layer: argument 'x' has shape \[2, 255\], expected \[\*, 256\]"):
            self.m.moe_layer(0, np.zeros((2, 255), dtype=np.float32))
        with self.assertRaisesRegex(ValueError, r"argument 'tokens' has shape \[2, 2\], expected \[\*\]"):
            self.m.logits(np.zeros((2, 2), dtype=np.int32))
        x, _ = bf16_values((256, 4), seed=0)
        with self.assertRaisesRegex(ValueError, "is not C-contiguous"):
            self.m.moe_layer(0, x.T)

    def test_cuda_memory_on_the_cpu_path_and_the_deleter_runs_once(self):
        x = np.zeros((2, 256), dtype=np.float32)
        cap = Capsule(x, device_type=KDL_CUDA, code=KDL_FLOAT, bits=32)
        with self.assertRaisesRegex(ValueError, r"argument 'x' is on cuda:0; this op needs CPU \(host\) memory"):
            self.m.moe_layer(0, cap.capsule)
        self.assertEqual(cap.deleted, 1)
        with self.assertRaisesRegex(TypeError, "unused 'dltensor'"):  # consumed capsules cannot be reused
            self.m.moe_layer(0, cap.capsule)
        self.assertEqual(cap.deleted, 1)
        ok = Capsule(np.arange(6, dtype=np.int32), code=KDL_INT, bits=32)
        self.assertEqual(np.from_dlpack(self.m.logits(ok.capsule)).shape, (6, 256))
        self.assertEqual(ok.deleted, 1)

    def test_not_a_tensor_and_out_of_range(self):
        with self.assertRaisesRegex(TypeError, "argument 'tokens' is a list, expected a DLPack tensor"):
            self.m.logits([1, 2, 3])
        with self.assertRaisesRegex(ValueError, r"token id 256 at position 1 outside the vocabulary \[0, 256\)"):
            self.m.logits(np.array([1, 256], dtype=np.int32))
        with self.assertRaisesRegex(IndexError, r"layer 4 outside \[0, 4\)"):
            self.m.moe_input(4, np.zeros((1, 256), dtype=np.float32))
        with self.assertRaisesRegex(ValueError, "stream must be None for a CPU tensor"):
            self.m.embed(np.array([1], dtype=np.int32)).__dlpack__(stream=1)

    def test_library_errors_name_the_file(self):
        with self.assertRaisesRegex(moesq.Error, "/nonexistent/ckpt"):
            moesq.load("/nonexistent/ckpt")
        # An uncompressed checkpoint: said so, naming no tensor it does not have (it named
        # "...gate_proj.weight_packed").
        with self.assertRaisesRegex(moesq.Error, "holds bf16 experts, not paired 4:8 NVFP4") as cm:
            moesq.kernel_weights(MODEL, 0, "gate_proj")
        self.assertNotIn("weight_packed", str(cm.exception))
        with self.assertRaisesRegex(moesq.Error, 'proj "gate" is not one of'):
            moesq.kernel_weights(MODEL, 0, "gate")
        # The build's CUDA fact comes from CMake (MOESQ_BUILT_WITH_CUDA, 1 or 0); a GPU is optional:
        # CI builds with nvcc on machines without one, so cuda_available() may be False either way.
        built = os.environ.get("MOESQ_BUILT_WITH_CUDA")
        if built is not None:
            self.assertEqual(moesq.built_with_cuda(), built == "1")
        if moesq.cuda_available():
            self.assertTrue(moesq.built_with_cuda())
        self.assertEqual(hasattr(moesq, "Engine"), moesq.built_with_cuda())

    def test_returned_arrays_are_writable_and_go_back_in(self):
        logits = self.m.logits(np.arange(6, dtype=np.int32))
        w = np.asarray(logits)  # the buffer protocol: a writable zero-copy view
        self.assertTrue(w.flags.writeable)
        self.assertEqual((w.shape, w.dtype), ((6, 256), np.float32))
        r = np.from_dlpack(logits)  # NumPy < 2: read-only, and its __dlpack__ refuses to export it
        self.assertEqual(r.ctypes.data, w.ctypes.data)
        w[0, 0] += 1.0
        self.assertEqual(r[0, 0], w[0, 0], "both are views of one buffer")
        h = self.m.embed(np.arange(4, dtype=np.int32))
        x_ro = np.from_dlpack(h)
        want = np.from_dlpack(self.m.moe_input(0, np.array(x_ro)))  # a writable copy goes through DLPack
        got = np.from_dlpack(self.m.moe_input(0, x_ro))  # the read-only view: through the buffer protocol
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.from_dlpack(self.m.moe_input(0, np.asarray(h))), want)
        ro_int = np.zeros((2, 256), dtype=np.int32)
        ro_int.flags.writeable = False  # a read-only array of the wrong dtype: still refused by name
        with self.assertRaisesRegex(TypeError, "argument 'x' has dtype int32, expected float32"):
            self.m.moe_layer(0, ro_int)

    def test_compress_expert_with_nan_calibration_rows_names_the_input(self):
        rng = np.random.default_rng(3)
        I, H = 32, 64
        gate, up = (rng.standard_normal((I, H)).astype(np.float32) for _ in range(2))
        down = rng.standard_normal((H, I)).astype(np.float32)
        x = np.full((16, H), np.nan, dtype=np.float32)
        with self.assertRaisesRegex(ValueError, r"moesq.compress_expert: argument 'x' holds a non-finite value \(nan\) "
                                                r"at \[0, 0\] of \[16, 64\]"):
            moesq.compress_expert(gate, up, down, x)
        x = rng.standard_normal((16, H)).astype(np.float32)
        x[5, 7] = np.inf
        with self.assertRaisesRegex(ValueError, r"argument 'x' holds a non-finite value \(inf\) at \[5, 7\]"):
            moesq.compress_expert(gate, up, down, x)
        down[3, 1] = np.nan
        with self.assertRaisesRegex(ValueError, r"argument 'down' holds a non-finite value \(nan\) at \[3, 1\]"):
            moesq.compress_expert(gate, up, down, rng.standard_normal((16, H)).astype(np.float32))


if __name__ == "__main__":
    unittest.main()
