// The layer's GPU half (compress::layer_device_cuda) and its ops:
//   * ops::scatter_add_f32, ops::rmsnorm's fp32 output and ops::qk_rope's fp32 k/v rows against their
//     `_ref` twins, bit for bit; ops::causal_attention_f32 against its twin within kAttnAbsTol;
//   * moe_inputs (the routing's input: attention blocks + post norm over packed sequences, more rows
//     than one chunk) against DecoderModel::attention_block + moe_input per sequence within
//     kMoeInputsRelFro (full causal and a sliding window), the same bits twice;
//   * the device-resident states (DeviceStates: H_l kept on the GPU) give the same bits as the
//     per-layer host-state path (moe_inputs + routed_experts + the host add), and compress_model gives
//     the same packed experts with and without them;
//   * routed_experts on the GPU against DecoderModel::moe_block on the CPU (the propagation it
//     replaces) on a random layer: without Q_a within fp32 GEMM summation order, with Q_a (blocks 32
//     and 16) within the E2M1 flips that order causes; experts with more rows than one GPU chunk and an
//     expert with no rows; two GPU runs give the same bits; a NaN input is an Error;
//   * ops::split_tf32 against its twin bit for bit, and gpu::sgemm_3xtf32 (the GEMMs of all of the above)
//     against an fp64 product: within kThreeTf32RelFro, as accurate as cuBLAS's fp32 SGEMM, and far
//     more than one TF32 GEMM.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <limits>
#include <cmath>
#include <cstring>
#include <tuple>
#include <numeric>
#include <random>
#include <vector>

#include "compress/cuda_context.cuh"
#include "compress/expert_cuda.h"
#include "compress/method.h"
#include "compress/sgptq_cuda.h"
#include "support/packed_weight_eq.h"
#include "compress/pipeline.h"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "model/decoder.h"
#include "model/rope.h"
#include "model/tensor_math.h"
#include "io/checkpoint.h"
#include "model/mixers/mla_mixer.h"
#include "ops/causal_attention_f32/causal_attention_f32.h"
#include "ops/mla_f32/mla_f32.h"
#include "ops/qk_rope/qk_rope.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/scatter_add_f32/scatter_add_f32.h"
#include "ops/split_tf32/split_tf32.h"
#include "support/gpu_test_main.h"

namespace {

using namespace moesq;

// No Q_a: the GPU's and OpenBLAS's fp32 GEMMs sum in different orders (relative Frobenius error).
constexpr double kNoQuantRelFro = 1e-5;
// Q_a on: an ulp-level difference moves a value across an E2M1 rounding boundary in a few elements
// (up to one E2M1 step), as in tests/model/test_forward.cpp.
constexpr double kActQuantRelFro = 2e-2;
// Online softmax on the device (a rescale per key, expf ≤ 2 ulp, FMA dots) vs the two-pass twin, on
// unit-variance q, k, v: absolute error of an output element (a convex combination of values).
constexpr double kAttnAbsTol = 2e-5;
// The routing input: cuBLAS vs OpenBLAS GEMM order, the online softmax, then the post norm.
constexpr double kMoeInputsRelFro = 1e-5;
// A 3xTF32 GEMM (K = 2048, unit-variance operands) against the fp64 product: the dropped lo·lo terms
// and the lo parts' rounding (≤ 2⁻²¹ of a product) plus fp32 accumulation, relative Frobenius error.
constexpr double kThreeTf32RelFro = 1e-6;

std::vector<float> random_vec(size_t n, uint64_t seed, float sd) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  return x;
}

double rel_fro(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

io::ModelSpec layer_spec(int64_t E, int64_t k) {
  io::ModelSpec s;
  s.model_type = "qwen3_moe";
  s.vocab_size = 16;
  s.hidden_size = 128;
  s.intermediate_size = 96;
  s.moe_intermediate_size = 64;
  s.num_layers = 1;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.num_experts = E;
  s.top_k = k;
  s.norm_topk_prob = true;
  s.rms_norm_eps = 1e-6;
  s.rope_theta = 10000.0;
  return s;
}

void randomize_moe(model::DecoderModel& m, uint64_t seed) {
  const io::ModelSpec& s = m.spec();
  model::LayerWeights& L = m.layer(0);
  L.router = random_vec(L.router.size(), seed, 0.5f);
  uint64_t q = seed;
  for (model::ExpertWeights& e : L.experts) {
    e.gate = random_vec(e.gate.size(), ++q, 1.0f / std::sqrt(static_cast<float>(s.hidden_size)));
    e.up = random_vec(e.up.size(), ++q, 1.0f / std::sqrt(static_cast<float>(s.hidden_size)));
    e.down = random_vec(e.down.size(), ++q, 1.0f / std::sqrt(static_cast<float>(s.moe_intermediate_size)));
  }
}

}  // namespace

