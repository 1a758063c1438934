// GPU tests of the grouped sparse GEMM kernels (src/ops/sparse_gemm/sparse_gemm_mma.cu: mma.sp; sparse_gemm_wgmma.cu:
// wgmma.sp) against their CPU `_ref` twin on the SAME packed bits and the SAME quantized activations
// (ops::sparse_gemm_ref, the same descriptor). The activation producers (act_dispatch, swiglu_quant) are tested in
// test_act_dispatch.cu and test_swiglu_quant.cu. Run under compute-sanitizer memcheck, synccheck and racecheck too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "core/cuda/check.cuh"
#include "ops/sparse_gemm/sparse_gemm.h"
#include "format/fp_codecs.h"
#include "format/nvfp4.h"
#include "format/kernel_layout.h"
#include "ops/act_dispatch/act_dispatch.h"
#include "support/sparse_gemm_ref_y.h"
#include "core/cuda/dev_buf.cuh"
#include "support/gpu_test_main.h"

namespace {

using namespace moesq;
using namespace moesq::format;
using namespace moesq::ops;

// Only the fp32 summation order differs between the tensor cores and the fp64 reference.
constexpr double kGemmRelFrobTol = 1e-5;
// bf16 output against the fp32 ref: one bf16 rounding (relative 2^-9) on top.
constexpr double kGemmBf16RelFrobTol = 4e-3;
constexpr uint16_t kPoisonBf16 = 0xFFFF;  // a NaN: any element left unwritten stays NaN

using moesq::DevBuf;

enum class ScaleMode { kRandom, kOne, kExtreme };

// Random paired 4:8 tensor built directly from codes (every E2M1 code, all 6 patterns).
format::Sparse48Tensor random_packed(int64_t N, int64_t K, std::mt19937& rng, ScaleMode mode) {
  format::Sparse48Tensor t;
  t.N = N;
  t.K = K;
  t.values.resize(N * K / 4);
  t.meta.resize(N * K / 16);
  t.scales.resize(N * K / 32);
  std::uniform_int_distribution<int> byte(0, 255), pat(0, format::kNumPatterns - 1);
  for (auto& v : t.values) v = static_cast<uint8_t>(byte(rng));
  for (auto& m : t.meta) m = static_cast<uint8_t>(format::pattern_nibble(pat(rng)) | (format::pattern_nibble(pat(rng)) << 4));
  std::uniform_int_distribution<int> sc(0x20, 0x50);  // 2^-3 .. 2^3: ordinary block scales
  const uint8_t extremes[] = {0x00, 0x01, 0x02, 0x07, 0x7e, 0x7d};  // zero, subnormals, 448-ish
  std::uniform_int_distribution<int> ex(0, 5);
  for (auto& s : t.scales) {
    if (mode == ScaleMode::kOne) s = 0x38;  // 1.0
    else if (mode == ScaleMode::kExtreme) s = extremes[ex(rng)];
    else s = static_cast<uint8_t>(sc(rng));
  }
  t.global_scale = mode == ScaleMode::kOne ? 1.0f : std::uniform_real_distribution<float>(50.0f, 5000.0f)(rng);
  return t;
}

ActBatch random_batch(int E, int cap, int64_t K, const std::vector<int>& counts, std::mt19937& rng, bool quantize,
                      bool integer_values = false) {
  ActBatch a;
  a.num_experts = E;
  a.capacity = cap;
  a.K = K;
  a.K_pad = padded_k(K);
  a.x.assign(static_cast<size_t>(E) * cap * a.K_pad, 0x7fc0);  // padding slots: NaN, must never reach an output
  a.inv_scale.assign(static_cast<size_t>(E) * cap, 1.0f);
  a.counts.assign(counts.begin(), counts.end());
  a.route_of_slot.assign(static_cast<size_t>(E) * cap, -1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<int> id(-8, 8);
  std::vector<uint16_t> row(K);
  for (int e = 0; e < E; ++e)
    for (int s = 0; s < std::min(counts[e], cap); ++s) {
      for (auto& v : row) v = f32_to_bf16(integer_values ? static_cast<float>(id(rng)) : nd(rng));
      const size_t slot = static_cast<size_t>(e) * cap + s;
      act_quant_row_ref(row.data(), K, quantize, a.x.data() + slot * a.K_pad, &a.inv_scale[slot]);
    }
  return a;
}

struct GemmCheck {
  double max_rel_frob = 0.0;
  int64_t unwritten = 0, overwritten = 0, bf16_mismatch = 0, f32_not_bitwise = 0;
};

// The same tokens with x stored in another K order (every slot, padding slots included).
ActBatch relayout(const ActBatch& in, ActLayout layout) {
  if (in.layout == layout) return in;
  ActBatch out = in;
  out.layout = layout;
  for (size_t row = 0; row < static_cast<size_t>(in.num_experts) * in.capacity; ++row)
    for (int64_t k = 0; k < in.K_pad; ++k)
      out.x[row * in.K_pad + act_storage_index(k, layout)] = in.x[row * in.K_pad + act_storage_index(k, in.layout)];
  return out;
}

// Runs the GPU GEMM (fp32 and bf16 outputs, both poisoned) and compares with the CPU ref. The batch
// is first put into the layout the config's kernel reads (cfg nullptr: the heuristic's choice).
// bf16_only: no fp32 output (the wgmma kernel then stores full tiles by TMA); the bf16 values are
// compared with the ref instead (max_rel_frob of the bf16 output; f32_not_bitwise counts bf16 values
// that differ from the ref rounded to bf16).
// hi_factor > 0: rows >= m_split get their own γ = hi_factor·(e + 1)·γ_e (a fused gate|up with separate
// global scales), in the GPU launch and in the ref alike.
GemmCheck run_gemm_check(const std::vector<format::Sparse48Tensor>& ts, const ActBatch& act_in, MetaOrder mo,
                         const ops::GemmConfig* cfg, bool bf16_only = false, float hi_factor = 0.0f,
                         int64_t m_split = 0) {
  std::vector<const format::Sparse48Tensor*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  auto with_split = [&](KernelWeights k) {
    if (hi_factor > 0.0f) {
      for (int e = 0; e < k.num_experts; ++e) k.gamma_hi.push_back(hi_factor * static_cast<float>(e + 1) * k.gamma[e]);
      k.m_split = m_split;
    }
    return k;
  };
  const KernelWeights kw = with_split(kernel_layout_from_sparse48(ptrs, "test", mo));
  int max_tokens = 0;
  for (int c : act_in.counts) max_tokens = std::max(max_tokens, c);
  const ops::GemmConfig chosen =
      cfg ? *cfg : ops::sparse_gemm_heuristic(act_in.num_experts, kw.M, kw.K_pad, std::min(max_tokens, act_in.capacity));
  const ActBatch act = relayout(act_in, ops::sparse_gemm_act_layout(chosen));
  const int E = act.num_experts, cap = act.capacity;
  const int64_t M = kw.M;
  // The `_ref` reads the default metadata order: its own copy of the weights when `mo` differs.
  const std::vector<float> ref = test::sparse_gemm_ref_y(
      mo == kDefaultMetaOrder ? kw : with_split(kernel_layout_from_sparse48(ptrs, "test")), act, 0.0f);

  std::vector<float> inv_gamma(E);
  for (int e = 0; e < E; ++e) inv_gamma[e] = 1.0f / kw.gamma[e];
  DevBuf<uint8_t> d_w(kw.data);
  std::vector<float> inv_gamma_hi(kw.gamma_hi.size());
  for (size_t e = 0; e < inv_gamma_hi.size(); ++e) inv_gamma_hi[e] = 1.0f / kw.gamma_hi[e];
  DevBuf<float> d_ig(inv_gamma), d_is(act.inv_scale), d_igh(inv_gamma_hi.empty() ? std::vector<float>{1.0f} : inv_gamma_hi);
  DevBuf<uint16_t> d_x(act.x);
  DevBuf<int32_t> d_counts(act.counts);
  DevBuf<uint16_t> d_y(std::vector<uint16_t>(ref.size(), kPoisonBf16));
  DevBuf<float> d_yf(std::vector<float>(ref.size(), std::nanf("")));
  ops::SparseGemmArgs a;
  a.w = d_w.p;
  a.w_inv_gamma = d_ig.p;
  a.w_inv_gamma_hi = kw.gamma_hi.empty() ? nullptr : d_igh.p;
  a.m_split = kw.m_split;
  a.x = d_x.p;
  a.x_layout = act.layout;
  a.x_inv_scale = d_is.p;
  a.counts = d_counts.p;
  a.y = d_y.p;
  a.y_f32 = bf16_only ? nullptr : d_yf.p;
  a.num_experts = E;
  a.capacity = cap;
  a.M = M;
  a.M_pad = kw.M_pad;
  a.K_pad = kw.K_pad;
  a.ldy = M;
  ops::sparse_gemm(a, max_tokens, nullptr, cfg);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  const auto y = d_y.download();
  const auto yf = d_yf.download();

  GemmCheck r;
  for (int e = 0; e < E; ++e) {
    const int n = std::min(act.counts[e], cap);
    double err = 0.0, nrm = 0.0;
    for (int s = 0; s < cap; ++s) {
      for (int64_t m = 0; m < M; ++m) {
        const size_t i = (static_cast<size_t>(e) * cap + s) * M + m;
        if (s >= n) {
          r.overwritten += (y[i] != kPoisonBf16) + !std::isnan(yf[i]);
          continue;
        }
        if (bf16_only) {
          if (y[i] == kPoisonBf16) {
            ++r.unwritten;
            continue;
          }
          const double v = bf16_to_f32(y[i]);
          err += (v - ref[i]) * (v - ref[i]);
          nrm += static_cast<double>(ref[i]) * ref[i];
          r.f32_not_bitwise += y[i] != f32_to_bf16(ref[i]);
          continue;
        }
        if (std::isnan(yf[i]) || y[i] == kPoisonBf16) {
          ++r.unwritten;
          continue;
        }
        err += (static_cast<double>(yf[i]) - ref[i]) * (static_cast<double>(yf[i]) - ref[i]);
        nrm += static_cast<double>(ref[i]) * ref[i];
        r.bf16_mismatch += y[i] != f32_to_bf16(yf[i]);
        r.f32_not_bitwise += yf[i] != ref[i];
      }
    }
    if (nrm > 0.0) r.max_rel_frob = std::max(r.max_rel_frob, std::sqrt(err / nrm));
    else if (err > 0.0) r.max_rel_frob = INFINITY;
  }
  return r;
}

std::vector<ops::GemmConfig> all_configs() {
  std::vector<ops::GemmConfig> v;
  for (auto [mt, nt] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 4}}) {
    ops::GemmConfig c;
    c.m16_tiles_per_warp = mt;
    c.n_tiles = nt;
    v.push_back(c);
  }
  ops::GemmConfig tiny_grid;  // persistent loop: 3 CTAs walk every tile
  tiny_grid.m16_tiles_per_warp = 2;
  tiny_grid.n_tiles = 2;
  tiny_grid.grid = 3;
  v.push_back(tiny_grid);
  v.push_back(ops::wgmma_config(128, 128));
  v.push_back(ops::wgmma_config(128, 256));
  v.push_back(ops::wgmma_config(256, 128));
  ops::GemmConfig wgmma_tiny_grid = ops::wgmma_config(256, 128);  // the pipelines run across tiles
  wgmma_tiny_grid.grid = 3;
  v.push_back(wgmma_tiny_grid);
  return v;
}

