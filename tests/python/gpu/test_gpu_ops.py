"""The Python module's GPU ops with PyTorch on a GPU, against their CPU twins on the same bits:
act_quant vs act_quant_ref (bitwise), dispatch vs dispatch_ref rows per route (bitwise), sparse_gemm vs
sparse_gemm_ref (named tolerance: only the fp32 summation order differs), MoeLayer vs the CPU model's
moe_layer (named tolerances per backend) and against itself (bitwise: token order, batch composition,
accumulate). Then the DLPack contract: inputs taken on the caller's stream (a tensor written on a busy
non-default stream is read after the write), outputs made visible on the consumer's stream (events
order them), nothing synchronizes the host, outputs are zero-copy views whose memory the last view
frees, out= tensors are written in place; and refusals on the GPU (host memory claimed as CUDA,
non-contiguous and misaligned views) leave the CUDA context healthy.

Needs PyTorch with CUDA and the CUDA-built module on PYTHONPATH (with tests/python for support.py);
MOESQ_BINARY (the CLI, for a compressed fixture) and MOESQ_DEFAULT_MODEL as CTest sets them.
scripts/device_python_gpu.sh runs it on the device. Measured errors are printed as "[measured] ..." lines.
"""
import gc
import os
import sys
import time
import unittest

try:
    import torch
except ImportError as e:  # a GPU test must fail, not skip, where it cannot run
    raise SystemExit("tests/python/gpu/test_gpu_ops.py needs PyTorch: %s" % e)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from support import KDL_BFLOAT, KDL_CUDA, MODEL, Capsule, cli, moesq, np, tmpdir  # noqa: E402

if not torch.cuda.is_available():
    raise SystemExit("tests/python/gpu/test_gpu_ops.py needs a CUDA GPU (torch.cuda.is_available() is False)")
if not moesq.cuda_available():
    raise SystemExit("the moesq module on PYTHONPATH has no GPU path (built_with_cuda=%s)" % moesq.built_with_cuda())

DEV = torch.device("cuda", 0)
LAYOUTS = ("mma-fragment", "k-major")

# ---- tolerances (STYLE.md §4) -------------------------------------------------------------------
# sparse_gemm vs sparse_gemm_ref on the same packed bits and activation bits: fp32 tensor-core
# accumulation vs the twin's fp64 sum rounded once (tests/gpu/test_sparse_gemm.cu uses the same bound).
GEMM_REL_FRO = 1e-5
GEMM_MAX_ABS_REL = 1e-4  # max |gpu − ref| / max |ref| of the whole output
# bfloat16 output: one round-to-nearest of the fp32 value to 8 significant bits (relative ≤ 2^-8), ×2 margin.
GEMM_BF16_ELEM_REL = 2.0 ** -7
# MoeLayer (GPU, engine arithmetic) vs Model.moe_layer (CPU forward) on the same fp32 input x + x_lo.
# Estimates, not measurements: bf16 and W4A16 round the expert input x to bf16 (only W4A4 quantizes the
# fp32 row), the SwiGLU output and every expert output (3 roundings of relative ≤ 2^-9); W4A4 rounds the
# expert outputs only, plus rare E2M1 code flips where the fp32 summation order moves a value across a
# rounding boundary. The run prints the measured values.
MOE_REL_FRO = {"bf16": 1e-2, "sparse-w4a16": 1e-2, "sparse-w4a4": 2e-2}
# W4A4 must be the SAME quantized computation as the CPU's, not merely close to the unquantized one: its
# distance to CPU W4A4 is at most this fraction of the distance between CPU W4A4 and CPU W4A16.
W4A4_VS_QUANT_EFFECT = 0.5
ROUTER_W_ATOL = 1e-5  # combine weights: fp32 logits in another summation order, expf vs exp
SLEEP_CYCLES = int(4e8)  # torch.cuda._sleep: ~0.2 s at the H200's ~2 GHz, long enough to race anything


def report(name, **vals):
    print("[measured] %s %s" % (name, " ".join("%s=%.3e" % kv for kv in vals.items())), file=sys.stderr)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(shape, seed, scale=1.0):
    return torch.randn(shape, generator=gen(seed)) * scale


def bits(t):
    """bf16 tensor (any device) → its bits as a numpy uint16 array."""
    return t.detach().contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def host(t):
    """A moesq.Tensor or torch tensor → a CPU torch tensor (a copy; for the CPU twins)."""
    return (torch.from_dlpack(t) if isinstance(t, moesq.Tensor) else t).cpu()