TEST(ScatterAddF32Gpu, MatchesTheTwinBitwise) {
  for (const int64_t C : {7, 300, 2048})
    for (const int64_t m : {1, 257, 3000}) {
      const int64_t y_rows = 4000;
      std::vector<int64_t> rows(y_rows);
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), std::mt19937_64(C + m));
      const std::vector<int64_t> idx(rows.begin(), rows.begin() + m);
      const auto src = random_vec(m * C, 1 + C, 2.0f), w = random_vec(m, 2 + m, 0.5f);
      std::vector<float> y = random_vec(y_rows * C, 3, 1.0f);
      DevBuf<float> dsrc(src), dw(w), dy(y);
      DevBuf<int64_t> didx(idx);
      ops::scatter_add_f32({.src = dsrc.p, .w = dw.p, .idx = didx.p, .m = m, .C = C, .y = dy.p, .y_rows = y_rows},
                           nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      ops::scatter_add_f32_ref(
          {.src = src.data(), .w = w.data(), .idx = idx.data(), .m = m, .C = C, .y = y.data(), .y_rows = y_rows});
      const std::vector<float> got = dy.download();
      ASSERT_EQ(0, std::memcmp(got.data(), y.data(), y.size() * sizeof(float))) << "C=" << C << " m=" << m;
    }
}

TEST(SplitTf32Gpu, MatchesTheTwinBitwise) {
  std::vector<float> x = random_vec(100003, 71, 3.0f);
  for (size_t i = 0; i < x.size(); i += 97) x[i] = std::ldexp(x[i], static_cast<int>(i % 200) - 100);
  x[5] = std::numeric_limits<float>::infinity();
  x[6] = std::numeric_limits<float>::quiet_NaN();
  x[7] = FLT_MAX;
  x[8] = std::numeric_limits<float>::denorm_min() * 777;
  const int64_t n = static_cast<int64_t>(x.size());
  DevBuf<float> dx(x), dhi(x.size()), dlo(x.size());
  ops::split_tf32({.x = dx.p, .n = n, .hi = dhi.p, .lo = dlo.p}, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> hi = dhi.download(), lo = dlo.download();
  std::vector<float> hi_ref(x.size()), lo_ref(x.size());
  ops::split_tf32_ref({.x = x.data(), .n = n, .hi = hi_ref.data(), .lo = lo_ref.data()});
  EXPECT_EQ(0, std::memcmp(hi.data(), hi_ref.data(), sizeof(float) * x.size()));
  EXPECT_EQ(0, std::memcmp(lo.data(), lo_ref.data(), sizeof(float) * x.size()));
}

TEST(SplitTf32Gpu, ThreeTf32GemmIsAsAccurateAsFp32) {
  const int64_t m = 300, N = 200, K = 2048;
  const std::vector<float> A = random_vec(m * K, 81, 1.0f), B = random_vec(N * K, 82, 1.0f);
  std::vector<double> want(static_cast<size_t>(m * N));  // row-major C = A · Bᵀ in fp64
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(A[i * K + k]) * B[j * K + k];
      want[static_cast<size_t>(i * N + j)] = acc;
    }
  auto err = [&](const std::vector<float>& got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    return std::sqrt(num / den);
  };
  compress::gpu::ThreadContext& t = compress::gpu::thread_context();
  DevBuf<float> dA(A), dB(B), dC(static_cast<size_t>(m * N));
  compress::gpu::SplitOperand a, b;
  a.split(t, dA.p, A.size());
  b.split(t, dB.p, B.size());
  std::vector<float> three, fp32, tf32;
  // Column-major Cᵀ [N, m] = B · Aᵀ.
  compress::gpu::sgemm_3xtf32(t, CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, b, K, a, K, 0.0f, dC.p, N);
  t.sync();
  three = dC.download();
  const float one = 1.0f, zero = 0.0f;
  for (const auto mode : {CUBLAS_PEDANTIC_MATH, CUBLAS_TF32_TENSOR_OP_MATH}) {
    MOESQ_CUBLAS_CHECK(cublasSetMathMode(t.blas, mode));
    MOESQ_CUBLAS_CHECK(cublasSgemm(t.blas, CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, &one, dB.p, K, dA.p, K, &zero, dC.p, N));
    t.sync();
    (mode == CUBLAS_PEDANTIC_MATH ? fp32 : tf32) = dC.download();
  }
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(t.blas, CUBLAS_PEDANTIC_MATH));
  const double e3 = err(three), e32 = err(fp32), etf = err(tf32);
  std::printf("C = A·Bᵀ, K = %lld: relative Frobenius error 3xTF32 %.3g, fp32 SGEMM %.3g, TF32 %.3g\n",
              static_cast<long long>(K), e3, e32, etf);
  EXPECT_LE(e3, kThreeTf32RelFro);
  EXPECT_LE(e3, 2.0 * e32);
  EXPECT_GT(etf, 20.0 * e3);  // one TF32 GEMM is not enough: the split is what buys the accuracy
}