// Ragged counts incl. 0 and 1 and tile ± 1 for every n-tile size.
const std::vector<int> kRaggedCounts = {0, 1, 2, 3, 15, 16, 17, 63, 64, 65, 31, 33};

TEST(SparseGemm, MetadataOrderMatchesHardware) {
  std::mt19937 rng(42);
  const int E = 2;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_packed(32, 256, rng, ScaleMode::kRandom));
  const ActBatch act = random_batch(E, 8, 256, {8, 5}, rng, true);
  ops::GemmConfig c;
  c.m16_tiles_per_warp = 1;
  c.n_tiles = 1;
  const GemmCheck half_k = run_gemm_check(ts, act, MetaOrder::kHalfK, &c);
  const GemmCheck row_split = run_gemm_check(ts, act, MetaOrder::kRowSplit, &c);
  std::printf("metadata order probe: kHalfK rel err %.3g, kRowSplit rel err %.3g\n", half_k.max_rel_frob,
              row_split.max_rel_frob);
  EXPECT_LE((kDefaultMetaOrder == MetaOrder::kHalfK ? half_k : row_split).max_rel_frob, kGemmRelFrobTol);
}

TEST(SparseGemm, MatchesRefAllConfigsRaggedCounts) {
  std::mt19937 rng(2024);
  for (int64_t M : {17, 200}) {
    for (int64_t K : {96, 512}) {
      const int E = static_cast<int>(kRaggedCounts.size()), cap = 65;
      std::vector<format::Sparse48Tensor> ts;
      for (int e = 0; e < E; ++e) ts.push_back(random_packed(M, K, rng, ScaleMode::kRandom));
      const ActBatch act = random_batch(E, cap, K, kRaggedCounts, rng, true);
      for (const auto& c : all_configs()) {
        const GemmCheck r = run_gemm_check(ts, act, kDefaultMetaOrder, &c);
        EXPECT_LE(r.max_rel_frob, kGemmRelFrobTol) << "M=" << M << " K=" << K << " " << c.str();
        EXPECT_EQ(r.unwritten, 0) << "M=" << M << " K=" << K << " " << c.str();
        EXPECT_EQ(r.overwritten, 0) << "M=" << M << " K=" << K << " " << c.str();
        EXPECT_EQ(r.bf16_mismatch, 0) << "M=" << M << " K=" << K << " " << c.str();
      }
    }
  }
}