def rel_fro(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def split_hi_lo(x32):
    """fp32 rows → bf16 hi + lo with hi + lo ≈ x32 to ~16 significant bits (the engine's rmsnorm output)."""
    hi = x32.bfloat16()
    lo = (x32 - hi.float()).bfloat16()
    return hi, lo


def distinct_ids(T, E, k, seed):
    g = gen(seed)
    return torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).int()


def busy(stream):
    """Enqueues a long kernel on `stream` (everything after it on that stream waits)."""
    with torch.cuda.stream(stream):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(SLEEP_CYCLES)
        else:  # pragma: no cover - older/newer torch without the test helper
            a = torch.randn(4096, 4096, device=DEV)
            for _ in range(40):
                a = torch.tanh(a @ a)


class Fixture:
    """A paired 4:8 (magnitude) compression of the tiny model, shared by the tests."""
    tmp = None
    ckpt = None

    @classmethod
    def get(cls):
        if cls.ckpt is None:
            cls.tmp = tmpdir()
            cls.ckpt = os.path.join(cls.tmp.name, "mag")
            cli("compress", MODEL, "--method", "magnitude", "--out", cls.ckpt, "--calib-samples", "4",
                "--seq-len", "32")
        return cls.ckpt


class ActQuant(unittest.TestCase):
    def test_matches_ref_bitwise(self):
        worst = 0
        for layout in LAYOUTS:
            for quantize in (True, False):
                for T, K in ((1, 64), (3, 288), (37, 2048)):
                    x = randn((T, K), seed=T * K, scale=1.5).bfloat16()
                    if T > 1:
                        x[1] = 0  # a zero token: γ = 1, all codes 0
                    rows, inv = moesq.act_quant(x.to(DEV), quantize=quantize, layout=layout)
                    want_rows, want_inv = moesq.act_quant_ref(x, quantize, layout)
                    K_pad = (K + 255) // 256 * 256
                    got = torch.from_dlpack(rows)
                    self.assertEqual((got.dtype, tuple(got.shape), got.device), (torch.bfloat16, (T, K_pad), DEV))
                    g, w = bits(got), np.from_dlpack(want_rows)
                    bad = np.argwhere(g != w)
                    self.assertEqual(len(bad), 0, "layout=%s quantize=%s T=%d K=%d first bad (row, storage index) %s"
                                     % (layout, quantize, T, K, bad[:1].tolist()))
                    np.testing.assert_array_equal(torch.from_dlpack(inv).cpu().numpy(), np.from_dlpack(want_inv))
                    self.assertTrue((g & 0x7FFF).any())
                    worst = max(worst, len(bad))
        report("act_quant_vs_ref", mismatched_elements=worst)

    def test_fp32_rows_through_x_lo_match_ref_bitwise(self):
        for layout in LAYOUTS:
            x32 = randn((29, 512), seed=7, scale=2.0)
            hi, lo = split_hi_lo(x32)
            rows, inv = moesq.act_quant(hi.to(DEV), x_lo=lo.to(DEV), layout=layout)
            want_rows, want_inv = moesq.act_quant_ref((hi.float() + lo.float()).numpy(), True, layout)
            np.testing.assert_array_equal(bits(torch.from_dlpack(rows)), np.from_dlpack(want_rows))
            np.testing.assert_array_equal(torch.from_dlpack(inv).cpu().numpy(), np.from_dlpack(want_inv))
            hi_only = bits(torch.from_dlpack(moesq.act_quant(hi.to(DEV), layout=layout)[0]))
            self.assertFalse(np.array_equal(hi_only, np.from_dlpack(want_rows)), "x_lo changed no code: not read?")

    def test_empty_batch(self):
        rows, inv = moesq.act_quant(torch.zeros((0, 64), dtype=torch.bfloat16, device=DEV))
        self.assertEqual((tuple(torch.from_dlpack(rows).shape), tuple(torch.from_dlpack(inv).shape)), ((0, 256), (0,)))