TEST(LayerDeviceCuda, RoutedExpertsMatchTheCpuMoeBlock) {
  // 6 experts, top-2, expert 0 on 5,400 of the 9,000 tokens (more than one GPU chunk of 4,096 rows),
  // expert 5 on none, weights random and normalised as a softmax router's.
  const int64_t E = 6, k = 2, n = 9000;
  model::DecoderModel m(layer_spec(E, k));
  randomize_moe(m, 7);
  const int64_t H = m.spec().hidden_size, I = m.spec().moe_intermediate_size;
  const std::vector<float> X = random_vec(n * H, 11, 1.0f);
  model::Routes r;
  r.n = n;
  r.k = k;
  std::mt19937_64 g(13);
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t a = t % 5 < 3 ? 0 : static_cast<int32_t>(1 + g() % 4);
    int32_t b = static_cast<int32_t>(1 + g() % 4);
    if (b == a) b = b % 4 + 1;
    const float wa = u(g), wb = u(g);
    r.expert.insert(r.expert.end(), {a, b});
    r.weight.insert(r.weight.end(), {wa / (wa + wb), wb / (wa + wb)});
  }
  std::vector<int64_t> per_expert(E, 0);
  for (int32_t e : r.expert) ++per_expert[e];
  EXPECT_EQ(per_expert[5], 0);
  EXPECT_GT(*std::max_element(per_expert.begin(), per_expert.end()), 4096) << "no expert spans two chunks";
  const compress::LayerDevice* dev = compress::layer_device_cuda();
  for (const int block : {0, 32, 16}) {
    model::ForwardOptions fo;
    fo.act_quant = block > 0;
    fo.act_block = block > 0 ? block : 32;
    const std::vector<float> want = m.moe_block(0, X, r, fo);
    const std::vector<float> got = dev->routed_experts(m.layer(0).experts, H, I, X, r, block);
    ASSERT_EQ(got.size(), want.size());
    const double e = rel_fro(got, want);
    EXPECT_LE(e, block > 0 ? kActQuantRelFro : kNoQuantRelFro) << "act block " << block;
    EXPECT_GT(e, 0.0) << "act block " << block << ": the same bits as OpenBLAS would be a surprise";
    const std::vector<float> again = dev->routed_experts(m.layer(0).experts, H, I, X, r, block);
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << "act block " << block;
  }
}