TEST(SparseGemm, HeuristicConfigW4A16) {
  std::mt19937 rng(77);
  const int E = 5, cap = 40;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_packed(48, 768, rng, ScaleMode::kRandom));
  const ActBatch act = random_batch(E, cap, 768, {40, 0, 7, 1, 39}, rng, false);
  const GemmCheck r = run_gemm_check(ts, act, kDefaultMetaOrder, nullptr);
  EXPECT_LE(r.max_rel_frob, kGemmRelFrobTol);
  EXPECT_EQ(r.unwritten + r.overwritten + r.bf16_mismatch, 0);
}

TEST(SparseGemm, IntegerValuedCaseIsBitwiseEqual) {
  std::mt19937 rng(5);
  const int E = 4, cap = 17;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_packed(40, 512, rng, ScaleMode::kOne));
  const ActBatch act = random_batch(E, cap, 512, {17, 1, 0, 9}, rng, false, true);
  for (const auto& c : all_configs()) {
    const GemmCheck r = run_gemm_check(ts, act, kDefaultMetaOrder, &c);
    EXPECT_EQ(r.f32_not_bitwise, 0) << c.str();
    EXPECT_EQ(r.unwritten + r.overwritten + r.bf16_mismatch, 0) << c.str();
    EXPECT_EQ(r.max_rel_frob, 0.0) << c.str();
    const GemmCheck b = run_gemm_check(ts, act, kDefaultMetaOrder, &c, true);  // bf16 only (TMA stores)
    EXPECT_EQ(b.f32_not_bitwise, 0) << c.str() << " bf16 only";
    EXPECT_EQ(b.unwritten + b.overwritten, 0) << c.str() << " bf16 only";
  }
}