class Dispatch(unittest.TestCase):
    def test_matches_ref_rows_per_route(self):
        T, K, k, E, cap = 41, 288, 4, 16, 12
        for layout in LAYOUTS:
            for quantize in (True, False):
                for with_lo in ((False, True) if quantize else (False,)):
                    x32 = randn((T, K), seed=11, scale=1.5)
                    hi, lo = split_hi_lo(x32)
                    ids = torch.randint(0, E, (T, k), generator=gen(12)).int()
                    ids[:16, 0] = 7  # crowd expert 7 past its capacity: dropped routes
                    d = moesq.dispatch(hi.to(DEV), ids.to(DEV), E, cap, x_lo=lo.to(DEV) if with_lo else None,
                                       quantize=quantize, layout=layout)
                    ref = moesq.dispatch_ref(hi, ids, E, cap, quantize, layout)
                    rows_src = (hi.float() + lo.float()).numpy() if with_lo else hi
                    want_rows, want_inv = (np.from_dlpack(t) for t in moesq.act_quant_ref(rows_src, quantize, layout))
                    xs, inv = bits(torch.from_dlpack(d["x"])), torch.from_dlpack(d["inv_scale"]).cpu().numpy()
                    counts = torch.from_dlpack(d["counts"]).cpu().numpy()
                    ros = torch.from_dlpack(d["route_of_slot"]).cpu().numpy()
                    self.assertEqual(xs.shape, (E, cap, 512))
                    np.testing.assert_array_equal(counts, np.from_dlpack(ref["counts"]))
                    self.assertGreater(counts[7], cap, "the test must exercise dropped routes")
                    ids_np = ids.numpy().reshape(-1)
                    for e in range(E):
                        n = min(counts[e], cap)
                        routes = ros[e, :n]
                        self.assertEqual(len(set(routes.tolist())), n, "expert %d holds a route twice" % e)
                        for s in range(cap):
                            what = "layout=%s quantize=%s x_lo=%s expert %d slot %d" % (layout, quantize, with_lo, e, s)
                            if s >= n:
                                self.assertEqual(ros[e, s], -1, what)
                                self.assertFalse(xs[e, s].any(), what)
                                self.assertEqual(inv[e, s], 0.0, what)
                                continue
                            r = ros[e, s]
                            self.assertEqual(ids_np[r], e, what)
                            np.testing.assert_array_equal(xs[e, s], want_rows[r // k], err_msg=what)
                            self.assertEqual(inv[e, s], want_inv[r // k], what)


class SparseGemm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ckpt = Fixture.get()
        cls.kw = {p: moesq.kernel_weights(ckpt, 1, p) for p in ("gate_proj", "down_proj")}
        cls.w = {p: (torch.from_dlpack(kw.packed).to(DEV), torch.from_dlpack(kw.inv_gamma).to(DEV))
                 for p, kw in cls.kw.items()}

    def run_case(self, proj, T, cap, layout, quantize, seed, **kw_args):
        kw = self.kw[proj]
        w, g = self.w[proj]
        x = randn((T, kw.K), seed=seed).bfloat16()
        ids = distinct_ids(T, kw.num_experts, 4, seed + 1)
        d = moesq.dispatch(x.to(DEV), ids.to(DEV), kw.num_experts, cap, quantize=quantize, layout=layout)
        y = moesq.sparse_gemm(d["x"], d["counts"], w, g, kw.M, x_inv_scale=d["inv_scale"] if quantize else None,
                              layout=layout, **kw_args)
        return kw, d, y

    def ref(self, kw, d, quantize, layout):
        return np.from_dlpack(moesq.sparse_gemm_ref(kw, host(d["x"]), host(d["inv_scale"]) if quantize else None,
                                                    host(d["counts"]), layout))

    def test_matches_ref(self):
        cases = [("gate_proj", 1, 4, "mma-fragment", True), ("gate_proj", 37, 8, "mma-fragment", True),
                 ("down_proj", 37, 8, "k-major", False), ("down_proj", 24, 12, "mma-fragment", False),
                 ("down_proj", 3, 4, "k-major", True),  # k-major at few tokens: the wgmma 128×128 fallback
                 ("gate_proj", 200, 160, None, True),  # the heuristic's own kernel (wgmma at ≥ 128 tokens)
                 ("gate_proj", 200, 160, "mma-fragment", False)]  # mma-fragment where the heuristic picks wgmma
        for i, (proj, T, cap, layout, quantize) in enumerate(cases):
            kw = self.kw[proj]
            if layout is None:
                cfg = moesq.sparse_gemm_config(kw.num_experts, kw.M, kw.K_pad, cap)
                layout = cfg["layout"]
                self.assertEqual(layout, "k-major", cfg)
            kw, d, y = self.run_case(proj, T, cap, layout, quantize, seed=100 + i)
            got = torch.from_dlpack(y)
            self.assertEqual((got.dtype, tuple(got.shape)), (torch.float32, (kw.num_experts, cap, kw.M)))
            got = got.cpu().numpy()
            want = self.ref(kw, d, quantize, layout)
            rf = rel_fro(got, want)
            mx = float(np.abs(got - want).max() / np.abs(want).max())
            report("sparse_gemm_vs_ref", case=i, rel_fro=rf, max_abs_rel=mx)
            what = "%s T=%d cap=%d %s %s" % (proj, T, cap, layout, "W4A4" if quantize else "W4A16")
            self.assertLessEqual(rf, GEMM_REL_FRO, what)
            self.assertLessEqual(mx, GEMM_MAX_ABS_REL, what)
            self.assertGreater(np.abs(want).max(), 0.0, what)
            counts = np.minimum(torch.from_dlpack(d["counts"]).cpu().numpy(), cap)
            for e in range(kw.num_experts):
                self.assertFalse(got[e, counts[e]:].any(), "%s: slots past the count of expert %d not 0" % (what, e))

    def test_out_in_place_bf16_and_determinism(self):
        kw, d, y = self.run_case("gate_proj", 37, 8, "mma-fragment", True, seed=7)
        w, g = self.w["gate_proj"]
        y1 = torch.from_dlpack(y)
        out = torch.full((kw.num_experts, 8, kw.M), float("nan"), device=DEV)
        r = moesq.sparse_gemm(d["x"], d["counts"], w, g, kw.M, x_inv_scale=d["inv_scale"], out=out)
        self.assertIs(r, out)  # written in place: the DLPack import of out is the caller's memory
        counts = np.minimum(torch.from_dlpack(d["counts"]).cpu().numpy(), 8)
        o, want = out.cpu().numpy(), y1.cpu().numpy()
        for e in range(kw.num_experts):
            np.testing.assert_array_equal(o[e, :counts[e]], want[e, :counts[e]])
            self.assertTrue(np.isnan(o[e, counts[e]:]).all(), "slots past the count must stay untouched")
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            y2 = torch.from_dlpack(moesq.sparse_gemm(d["x"], d["counts"], w, g, kw.M, x_inv_scale=d["inv_scale"],
                                                     stream=s.cuda_stream))
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(y1, y2), "the same GEMM on another stream gave other bits")
        yb = torch.from_dlpack(moesq.sparse_gemm(d["x"], d["counts"], w, g, kw.M, x_inv_scale=d["inv_scale"],
                                                 out_dtype="bfloat16"))
        self.assertEqual(yb.dtype, torch.bfloat16)
        # |yb − y| ≤ 2^-7·|y| + 1e-6·max|y|: the rounding bound, plus room for near-cancelled elements
        excess = ((yb.float() - y1).abs() - GEMM_BF16_ELEM_REL * y1.abs() - 1e-6 * y1.abs().max()).max().item()
        err = ((yb.float() - y1).abs() / y1.abs().clamp_min(1e-30)).masked_fill(y1 == 0, 0).max().item()
        report("sparse_gemm_bf16_out", max_elem_rel=err)
        self.assertLessEqual(excess, 0.0, "bf16 output farther from the fp32 output than one rounding")
        self.assertTrue(yb.float().abs().max().item() > 0)


class MoeLayer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ckpt = Fixture.get()
        cls.cpu = {MODEL: moesq.load(MODEL), cls.ckpt: moesq.load(cls.ckpt)}

    def cpu_ref(self, ckpt, layer, x32, act_quant):
        m = self.cpu[ckpt]
        ids, w = (np.from_dlpack(t) for t in m.route(layer, x32))
        y = np.from_dlpack(m.moe_layer(layer, x32, act_quant=act_quant))
        return y, ids, w

    def test_matches_cpu_model(self):
        T = 40
        results = {}
        for ckpt, backend, act_quant in ((MODEL, "bf16", False), (self.ckpt, "sparse-w4a16", False),
                                         (self.ckpt, "sparse-w4a4", True), (self.ckpt, "bf16", False)):
            for layer in (1, 3):
                L = moesq.MoeLayer(ckpt, layer, experts=backend)
                self.assertEqual(L.backend, backend)
                x32 = randn((T, L.hidden_size), seed=layer * 31 + T)
                hi, lo = split_hi_lo(x32)
                xin = (hi.float() + lo.float()).numpy()  # exactly what the GPU reads
                y, ids, w = L.forward(hi.to(DEV), x_lo=lo.to(DEV), return_routes=True)
                self.assertEqual(L.device, 0)
                self.assertGreater(L.weight_bytes, 0)
                y, ids, w = (torch.from_dlpack(t).cpu().numpy() for t in (y, ids, w))
                want, want_ids, want_w = self.cpu_ref(ckpt, layer, xin, act_quant)
                what = "%s layer %d %s" % (os.path.basename(ckpt), layer, backend)
                np.testing.assert_array_equal(ids, want_ids, err_msg=what + ": routes")
                np.testing.assert_allclose(w, want_w, rtol=0, atol=ROUTER_W_ATOL, err_msg=what)
                rf = rel_fro(y, want)
                print("[measured] moe_layer_vs_cpu %s rel_fro=%.3e max_abs=%.3e" % (what, rf, np.abs(y - want).max()),
                      file=sys.stderr)
                self.assertLessEqual(rf, MOE_REL_FRO[backend], what)
                self.assertGreater(np.abs(want).max(), 0.0)
                results[(ckpt, backend, layer)] = (y, xin)
        for layer in (1, 3):  # W4A4 is the CPU's quantized computation, not just near the unquantized one
            y4, xin = results[(self.ckpt, "sparse-w4a4", layer)]
            cpu4 = self.cpu_ref(self.ckpt, layer, xin, True)[0]
            cpu16 = self.cpu_ref(self.ckpt, layer, xin, False)[0]
            effect = rel_fro(cpu4, cpu16)
            report("w4a4_quantization_effect", layer=layer, cpu4_vs_cpu16=effect, gpu4_vs_cpu4=rel_fro(y4, cpu4))
            self.assertGreater(effect, 0.0)
            self.assertLessEqual(rel_fro(y4, cpu4), W4A4_VS_QUANT_EFFECT * effect)

    def test_bitwise_invariant_to_token_order_batch_and_accumulate(self):
        for backend in ("sparse-w4a4", "sparse-w4a16"):
            L = moesq.MoeLayer(self.ckpt, 2, experts=backend).to(0)
            T = 6
            hi, lo = split_hi_lo(randn((T, L.hidden_size), seed=5))
            hi, lo = hi.to(DEV), lo.to(DEV)
            y = torch.from_dlpack(L(hi, x_lo=lo))
            perm = torch.tensor([4, 0, 5, 2, 1, 3], device=DEV)
            yp = torch.from_dlpack(L(hi[perm].contiguous(), x_lo=lo[perm].contiguous()))
            self.assertTrue(torch.equal(yp, y[perm]), backend + ": token order changed bits")
            y3 = torch.from_dlpack(L(hi[:3].contiguous(), x_lo=lo[:3].contiguous()))
            self.assertTrue(torch.equal(y3, y[:3]), backend + ": batch composition changed bits")
            r = randn((T, L.hidden_size), seed=6).to(DEV)
            acc = r.clone()
            self.assertIs(L(hi, x_lo=lo, out=acc, accumulate=True), acc)
            torch.cuda.synchronize()
            self.assertTrue(torch.equal(acc, r + y), backend + ": out += y differs from r + y")
            out = torch.full_like(r, float("nan"))
            L(hi, x_lo=lo, out=out)
            self.assertTrue(torch.equal(out, y), backend + ": out = y differs from the new output")
            self.assertGreater(y.abs().max().item(), 0.0)

    def test_empty_batch(self):
        L = moesq.MoeLayer(self.ckpt, 0)
        y, ids, w = L(torch.zeros((0, L.hidden_size), dtype=torch.bfloat16, device=DEV), return_routes=True)
        self.assertEqual(tuple(torch.from_dlpack(ids).shape), (0, L.top_k))


class Streams(unittest.TestCase):
    """The DLPack stream contract on non-default (non-blocking) torch streams."""

    def setUp(self):
        self.x = randn((64, 512), seed=21, scale=1.5).bfloat16()
        self.want = np.from_dlpack(moesq.act_quant_ref(self.x)[0])
        moesq.act_quant(self.x.to(DEV))  # warm up (first-use allocations) so later calls enqueue only
        torch.cuda.synchronize()

    def test_op_runs_on_the_given_stream_after_its_pending_work(self):
        x = torch.full(self.x.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
        src = self.x.to(DEV)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        busy(s)
        with torch.cuda.stream(s):
            x.copy_(src)  # device to device on s, after the sleep: the op must run after it
            rows, _ = moesq.act_quant(x, stream=s.cuda_stream)
            self.assertFalse(s.query(), "the sleep finished before the op was enqueued: no race was possible")
            got = torch.from_dlpack(rows).clone()  # consumed on s (torch passes s to __dlpack__)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(bits(got), self.want)

    def test_inputs_are_synchronized_to_the_op_stream(self):
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        x = torch.full(self.x.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
        src = self.x.to(DEV)
        torch.cuda.synchronize()
        busy(s1)
        with torch.cuda.stream(s1):
            x.copy_(src)  # written on s1 (the current stream) after the sleep
            rows, _ = moesq.act_quant(x, stream=s2.cuda_stream)  # x.__dlpack__(stream=s2): s2 waits for s1
            self.assertFalse(s1.query())
        with torch.cuda.stream(s2):
            got = torch.from_dlpack(rows).clone()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(bits(got), self.want)

    def test_outputs_are_synchronized_to_the_consumer_stream(self):
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        x = self.x.to(DEV)
        torch.cuda.synchronize()
        busy(s1)
        done = torch.cuda.Event(enable_timing=True)
        read = torch.cuda.Event(enable_timing=True)
        rows, _ = moesq.act_quant(x, stream=s1.cuda_stream)  # after the sleep on s1
        with torch.cuda.stream(s1):
            done.record(s1)
        with torch.cuda.stream(s2):
            self.assertFalse(s1.query(), "the op finished before the consumer was enqueued: no race was possible")
            got = torch.from_dlpack(rows).clone()  # __dlpack__(stream=s2) makes s2 wait for the op's event
            read.record(s2)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(bits(got), self.want)
        gap_ms = done.elapsed_time(read)
        report("consumer_after_op", read_minus_done_ms=gap_ms)
        # The read waits for the op's event, recorded just before `done`: it ends at about `done` or later. A
        # consumer that did not wait would have read during the sleep, ~200 ms before `done`.
        self.assertGreater(gap_ms, -1.0, "the consumer stream read the output before the op finished")

    def test_moe_layer_on_a_busy_stream(self):
        L = moesq.MoeLayer(Fixture.get(), 1).to(0)
        hi, lo = split_hi_lo(randn((16, L.hidden_size), seed=8))
        hi, lo = hi.to(DEV), lo.to(DEV)
        want = torch.from_dlpack(L(hi, x_lo=lo)).clone()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        xb = torch.full_like(hi, float("nan"))
        out = torch.full((16, L.hidden_size), float("nan"), device=DEV)
        busy(s)
        with torch.cuda.stream(s):
            xb.copy_(hi)
            L(xb, x_lo=lo, out=out, stream=s)  # a torch.cuda.Stream object is accepted too
            self.assertFalse(s.query())
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(out, want))

    def test_calls_do_not_block_the_host(self):
        s = torch.cuda.Stream()
        x = self.x.to(DEV)
        ids = distinct_ids(64, 16, 4, 3).to(DEV)
        torch.cuda.synchronize()
        busy(s)
        t0 = time.perf_counter()
        rows, _ = moesq.act_quant(x, stream=s.cuda_stream)
        d = moesq.dispatch(x, ids, 16, 64, stream=s.cuda_stream)
        host_ms = (time.perf_counter() - t0) * 1e3
        pending = not s.query()
        report("host_time_of_enqueue", ms=host_ms)
        self.assertTrue(pending, "an op waited for the stream (host blocked %.1f ms)" % host_ms)
        torch.cuda.synchronize()
        self.assertTrue(torch.from_dlpack(d["counts"]).sum().item() == 64 * 4)


class ZeroCopyAndOwnership(unittest.TestCase):
    def test_outputs_are_views_not_copies(self):
        rows, inv = moesq.act_quant(randn((8, 256), seed=1).bfloat16().to(DEV))
        a, b = torch.from_dlpack(rows), torch.from_dlpack(rows)
        self.assertEqual(a.data_ptr(), rows.data_ptr)
        self.assertEqual(b.data_ptr(), rows.data_ptr)
        self.assertEqual(rows.device, "cuda:0")
        self.assertTrue(a.is_cuda and a.device == DEV)
        a[0, 0] = 3.0
        torch.cuda.synchronize()
        self.assertEqual(b[0, 0].item(), 3.0)

    def test_the_last_view_frees_the_memory(self):
        E, cap, K = 64, 1024, 2048  # x out: 64·1024·2048·2 B = 256 MiB
        x = randn((4, K), seed=2).bfloat16().to(DEV)
        ids = distinct_ids(4, E, 4, 3).to(DEV)
        gc.collect()
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        d = moesq.dispatch(x, ids, E, cap)
        view = torch.from_dlpack(d["x"])
        keep = view[:, :4].clone()
        torch.cuda.synchronize()
        used = free0 - torch.cuda.mem_get_info()[0]
        self.assertGreater(used, 250 << 20)
        del d
        gc.collect()
        torch.cuda.synchronize()
        self.assertGreater(free0 - torch.cuda.mem_get_info()[0], 250 << 20, "freed while a torch view holds it")
        self.assertTrue(torch.equal(view[:, :4], keep))
        del view
        gc.collect()
        torch.cuda.synchronize()
        left = free0 - torch.cuda.mem_get_info()[0]
        report("dispatch_output_memory", used_mb=used / 2**20, left_after_free_mb=left / 2**20)
        self.assertLess(left, 32 << 20, "the output was not freed with its last view")


class Refusals(unittest.TestCase):
    def tearDown(self):
        # After any refusal the context must still work: no sticky CUDA error.
        rows, _ = moesq.act_quant(torch.ones((2, 64), dtype=torch.bfloat16, device=DEV))
        torch.cuda.synchronize()
        self.assertTrue(torch.from_dlpack(rows).float().abs().sum().item() > 0)

    def test_host_memory_claimed_as_cuda(self):
        for pinned in (False, True):
            h = torch.zeros((4, 64), dtype=torch.int16, pin_memory=pinned)
            cap = Capsule(h.numpy().view(np.uint16), device_type=KDL_CUDA, code=KDL_BFLOAT, bits=16)
            with self.assertRaisesRegex(ValueError, r"moesq.act_quant: argument 'x' claims CUDA memory \(kDLCUDA\) on "
                                                    r"cuda:0 but its pointer is host memory"):
                moesq.act_quant(cap.capsule)
            self.assertEqual(cap.deleted, 1)

    def test_views_torch_would_pass_are_refused_by_name(self):
        x = randn((16, 64), seed=3).bfloat16().to(DEV)
        with self.assertRaisesRegex(ValueError, "argument 'x' is not C-contiguous"):
            moesq.act_quant(x.t())
        flat = torch.zeros(16 * 64 + 8, dtype=torch.bfloat16, device=DEV)
        with self.assertRaisesRegex(ValueError, "argument 'x' starts at 0x[0-9a-f]+, not 16-byte aligned"):
            moesq.act_quant(flat[1:1 + 16 * 64].view(16, 64))
        with self.assertRaisesRegex(ValueError, "argument 'x' is on cpu; this op needs CUDA memory"):
            moesq.act_quant(x.cpu())
        with self.assertRaisesRegex(TypeError, "argument 'x' has dtype float32, expected bfloat16 or uint16"):
            moesq.act_quant(x.float())
        with self.assertRaisesRegex(TypeError, "argument 'topk_ids' has dtype int64, expected int32"):
            moesq.dispatch(x, torch.zeros((16, 2), dtype=torch.int64, device=DEV), 8, 4)
        L = moesq.MoeLayer(MODEL, 0)
        with self.assertRaisesRegex(ValueError, r"argument 'x' has shape \[16, 64\], expected \[\*, 256\]"):
            L(x)
        self.assertIsNone(L.device)

    def test_other_device(self):
        if torch.cuda.device_count() < 2:
            self.skipTest("one GPU: the cross-device refusal needs two")
        L = moesq.MoeLayer(MODEL, 0).to(0)
        with self.assertRaisesRegex(ValueError, "the weights are on cuda:0; got tensors on cuda:1"):
            L(torch.zeros((2, 256), dtype=torch.bfloat16, device="cuda:1"))


if __name__ == "__main__":
    unittest.main()