TEST(LayerDeviceCuda, NonFiniteInputIsAnError) {
  model::DecoderModel m(layer_spec(4, 2));
  randomize_moe(m, 3);
  const int64_t H = m.spec().hidden_size, I = m.spec().moe_intermediate_size, n = 50;
  std::vector<float> X = random_vec(n * H, 5, 1.0f);
  const model::Routes r = m.route(0, X, n);
  X[17 * H + 3] = std::numeric_limits<float>::quiet_NaN();
  try {
    compress::layer_device_cuda()->routed_experts(m.layer(0).experts, H, I, X, r, 32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN or an infinity"), std::string::npos) << e.what();
  }
}


TEST(LayerOpsGpu, CausalAttentionMatchesTheTwin) {
  const int nh = 8, nkv = 2;
  for (const int hd : {64, 128, 96})
    for (const int64_t window : {0, 7}) {
      std::vector<int64_t> start;
      for (const int64_t T : {1, 300, 45, 2, 129})
        for (int64_t t = 0; t < T; ++t) start.push_back(static_cast<int64_t>(start.size()) - t);
      const int64_t n = static_cast<int64_t>(start.size()), qw = nh * hd, kw = nkv * hd;
      const auto q = random_vec(n * qw, 1 + hd, 1.0f), k = random_vec(n * kw, 2 + hd, 1.0f),
                 v = random_vec(n * kw, 3 + hd, 1.0f);
      std::vector<float> want(n * qw);
      ops::CausalAttentionF32Args a{.q = q.data(), .k = k.data(), .v = v.data(), .row_start = start.data(),
                                    .out = want.data(), .n = n, .nh = nh, .nkv = nkv, .hd = hd, .window = window,
                                    .scale = 1.0f / std::sqrt(static_cast<float>(hd))};
      ops::causal_attention_f32_ref(a);
      DevBuf<float> dq(q), dk(k), dv(v), dout(n * qw);
      DevBuf<int64_t> dstart(start);
      ops::CausalAttentionF32Args d = a;
      d.q = dq.p;
      d.k = dk.p;
      d.v = dv.p;
      d.row_start = dstart.p;
      d.out = dout.p;
      ops::causal_attention_f32(d, nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = dout.download();
      double worst = 0;
      for (int64_t i = 0; i < n * qw; ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
      EXPECT_LE(worst, kAttnAbsTol) << "hd " << hd << " window " << window;
    }
}

// Multi-head latent attention's naive form (compress/mla_cuda.cu): keys of d_qk, values of d_v < d_qk,
// one KV head per query head — the DeepSeek-V3 fixture's 48 / 32 and Kimi-K2.5's 192 / 128.
TEST(LayerOpsGpu, CausalAttentionWithNarrowerValuesMatchesTheTwin) {
  for (const auto& [nh, hd, hd_v] : {std::tuple{4, 48, 32}, std::tuple{16, 192, 128}}) {
    std::vector<int64_t> start;
    for (const int64_t T : {1, 130, 45, 2})
      for (int64_t t = 0; t < T; ++t) start.push_back(static_cast<int64_t>(start.size()) - t);
    const int64_t n = static_cast<int64_t>(start.size()), qw = int64_t{nh} * hd, vw = int64_t{nh} * hd_v;
    const auto q = random_vec(n * qw, 11 + hd, 1.0f), k = random_vec(n * qw, 12 + hd, 1.0f),
               v = random_vec(n * vw, 13 + hd, 1.0f);
    std::vector<float> want(n * vw);
    ops::CausalAttentionF32Args a{.q = q.data(), .k = k.data(), .v = v.data(), .row_start = start.data(),
                                  .out = want.data(), .n = n, .nh = nh, .nkv = nh, .hd = hd, .window = 0,
                                  .scale = 1.0f / std::sqrt(static_cast<float>(hd)), .hd_v = hd_v};
    ops::causal_attention_f32_ref(a);
    DevBuf<float> dq(q), dk(k), dv(v), dout(std::vector<float>(n * vw + 64, 7.0f));  // + a guard tail
    DevBuf<int64_t> dstart(start);
    ops::CausalAttentionF32Args d = a;
    d.q = dq.p, d.k = dk.p, d.v = dv.p, d.row_start = dstart.p, d.out = dout.p;
    ops::causal_attention_f32(d, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = dout.download();
    double worst = 0;
    for (int64_t i = 0; i < n * vw; ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    EXPECT_LE(worst, kAttnAbsTol) << "hd " << hd << " hd_v " << hd_v;
    for (int64_t i = n * vw; i < n * vw + 64; ++i) ASSERT_EQ(got[i], 7.0f) << "wrote past the output";
  }
}

TEST(LayerOpsGpu, MlaSplitRopeAndExpandMatchTheTwinsBitwise) {
  const int nh = 64, r_kv = 512, nope = 128, rope = 64, dv = 128, half = rope / 2;  // Kimi-K2.5
  const int64_t n = 37, max_len = 300;
  const auto ckv = random_vec(n * (r_kv + rope), 21, 1.0f), q0 = random_vec(n * nh * (nope + rope), 22, 1.0f);
  const auto cs = random_vec(max_len * half, 23, 1.0f), sn = random_vec(max_len * half, 24, 1.0f);
  std::vector<int32_t> pos(n);
  for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>((t * 97) % max_len);
  for (const bool interleave : {true, false}) {
    std::vector<float> q = q0, latent(n * r_kv), k_pe(n * rope);
    ops::MlaSplitRopeF32Args a{.ckv = ckv.data(), .q = q.data(), .cos = cs.data(), .sin = sn.data(),
                               .tok_pos = pos.data(), .latent = latent.data(), .k_pe = k_pe.data(), .n = n,
                               .max_len = max_len, .nh = nh, .r_kv = r_kv, .nope = nope, .rope = rope,
                               .interleave = interleave};
    ops::mla_split_rope_f32_ref(a);
    DevBuf<float> dckv(ckv), dq(q0), dcs(cs), dsn(sn), dlat(n * r_kv), dkpe(n * rope);
    DevBuf<int32_t> dpos(pos);
    ops::MlaSplitRopeF32Args d = a;
    d.ckv = dckv.p, d.q = dq.p, d.cos = dcs.p, d.sin = dsn.p, d.tok_pos = dpos.p, d.latent = dlat.p, d.k_pe = dkpe.p;
    ops::mla_split_rope_f32(d, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(0, std::memcmp(dq.download().data(), q.data(), q.size() * 4)) << "q, interleave " << interleave;
    EXPECT_EQ(0, std::memcmp(dlat.download().data(), latent.data(), latent.size() * 4)) << "latent";
    EXPECT_EQ(0, std::memcmp(dkpe.download().data(), k_pe.data(), k_pe.size() * 4)) << "k_pe";
    // The expansion of kv_b's output into per-head keys and values.
    const auto kv = random_vec(n * nh * (nope + dv), 25, 1.0f);
    std::vector<float> k(n * nh * (nope + rope)), v(n * nh * dv);
    ops::MlaExpandKvF32Args e{.kv = kv.data(), .k_pe = k_pe.data(), .k = k.data(), .v = v.data(), .n = n, .nh = nh,
                              .nope = nope, .rope = rope, .v_dim = dv};
    ops::mla_expand_kv_f32_ref(e);
    DevBuf<float> dkv(kv), dk(k.size()), dvv(v.size());
    ops::MlaExpandKvF32Args de = e;
    de.kv = dkv.p, de.k_pe = dkpe.p, de.k = dk.p, de.v = dvv.p;
    ops::mla_expand_kv_f32(de, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(0, std::memcmp(dk.download().data(), k.data(), k.size() * 4)) << "k";
    EXPECT_EQ(0, std::memcmp(dvv.download().data(), v.data(), v.size() * 4)) << "v";
  }
}

TEST(LayerOpsGpu, Fp32NormAndRopeOutputsMatchTheTwinsBitwise) {
  const int64_t n = 333, D = 2048;
  const auto x = random_vec(n * D, 5, 2.0f), w = random_vec(D, 6, 0.1f);
  std::vector<float> want(n * D);
  ops::rmsnorm_ref({.x = x.data(), .w = w.data(), .y = nullptr, .y_lo = nullptr, .y_f32 = want.data(), .n = n, .D = D});
  DevBuf<float> dx(x), dw(w);
  ops::rmsnorm({.x = dx.p, .w = dw.p, .y = nullptr, .y_lo = nullptr, .y_f32 = dx.p, .n = n, .D = D}, nullptr);  // in place
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = dx.download();
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));

  const int nh = 4, nkv = 2, hd = 128;
  const int64_t T = 301, max_len = 512, heads = nh + 2 * nkv;
  const auto qkv = random_vec(T * heads * hd, 7, 1.0f), qn = random_vec(hd, 8, 0.1f), kn = random_vec(hd, 9, 0.1f);
  std::vector<float> cos_t, sin_t;
  model::rope_tables(max_len, hd, 1e6, cos_t, sin_t, false);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 37) % max_len);
  std::vector<float> q(T * nh * hd), k(T * nkv * hd), v(T * nkv * hd);
  ops::QkRopeArgs a;
  a.qkv = qkv.data();
  a.q_norm = qn.data();
  a.k_norm = kn.data();
  a.cos = cos_t.data();
  a.sin = sin_t.data();
  a.tok_pos = pos.data();
  a.q_out = q.data();
  a.k_out = k.data();
  a.v_out = v.data();
  a.T = T;
  a.nh = nh;
  a.nkv = nkv;
  a.hd = hd;
  a.max_len = max_len;
  ops::qk_rope_ref(a);
  DevBuf<float> dqkv(qkv), dqn(qn), dkn(kn), dcos(cos_t), dsin(sin_t), dq(q.size()), dk(k.size()), dv(v.size());
  DevBuf<int32_t> dpos(pos);
  ops::QkRopeArgs d = a;
  d.qkv = dqkv.p;
  d.q_norm = dqn.p;
  d.k_norm = dkn.p;
  d.cos = dcos.p;
  d.sin = dsin.p;
  d.tok_pos = dpos.p;
  d.q_out = dq.p;
  d.k_out = dk.p;
  d.v_out = dv.p;
  ops::qk_rope(d, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(dq.download() == q);
  EXPECT_TRUE(dk.download() == k);
  EXPECT_TRUE(dv.download() == v);
}

TEST(LayerDeviceCuda, MoeInputsMatchTheCpuAttentionBlock) {
  io::ModelSpec spec = layer_spec(4, 2);
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  for (const int64_t window : {0, 50}) {
    model::DecoderModel m(spec);
    const int64_t H = spec.hidden_size;
    model::LayerWeights& L = m.layer(0);
    const float ws = 1.0f / std::sqrt(static_cast<float>(H));
    L.input_norm = random_vec(H, 21, 0.1f);
    for (float& x : L.input_norm) x += 1.0f;
    L.post_norm = random_vec(H, 22, 0.1f);
    for (float& x : L.post_norm) x += 1.0f;
    L.q_norm = random_vec(spec.head_dim, 23, 0.1f);
    for (float& x : L.q_norm) x += 1.0f;
    L.k_norm = random_vec(spec.head_dim, 24, 0.1f);
    for (float& x : L.k_norm) x += 1.0f;
    L.q_proj = random_vec(L.q_proj.size(), 25, ws);
    L.k_proj = random_vec(L.k_proj.size(), 26, ws);
    L.v_proj = random_vec(L.v_proj.size(), 27, ws);
    L.o_proj = random_vec(L.o_proj.size(), 28, ws);
    L.attention_window = window;
    ASSERT_EQ(compress::gpu_attention_refusal(spec, L), "");
    // Sequences of 1..256 rows, more rows in all than one 65,536-row chunk.
    std::vector<std::vector<float>> h;
    std::mt19937_64 g(31);
    int64_t rows = 0;
    while (rows < 70000) {
      const int64_t T = 1 + static_cast<int64_t>(g() % 256);
      h.push_back(random_vec(T * H, 100 + h.size(), 1.0f));
      rows += T;
    }
    std::vector<std::vector<float>> h_cpu = h, h_gpu = h, h_again = h;
    std::vector<float> X_cpu, h_cpu_flat, h_gpu_flat;
    for (auto& hs : h_cpu) {
      const int64_t T = static_cast<int64_t>(hs.size()) / H;
      m.attention_block(0, hs, T, {});
      const std::vector<float> x = m.moe_input(0, hs, T);
      X_cpu.insert(X_cpu.end(), x.begin(), x.end());
      h_cpu_flat.insert(h_cpu_flat.end(), hs.begin(), hs.end());
    }
    const std::vector<float> X = compress::layer_device_cuda()->moe_inputs(spec, L, h_gpu);
    for (const auto& hs : h_gpu) h_gpu_flat.insert(h_gpu_flat.end(), hs.begin(), hs.end());
    ASSERT_EQ(X.size(), X_cpu.size());
    EXPECT_LE(rel_fro(h_gpu_flat, h_cpu_flat), kMoeInputsRelFro) << "window " << window;
    EXPECT_LE(rel_fro(X, X_cpu), kMoeInputsRelFro) << "window " << window;
    const std::vector<float> X2 = compress::layer_device_cuda()->moe_inputs(spec, L, h_again);
    EXPECT_EQ(0, std::memcmp(X.data(), X2.data(), X.size() * sizeof(float))) << "window " << window;
    EXPECT_TRUE(h_again == h_gpu) << "window " << window;
  }
}


// compress/mla_cuda.cu on the DeepSeek-V3 fixture's MoE layer (its real MLA weights, YaRN-free RoPE with
// interleaved pairs, q LoRA): h and X equal the CPU MlaMixer's (attention_block + moe_input) within the
// GQA path's bound, and two runs give the same bits.
TEST(LayerDeviceCuda, MlaMoeInputsMatchTheCpuMixer) {
  const io::Checkpoint ckpt(std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3");
  const model::DecoderModel m(ckpt);
  const io::ModelSpec& spec = m.spec();
  const model::LayerWeights& L = m.layer(1);
  ASSERT_NE(dynamic_cast<const model::MlaMixer*>(L.mixer.get()), nullptr);
  ASSERT_EQ(compress::gpu_attention_refusal(spec, L), "");
  const int64_t H = spec.hidden_size;
  std::vector<std::vector<float>> h;
  std::mt19937_64 g(41);
  for (int i = 0; i < 200; ++i) {
    const int64_t T = 1 + static_cast<int64_t>(g() % 64);
    h.push_back(random_vec(T * H, 300 + i, 1.0f));
  }
  std::vector<std::vector<float>> h_cpu = h, h_gpu = h, h_again = h;
  std::vector<float> X_cpu, h_cpu_flat, h_gpu_flat;
  for (auto& hs : h_cpu) {
    const int64_t T = static_cast<int64_t>(hs.size()) / H;
    m.attention_block(1, hs, T, {});
    const std::vector<float> x = m.moe_input(1, hs, T);
    X_cpu.insert(X_cpu.end(), x.begin(), x.end());
    h_cpu_flat.insert(h_cpu_flat.end(), hs.begin(), hs.end());
  }
  const std::vector<float> X = compress::layer_device_cuda()->moe_inputs(spec, L, h_gpu);
  for (const auto& hs : h_gpu) h_gpu_flat.insert(h_gpu_flat.end(), hs.begin(), hs.end());
  ASSERT_EQ(X.size(), X_cpu.size());
  std::printf("[mla moe inputs] rel fro h %.2e X %.2e\n", rel_fro(h_gpu_flat, h_cpu_flat), rel_fro(X, X_cpu));
  EXPECT_LE(rel_fro(h_gpu_flat, h_cpu_flat), kMoeInputsRelFro);
  EXPECT_LE(rel_fro(X, X_cpu), kMoeInputsRelFro);
  const std::vector<float> X2 = compress::layer_device_cuda()->moe_inputs(spec, L, h_again);
  EXPECT_EQ(0, std::memcmp(X.data(), X2.data(), X.size() * sizeof(float)));
  EXPECT_TRUE(h_again == h_gpu);
}

// The propagation of a dense layer and of an ungated shared expert on the GPU (compress/pipeline.cpp
// plain_mlp_on_device through routed_experts_cuda): the DeepSeek-V3 fixture's dense MLP (layer 0) and
// shared expert (layer 1) against the CPU's, in row chunks and whole.
TEST(LayerDeviceCuda, PlainMlpOnDeviceIsTheCpuMlp) {
  const io::Checkpoint ckpt(std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3");
  const model::DecoderModel m(ckpt);
  const io::ModelSpec& spec = m.spec();
  const int64_t H = spec.hidden_size, n = 1000;
  const std::vector<float> X = random_vec(n * H, 91, 1.0f);
  const compress::LayerDevice& dev = *compress::layer_device_cuda();
  for (const int64_t chunk : {int64_t{0}, int64_t{300}}) {
    const std::vector<float> y = compress::plain_mlp_on_device(dev, m.layer(0).dense_mlp, H, spec.intermediate_size, X,
                                                               n, chunk);
    EXPECT_LE(rel_fro(y, m.dense_mlp(0, X, n)), kNoQuantRelFro) << "dense MLP, chunk " << chunk;
    const std::vector<float> ys = compress::plain_mlp_on_device(dev, m.layer(1).shared_expert, H,
                                                                spec.shared_expert_intermediate_size, X, n, chunk);
    EXPECT_LE(rel_fro(ys, m.shared_expert_forward(1, X, n)), kNoQuantRelFro) << "shared expert, chunk " << chunk;
  }
}

namespace {

// A random two-layer qwen3_moe model (attention, router, experts) of the device-resident shapes.
model::DecoderModel random_model(uint64_t seed) {
  io::ModelSpec spec = layer_spec(8, 2);
  spec.num_layers = 2;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.vocab_size = 64;
  model::DecoderModel m(spec);
  const int64_t H = spec.hidden_size;
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  m.embed_weight() = random_vec(m.embed_weight().size(), seed, 1.0f);
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    model::LayerWeights& L = m.layer(l);
    const uint64_t q = seed + 100 * (l + 1);
    for (auto* v : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm}) {
      *v = random_vec(v->size(), q + v->size(), 0.1f);
      for (float& x : *v) x += 1.0f;
    }
    L.q_proj = random_vec(L.q_proj.size(), q + 1, ws);
    L.k_proj = random_vec(L.k_proj.size(), q + 2, ws);
    L.v_proj = random_vec(L.v_proj.size(), q + 3, ws);
    L.o_proj = random_vec(L.o_proj.size(), q + 4, ws);
  }
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    // randomize_moe fills layer 0; do each layer through a view of it
    std::swap(m.layer(0), m.layer(l));
    randomize_moe(m, seed + 7 * l);
    std::swap(m.layer(0), m.layer(l));
  }
  return m;
}

}  // namespace

// SGPTQ on the GPU of a fresh model from make(), twice: with the calibration states on the device
// (device_resident must hold) and with them on the host (make_states removed, must not hold).
template <typename MakeModel>
std::vector<compress::CompressResult> sgptq_with_and_without_device_states(MakeModel make,
                                                                            const compress::CalibSet& calib) {
  compress::LayerDevice host_states = *compress::layer_device_cuda();
  host_states.make_states = nullptr;
  std::vector<compress::CompressResult> results;
  const std::vector<const compress::LayerDevice*> arms = {compress::layer_device_cuda(), &host_states};
  for (const compress::LayerDevice* ld : arms) {
    model::DecoderModel m = make();
    compress::CompressOptions opt;
    opt.method = &compress::methods::kSgptq;
    opt.device = compress::Device::kCuda;
    opt.sgptq.device = compress::sgptq_expert_cuda;
    opt.expert_device = compress::expert_device_cuda();
    opt.layer_device = ld;
    opt.threads = 2;
    EXPECT_EQ(compress::device_resident(m, opt), ld == compress::layer_device_cuda());
    results.push_back(compress::compress_model(m, calib, opt));
  }
  return results;
}

TEST(DeviceStatesCuda, SameBitsAsTheHostStatePath) {
  model::DecoderModel m = random_model(3);
  const io::ModelSpec& spec = m.spec();
  const int64_t H = spec.hidden_size, E = spec.num_experts, I = spec.moe_intermediate_size;
  std::vector<std::vector<float>> h;
  for (const int64_t T : {40, 1, 77, 128}) h.push_back(random_vec(T * H, 50 + T, 1.0f));
  const int64_t n = 40 + 1 + 77 + 128;
  const compress::LayerDevice* dev = compress::layer_device_cuda();
  std::unique_ptr<compress::DeviceStates> states = dev->make_states();
  states->upload(h, H);
  std::vector<std::vector<float>> h_host = h;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const float* dX = states->attention(spec, m.layer(l));
    const std::vector<float> X = dev->moe_inputs(spec, m.layer(l), h_host);
    std::vector<float> X_dev(X.size());
    MOESQ_CUDA_CHECK(cudaMemcpy(X_dev.data(), dX, X.size() * sizeof(float), cudaMemcpyDeviceToHost));
    ASSERT_EQ(0, std::memcmp(X.data(), X_dev.data(), X.size() * sizeof(float))) << "layer " << l << " X";
    const std::vector<float> logits = states->router_logits(m.layer(l).router, E);
    std::vector<float> cpu_logits(n * E);
    model::linear(X.data(), n, H, m.layer(l).router.data(), E, cpu_logits.data());
    EXPECT_LE(rel_fro(logits, cpu_logits), kNoQuantRelFro) << "layer " << l << " router logits";
    const model::Routes r = m.route_logits(l, logits, n);
    // Every other expert's outputs come from its error stage (ExpertDevice::rel_error's y_out, as
    // compress_model leaves them), the rest are computed by propagate: the sum must be the same bits.
    const compress::RoutesByExpert by = compress::routes_by_expert(r, E);
    states->note_memory();  // as a compression worker would: the buffer is granted against it
    float* outputs = states->expert_outputs(r.n * r.k);
    ASSERT_NE(outputs, nullptr);
    std::vector<uint8_t> kept(static_cast<size_t>(E), 0);
    const compress::ExpertDevice* ed = compress::expert_device_cuda();
    for (int64_t e = l % 2; e < E; e += 2) {
      compress::ExpertCalib c;
      c.n = by.start[e + 1] - by.start[e];
      if (c.n == 0) continue;
      c.dev_X = dX;
      for (int64_t i = 0; i < c.n; ++i) c.rows.push_back(by.ids[by.start[e] + i] / r.k);
      const model::ExpertWeights& w = m.layer(l).experts[e];
      const compress::DeviceRows rows = ed->rows(w, H, I, c);
      ed->rel_error(rows, c.n, H, I, w.gate.data(), w.up.data(), w.down.data(), 32, outputs + by.start[e] * H);
      kept[e] = 1;
    }
    EXPECT_GT(std::count(kept.begin(), kept.end(), 1), 0);
    states->propagate(m.layer(l).experts, I, r, 32, kept);
    const std::vector<float> y = dev->routed_experts(m.layer(l).experts, H, I, X, r, 32);
    int64_t at = 0;
    for (auto& hs : h_host)
      for (float& v : hs) v += y[at++];
    std::vector<std::vector<float>> got = h;
    states->download(got);
    for (size_t i = 0; i < h_host.size(); ++i)
      ASSERT_EQ(0, std::memcmp(got[i].data(), h_host[i].data(), h_host[i].size() * sizeof(float)))
          << "layer " << l << " sequence " << i;
  }
}

// The kept-outputs buffer is granted only against a sampled low watermark of free memory: nothing
// before a sample, nothing larger than what the sample leaves (less a tenth of the GPU), and each
// grant consumes the sample (the next layer samples afresh).
TEST(DeviceStatesCuda, ExpertOutputsFitTheSampledFreeMemory) {
  const compress::LayerDevice* dev = compress::layer_device_cuda();
  std::unique_ptr<compress::DeviceStates> states = dev->make_states();
  const int64_t H = 64;
  states->upload({random_vec(8 * H, 3, 1.0f)}, H);
  EXPECT_EQ(states->expert_outputs(16), nullptr) << "granted before any sample";
  states->note_memory();
  EXPECT_NE(states->expert_outputs(16), nullptr);
  EXPECT_EQ(states->expert_outputs(16), nullptr) << "the sample was consumed";
  size_t free = 0, total = 0;
  MOESQ_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  states->note_memory();
  const auto too_many = static_cast<int64_t>(free / (sizeof(float) * H));  // all the free memory, no tenth left
  EXPECT_EQ(states->expert_outputs(too_many), nullptr);
}

TEST(DeviceStatesCuda, CompressModelGivesTheSameExpertsWithAndWithout) {
  compress::CalibSet calib;
  std::mt19937_64 g(9);
  for (const int64_t T : {64, 64, 31, 64, 64, 64, 5, 64})
    calib.sequences.push_back(std::vector<int32_t>(T));
  for (auto& sq : calib.sequences)
    for (int32_t& t : sq) t = static_cast<int32_t>(g() % 64);
  const std::vector<compress::CompressResult> results =
      sgptq_with_and_without_device_states([] { return random_model(5); }, calib);
  const auto& a = results[0].experts;
  const auto& b = results[1].experts;
  ASSERT_EQ(a.size(), b.size());
  for (size_t l = 0; l < a.size(); ++l)
    for (size_t e = 0; e < a[l].size(); ++e)
      for (int p = 0; p < 3; ++p)
        test::expect_same_bits(a[l][e].proj[p], b[l][e].proj[p],
                               "layer " + std::to_string(l) + " expert " + std::to_string(e) + " proj " + std::to_string(p));
}

// DeepSeek-V3 / Kimi-K2 layers on the device-resident path: multi-head latent attention, a dense first
// layer (DeviceStates::propagate_mlp) and an ungated shared expert (propagate's shared) — the fixture
// compressed with the states on the GPU and with them on the host gives the same packed experts in
// every MoE layer (layer 2's inputs went through the dense layer 0 and layer 1's shared expert) and
// the same SGPTQ reports.
TEST(DeviceStatesCuda, DeepSeekFixtureSameExpertsWithAndWithout) {
  compress::CalibSet calib;
  std::mt19937_64 g(13);
  for (const int64_t T : {48, 48, 17, 48, 3, 48})
    calib.sequences.push_back(std::vector<int32_t>(T));
  const io::Checkpoint ckpt(std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3");
  for (auto& sq : calib.sequences)
    for (int32_t& t : sq) t = static_cast<int32_t>(g() % static_cast<uint64_t>(ckpt.spec().vocab_size));
  const std::vector<compress::CompressResult> results =
      sgptq_with_and_without_device_states([&] { return model::DecoderModel(ckpt); }, calib);
  const auto& a = results[0].experts;
  const auto& b = results[1].experts;
  ASSERT_EQ(a.size(), b.size());
  int64_t compared = 0;
  for (size_t l = 0; l < a.size(); ++l)
    for (size_t e = 0; e < a[l].size(); ++e)
      for (int p = 0; p < 3; ++p) {
        if (a[l][e].proj[p].K() == 0 && b[l][e].proj[p].K() == 0) continue;  // the dense layer: no experts
        test::expect_same_bits(a[l][e].proj[p], b[l][e].proj[p],
                               "layer " + std::to_string(l) + " expert " + std::to_string(e) + " proj " + std::to_string(p));
        ++compared;
      }
  EXPECT_EQ(compared, 2 * 16 * 3) << "the fixture's two MoE layers of 16 experts, 3 projections each";
  ASSERT_EQ(results[0].reports.size(), results[1].reports.size());
  for (size_t i = 0; i < results[0].reports.size(); ++i) {  // NaN (an expert without rows) on both, or equal
    const double x = results[0].reports[i].rel_error, y = results[1].reports[i].rel_error;
    EXPECT_TRUE((std::isnan(x) && std::isnan(y)) || x == y) << "report " << i << ": " << x << " vs " << y;
  }
}

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