// A fused gate|up whose halves carry their own γ (the paper's reference checkpoints): rows >= m_split
// take w_inv_gamma_hi, every kernel and config against the ref; on integer data bitwise (also through
// the TMA-stored bf16 path). m_split not a multiple of the CTA's row block is covered (M = 2·112,
// m_split = 112), with ragged counts.
TEST(SparseGemm, SeparateGammaForRowsFromMSplit) {
  std::mt19937 rng(31);
  for (int64_t I : {96, 112}) {
    const int E = 6, cap = 130;
    std::vector<format::Sparse48Tensor> ts;
    for (int e = 0; e < E; ++e) ts.push_back(random_packed(2 * I, 512, rng, ScaleMode::kRandom));
    const ActBatch act = random_batch(E, cap, 512, {0, 1, 17, 64, 129, 130}, rng, true);
    for (const auto& c : all_configs()) {
      const GemmCheck r = run_gemm_check(ts, act, kDefaultMetaOrder, &c, false, 1.75f, I);
      EXPECT_LE(r.max_rel_frob, kGemmRelFrobTol) << "I=" << I << " " << c.str();
      EXPECT_EQ(r.unwritten + r.overwritten + r.bf16_mismatch, 0) << "I=" << I << " " << c.str();
    }
  }
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < 4; ++e) ts.push_back(random_packed(256, 512, rng, ScaleMode::kOne));
  const ActBatch act = random_batch(4, 140, 512, {140, 1, 0, 128}, rng, false, true);
  for (const auto& c : all_configs()) {
    const GemmCheck r = run_gemm_check(ts, act, kDefaultMetaOrder, &c, false, 0.25f, 128);
    EXPECT_EQ(r.f32_not_bitwise + r.unwritten + r.overwritten + r.bf16_mismatch, 0) << c.str();
    const GemmCheck b = run_gemm_check(ts, act, kDefaultMetaOrder, &c, true, 0.25f, 128);
    EXPECT_EQ(b.f32_not_bitwise + b.unwritten + b.overwritten, 0) << c.str() << " bf16 only";
  }
}

TEST(SparseGemm, ExtremeScales) {
  std::mt19937 rng(6);
  const int E = 3, cap = 20;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_packed(64, 256, rng, ScaleMode::kExtreme));
  const ActBatch act = random_batch(E, cap, 256, {20, 3, 16}, rng, true);
  for (const auto& c : all_configs()) {
    const GemmCheck r = run_gemm_check(ts, act, kDefaultMetaOrder, &c);
    EXPECT_LE(r.max_rel_frob, kGemmRelFrobTol) << c.str();
    EXPECT_EQ(r.unwritten + r.overwritten + r.bf16_mismatch, 0) << c.str();
  }
}

// Many n-blocks per expert (counts around 128 and 256), partial m-blocks (M_pad = 208: warps past
// M_pad compute and store nothing), full tiles (the epilogue's fast path) and a single 256-K chunk:
// the wgmma.sp tiles and pipelines.
TEST(SparseGemm, WgmmaManyTilesPerExpert) {
  std::mt19937 rng(99);
  const std::vector<int> counts = {0, 1, 127, 128, 129, 255, 256, 257, 300};
  const int E = static_cast<int>(counts.size()), cap = 300;
  for (int64_t K : {96, 768}) {
    std::vector<format::Sparse48Tensor> ts;
    for (int e = 0; e < E; ++e) ts.push_back(random_packed(200, K, rng, ScaleMode::kRandom));
    const ActBatch act = random_batch(E, cap, K, counts, rng, true);
    for (const auto& c : {ops::wgmma_config(128, 128), ops::wgmma_config(128, 256), ops::wgmma_config(256, 128)}) {
      const GemmCheck r = run_gemm_check(ts, act, kDefaultMetaOrder, &c);
      EXPECT_LE(r.max_rel_frob, kGemmRelFrobTol) << "K=" << K << " " << c.str();
      EXPECT_EQ(r.unwritten + r.overwritten + r.bf16_mismatch, 0) << "K=" << K << " " << c.str();
    }
    const GemmCheck h = run_gemm_check(ts, act, kDefaultMetaOrder, nullptr);  // heuristic: wgmma.sp
    EXPECT_LE(h.max_rel_frob, kGemmRelFrobTol) << "K=" << K << " heuristic";
    EXPECT_EQ(h.unwritten + h.overwritten + h.bf16_mismatch, 0) << "K=" << K << " heuristic";
    // bf16 output only: tiles full in tokens go through the shared-memory staging and TMA stores.
    for (const auto& c : {ops::wgmma_config(128, 128), ops::wgmma_config(128, 256), ops::wgmma_config(256, 128)}) {
      const GemmCheck b = run_gemm_check(ts, act, kDefaultMetaOrder, &c, true);
      EXPECT_LE(b.max_rel_frob, kGemmBf16RelFrobTol) << "K=" << K << " bf16 only " << c.str();
      EXPECT_EQ(b.unwritten + b.overwritten, 0) << "K=" << K << " bf16 only " << c.str();
    }
  }
}

// Integer-valued case with tiles full in tokens (every wgmma.sp tile size): the TMA-stored bf16
// output equals the ref rounded to bf16, bit for bit.
TEST(SparseGemm, WgmmaTmaStoreIntegerCaseIsBitwiseEqual) {
  std::mt19937 rng(17);
  const int E = 3, cap = 256;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_packed(272, 512, rng, ScaleMode::kOne));
  const ActBatch act = random_batch(E, cap, 512, {256, 128, 200}, rng, false, true);
  for (const auto& c : {ops::wgmma_config(128, 128), ops::wgmma_config(128, 256), ops::wgmma_config(256, 128)}) {
    const GemmCheck b = run_gemm_check(ts, act, kDefaultMetaOrder, &c, true);
    EXPECT_EQ(b.f32_not_bitwise, 0) << c.str();
    EXPECT_EQ(b.unwritten + b.overwritten, 0) << c.str();
  }
}

// Two CTAs walk every tile, so each reuses its weight slots and activation stages dozens of times
// across chunks and tiles (the producer/consumer mbarrier protocol of the wgmma.sp kernel); integer
// values make any stale or early-read data show up as a bitwise difference.
TEST(SparseGemm, WgmmaPipelineReuseUnderTinyGridIsBitwiseEqual) {
  std::mt19937 rng(23);
  const int E = 4, cap = 512;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_packed(384, 1024, rng, ScaleMode::kOne));
  const ActBatch act = random_batch(E, cap, 1024, {512, 300, 129, 256}, rng, false, true);
  for (auto c : {ops::wgmma_config(128, 128), ops::wgmma_config(128, 256), ops::wgmma_config(256, 128)}) {
    c.grid = 2;
    const GemmCheck r = run_gemm_check(ts, act, kDefaultMetaOrder, &c);
    EXPECT_EQ(r.f32_not_bitwise, 0) << c.str();
    EXPECT_EQ(r.unwritten + r.overwritten + r.bf16_mismatch, 0) << c.str();
    const GemmCheck b = run_gemm_check(ts, act, kDefaultMetaOrder, &c, true);
    EXPECT_EQ(b.f32_not_bitwise, 0) << c.str() << " bf16 only";
    EXPECT_EQ(b.unwritten + b.overwritten, 0) << c.str() << " bf16 only";
  }
}

// T tokens' top-k routes: k distinct expert ids of [0, layer_experts) per token, token-major.
std::vector<int32_t> draw_routes(int T, int k, int layer_experts, std::mt19937& rng) {
  std::vector<int32_t> routes;
  for (int tok = 0; tok < T; ++tok) {
    std::vector<int32_t> ids(layer_experts);
    for (int i = 0; i < layer_experts; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    routes.insert(routes.end(), ids.begin(), ids.begin() + k);
  }
  return routes;
}

// Runs ops::sparse_gemm once on (kw, act) with config c, poisoned outputs; routes (the layer's expert ids,
// this call's experts from expert_begin) or nullptr. Returns {fp32 output, bf16 output}.
std::pair<std::vector<float>, std::vector<uint16_t>> run_sparse_gemm(const KernelWeights& kw, const ActBatch& act,
                                                                     const ops::GemmConfig& c,
                                                                     const std::vector<int32_t>* routes,
                                                                     int expert_begin, int routes_max_tokens = 8) {
  std::vector<float> inv_gamma(kw.num_experts);
  for (int e = 0; e < kw.num_experts; ++e) inv_gamma[e] = 1.0f / kw.gamma[e];
  const size_t n = static_cast<size_t>(act.num_experts) * act.capacity * kw.M;
  DevBuf<uint8_t> d_w(kw.data);
  DevBuf<float> d_ig(inv_gamma), d_is(act.inv_scale), d_yf(std::vector<float>(n, std::nanf("")));
  DevBuf<uint16_t> d_x(act.x), d_y(std::vector<uint16_t>(n, kPoisonBf16));
  DevBuf<int32_t> d_counts(act.counts), d_routes(routes ? *routes : std::vector<int32_t>{0});
  ops::SparseGemmArgs a;
  a.w = d_w.p, a.w_inv_gamma = d_ig.p, a.x = d_x.p, a.x_layout = act.layout, a.x_inv_scale = d_is.p;
  a.counts = d_counts.p, a.y = d_y.p, a.y_f32 = d_yf.p, a.num_experts = act.num_experts, a.capacity = act.capacity;
  a.M = kw.M, a.M_pad = kw.M_pad, a.K_pad = kw.K_pad, a.ldy = kw.M;
  if (routes) a.route_experts = d_routes.p, a.num_routes = static_cast<int64_t>(routes->size()), a.expert_begin = expert_begin;
  a.routes_max_tokens = routes_max_tokens;
  if (routes) EXPECT_TRUE(ops::sparse_gemm_runs_routes(a, act.capacity, &c)) << "capacity " << act.capacity;
  ops::sparse_gemm(a, act.capacity, nullptr, &c);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  return {d_yf.download(), d_y.download()};
}

// The routes kernel (sparse_gemm_routes.cu: decode-sized calls that carry their routes) against the
// mma.sp kernel at one n8 tile: every output bit equal, nothing written past the counts; T = 1, 3, 8
// tokens × top-4 routes over 20 experts of which this call holds 12 from expert_begin (routes outside
// are ignored), M with a partial last m-block (40 = 3 m16 tiles), K with an odd number of weight
// pieces (2304 = 9 chunks), with and without NVFP4 activations; and within kGemmRelFrobTol of the ref.
// T = 13 and 40 with routes_max_tokens 64: experts of more than 8 rows in chunks (the kChunked kernel).
TEST(SparseGemm, RoutesKernelBitsEqualTheMmaKernel) {
  std::mt19937 rng(808);
  const int E = 12, layer_experts = 20, k = 4;
  for (int64_t M : {40, 200})
    for (int64_t K : {512, 2304})
      for (int T : {1, 3, 8, 13, 40})
        for (int e0 : {0, 5}) {
          const std::vector<int32_t> routes = draw_routes(T, k, layer_experts, rng);
          std::vector<int> counts(E, 0);
          for (int32_t id : routes)
            if (id >= e0 && id < e0 + E) ++counts[id - e0];
          std::vector<format::Sparse48Tensor> ts;
          for (int e = 0; e < E; ++e) ts.push_back(random_packed(M, K, rng, ScaleMode::kRandom));
          std::vector<const format::Sparse48Tensor*> ptrs;
          for (auto& t : ts) ptrs.push_back(&t);
          const KernelWeights kw = kernel_layout_from_sparse48(ptrs, "test");
          const bool quantize = (T + e0) % 2 == 1;
          const ActBatch act = relayout(random_batch(E, T, K, counts, rng, quantize), ActLayout::kMmaFragment);
          ops::GemmConfig c;
          c.m16_tiles_per_warp = 2, c.n_tiles = 1;
          const auto mma = run_sparse_gemm(kw, act, c, nullptr, 0);
          const auto rts = run_sparse_gemm(kw, act, c, &routes, e0, T > 8 ? 64 : 8);
          const std::string at = "M=" + std::to_string(M) + " K=" + std::to_string(K) + " T=" + std::to_string(T) +
                                 " expert_begin=" + std::to_string(e0);
          int64_t diff = 0, first = -1;
          for (size_t i = 0; i < mma.first.size(); ++i) {
            const bool same = std::memcmp(&mma.first[i], &rts.first[i], sizeof(float)) == 0 &&
                              mma.second[i] == rts.second[i];
            if (!same && first < 0) first = static_cast<int64_t>(i);
            diff += !same;
          }
          EXPECT_EQ(diff, 0) << at << ": first differing index " << first;
          const std::vector<float> ref = test::sparse_gemm_ref_y(kw, act, 0.0f);
          double err = 0.0, nrm = 0.0;
          int64_t written = 0;
          for (int e = 0; e < E; ++e)
            for (int s = 0; s < counts[e]; ++s)
              for (int64_t m = 0; m < M; ++m) {
                const size_t i = (static_cast<size_t>(e) * T + s) * M + m;
                err += (static_cast<double>(rts.first[i]) - ref[i]) * (static_cast<double>(rts.first[i]) - ref[i]);
                nrm += static_cast<double>(ref[i]) * ref[i];
                written += !std::isnan(rts.first[i]);
              }
          int64_t expected = 0;
          for (int c2 : counts) expected += static_cast<int64_t>(c2) * M;
          EXPECT_EQ(written, expected) << at;
          if (nrm > 0.0) EXPECT_LE(std::sqrt(err / nrm), kGemmRelFrobTol) << at;
        }
}

// The down GEMM's routes kernel making its own rows (SparseGemmArgs::fused_swiglu) against swiglu_quant
// then the same kernel reading them: every output bit equal. NVFP4 activations with per-row and static
// γ_a, bf16 activations (W4A16), gpt-oss's biases and clamped SwiGLU; a shard of 6 of 10 experts from 3.
TEST(SparseGemm, RoutesKernelFusedSwigluBitsEqualTheSwigluKernel) {
  std::mt19937 rng(909);
  const int layer_E = 10, k = 3;
  for (int variant = 0; variant < 4; ++variant)
    for (int T : {1, 5, 40}) {
      const bool quantize = variant != 2, static_gamma = variant == 1, gpt_oss = variant == 3;
      const int e0 = variant == 0 ? 0 : 3, E = variant == 0 ? layer_E : 6;
      const int64_t I = 256 + 32 * variant, I_pad = padded_k(I), M = 72;
      const std::vector<int32_t> routes = draw_routes(T, k, layer_E, rng);
      std::vector<int32_t> counts(layer_E, 0);
      for (int32_t id : routes) ++counts[id];
      std::normal_distribution<float> nd(0.0f, 2.0f);
      std::vector<float> h(static_cast<size_t>(layer_E) * T * 2 * I), bias(static_cast<size_t>(layer_E) * 2 * I),
          gamma(layer_E);
      for (auto& v : h) v = nd(rng);
      for (auto& v : bias) v = 0.3f * nd(rng);
      for (auto& v : gamma) v = 50.0f + 10.0f * std::fabs(nd(rng));
      std::vector<format::Sparse48Tensor> ts;
      for (int e = 0; e < E; ++e) ts.push_back(random_packed(M, I, rng, ScaleMode::kRandom));
      std::vector<const format::Sparse48Tensor*> ptrs;
      for (auto& t : ts) ptrs.push_back(&t);
      const KernelWeights kw = kernel_layout_from_sparse48(ptrs, "test");
      std::vector<float> inv_gamma(E);
      for (int e = 0; e < E; ++e) inv_gamma[e] = 1.0f / kw.gamma[e];
      const size_t n_y = static_cast<size_t>(E) * T * M;
      DevBuf<uint8_t> d_w(kw.data);
      DevBuf<float> d_h(h), d_bias(bias), d_gamma(gamma), d_ig(inv_gamma);
      DevBuf<float> d_as(std::vector<float>(static_cast<size_t>(layer_E) * T, 1.0f));
      DevBuf<uint16_t> d_ad(std::vector<uint16_t>(static_cast<size_t>(layer_E) * T * I_pad, 0));
      DevBuf<int32_t> d_counts(counts), d_routes(routes);
      ops::SwigluQuantArgs sw;
      sw.h_f32 = d_h.p, sw.counts = d_counts.p, sw.num_experts = layer_E, sw.capacity = T, sw.I = I, sw.I_pad = I_pad;
      sw.quantize = quantize, sw.act_gamma = static_gamma ? d_gamma.p : nullptr, sw.layout = ActLayout::kMmaFragment;
      sw.out = d_ad.p, sw.inv_scale = d_as.p;
      if (gpt_oss) sw.gate_up_bias = d_bias.p, sw.clamped = true;
      ops::GemmConfig c;
      c.m16_tiles_per_warp = 2, c.n_tiles = 1;
      auto run = [&](bool fuse) {
        DevBuf<uint16_t> d_y(std::vector<uint16_t>(n_y, kPoisonBf16));
        DevBuf<float> d_yf(std::vector<float>(n_y, std::nanf("")));
        ops::SparseGemmArgs a;
        a.w = d_w.p, a.w_inv_gamma = d_ig.p, a.x = d_ad.p + static_cast<size_t>(e0) * T * I_pad;
        a.x_layout = ActLayout::kMmaFragment, a.x_inv_scale = quantize ? d_as.p + e0 * T : nullptr;
        a.counts = d_counts.p + e0, a.y = d_y.p, a.y_f32 = d_yf.p, a.num_experts = E, a.capacity = T;
        a.M = M, a.M_pad = kw.M_pad, a.K_pad = kw.K_pad, a.ldy = M;
        a.route_experts = d_routes.p, a.num_routes = static_cast<int64_t>(routes.size()), a.expert_begin = e0;
        a.routes_max_tokens = T > 8 ? 64 : 8;  // T = 40 (12 rows an expert): the chunked kernel
        EXPECT_TRUE(ops::sparse_gemm_runs_routes(a, T, &c));
        if (fuse) a.fused_swiglu = &sw;
        else ops::swiglu_quant(sw, nullptr);
        ops::sparse_gemm(a, T, nullptr, &c);
        MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
        return std::make_pair(d_yf.download(), d_y.download());
      };
      const auto fused = run(true), plain = run(false);
      const std::string at = "variant " + std::to_string(variant) + " T=" + std::to_string(T);
      int64_t diff = 0, written = 0;
      for (size_t i = 0; i < n_y; ++i) {
        diff += std::memcmp(&fused.first[i], &plain.first[i], sizeof(float)) != 0 || fused.second[i] != plain.second[i];
        written += !std::isnan(plain.first[i]);
      }
      EXPECT_EQ(diff, 0) << at;
      int64_t expected = 0;
      for (int e = 0; e < E; ++e) expected += static_cast<int64_t>(counts[e0 + e]) * M;
      EXPECT_EQ(written, expected) << at;
    }
}

TEST(SparseGemm, RefusesActivationsInTheWrongLayout) {
  ops::SparseGemmArgs a;
  DevBuf<uint8_t> w(1408);
  DevBuf<float> f(16);
  DevBuf<uint16_t> x(256 * 4);
  DevBuf<int32_t> counts(1);
  a.w = w.p;
  a.w_inv_gamma = f.p;
  a.x = x.p;
  a.counts = counts.p;
  a.y_f32 = f.p;
  a.num_experts = 1;
  a.capacity = 4;
  a.M = 16;
  a.M_pad = 16;
  a.K_pad = 256;
  a.ldy = 16;
  a.x_layout = ActLayout::kMmaFragment;
  const ops::GemmConfig c = ops::wgmma_config(128, 128);
  EXPECT_THROW(ops::sparse_gemm(a, 4, nullptr, &c), moesq::Error);
  ops::GemmConfig no_instance = ops::wgmma_config(128, 64);
  a.x_layout = ActLayout::kKMajor;
  EXPECT_THROW(ops::sparse_gemm(a, 4, nullptr, &no_instance), moesq::Error);
}

TEST(SparseGemm, RefusesUnsupportedShapes) {
  ops::SparseGemmArgs a;
  a.num_experts = 4000;
  EXPECT_THROW(ops::sparse_gemm(a, 8, nullptr), moesq::Error);
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
