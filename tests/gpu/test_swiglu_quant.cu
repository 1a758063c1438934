// GPU tests of ops::swiglu_quant (ops/swiglu_quant) in both activation layouts (format::ActLayout) vs its
// CPU twin swiglu_quant_ref: bitwise where silu is exact in fp32, else a bounded mismatch fraction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/half.h"
#include "format/kernel_layout.h"
#include "ops/swiglu_quant/swiglu_quant.h"
#include "support/gpu_test_main.h"
#include "support/ops_fixtures.h"

namespace {

using namespace moesq;
using namespace moesq::format;
using namespace moesq::ops;
using moesq::test::unpermute_row;

// expf on the GPU may differ from the host libm in the last ulp; after bf16 rounding and NVFP4
// requantization that flips at most a handful of values per thousand (as in test_sparse_gemm.cu).
constexpr double kSwigluMaxMismatchFraction = 0.01;
// Gates at or above this make exp(−g) < 2^-24, so 1 + exp(−g) rounds to exactly 1 in fp32 on host and
// device alike and silu(g)·u = g·u: the SwiGLU output must then match the reference bitwise.
constexpr float kExactSiluMinGate = 17.0f;
constexpr uint16_t kPoisonBf16 = 0xFFFF;  // a NaN: any element left unwritten stays NaN

struct SwigluRun {
  std::vector<uint16_t> out;  // [E, capacity, I_pad]
  std::vector<float> inv;     // [E, capacity], −1 where not written
};

// The route grid's inputs (SwigluQuantArgs::topk_ids / slot_of_route) for `counts`: one route per filled
// slot in a shuffled order, plus dropped routes (slot −1) and routes past an expert's count.
struct Routes {
  std::vector<int32_t> ids, slots;
};
Routes shuffled_routes(const std::vector<int32_t>& counts, int cap, uint64_t seed) {
  Routes r;
  for (int e = 0; e < static_cast<int>(counts.size()); ++e) {
    for (int s = 0; s < std::min(counts[e], cap); ++s) r.ids.push_back(e), r.slots.push_back(s);
    r.ids.push_back(e), r.slots.push_back(-1);   // dropped
    r.ids.push_back(e), r.slots.push_back(cap);  // past the capacity: never written
  }
  std::mt19937_64 g(seed);
  std::vector<size_t> perm(r.ids.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), g);
  Routes out;
  for (size_t i : perm) out.ids.push_back(r.ids[i]), out.slots.push_back(r.slots[i]);
  return out;
}

SwigluRun run_swiglu(const std::vector<uint16_t>& h, const std::vector<int32_t>& counts, int E, int cap, int64_t I,
                     int64_t I_pad, bool quantize, ActLayout layout, const Routes* routes = nullptr) {
  DevBuf<int32_t> d_ids(routes ? routes->ids : std::vector<int32_t>(1)), d_slots(routes ? routes->slots : std::vector<int32_t>(1));
  DevBuf<uint16_t> d_h(h), d_out(std::vector<uint16_t>(static_cast<size_t>(E) * cap * I_pad, kPoisonBf16));
  DevBuf<int32_t> d_counts(counts);
  DevBuf<float> d_inv(std::vector<float>(static_cast<size_t>(E) * cap, -1.0f));
  ops::SwigluQuantArgs a;
  a.h = d_h.p;
  a.counts = d_counts.p;
  a.num_experts = E;
  a.capacity = cap;
  a.I = I;
  a.I_pad = I_pad;
  a.quantize = quantize;
  a.layout = layout;
  a.out = d_out.p;
  a.inv_scale = d_inv.p;
  if (routes) a.topk_ids = d_ids.p, a.slot_of_route = d_slots.p, a.routes = static_cast<int64_t>(routes->ids.size());
  ops::swiglu_quant(a, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  return {d_out.download(), d_inv.download()};
}

// Gates in [17, 40]: silu(g)·u = g·u exactly on both sides, so the GPU output and the reference must
// agree bit for bit (values, 1/γ_a and the zero padding), in either layout.
TEST(SwigluQuant, MatchesRefBitwiseWhenSiluIsExactInBothLayouts) {
  std::mt19937 rng(19);
  for (const ActLayout layout : {ActLayout::kMmaFragment, ActLayout::kKMajor})
  for (bool quantize : {true, false}) {
    for (int64_t I : {96, 768}) {
      const int E = 3, cap = 9;
      const std::vector<int32_t> counts = {9, 0, 13};  // full, empty, over capacity
      std::vector<uint16_t> h(static_cast<size_t>(E) * cap * 2 * I);
      std::uniform_real_distribution<float> gate(kExactSiluMinGate, 40.0f);
      std::normal_distribution<float> up(0.0f, 2.0f);
      for (size_t row = 0; row < static_cast<size_t>(E) * cap; ++row)
        for (int64_t i = 0; i < I; ++i) {
          h[row * 2 * I + i] = f32_to_bf16(gate(rng));
          h[row * 2 * I + I + i] = f32_to_bf16(up(rng));
        }
      const ActBatch ref = swiglu_quant_batch_ref(h, E, cap, I, counts, quantize, layout);
      const SwigluRun gpu = run_swiglu(h, counts, E, cap, I, ref.K_pad, quantize, layout);
      int64_t nonzero = 0;
      for (int e = 0; e < E; ++e)
        for (int s = 0; s < cap; ++s) {
          const size_t gs = static_cast<size_t>(e) * cap + s;
          if (s >= std::min(counts[e], cap)) {
            EXPECT_EQ(gpu.inv[gs], -1.0f) << "expert " << e << " slot " << s << " past count written";
            continue;
          }
          ASSERT_EQ(gpu.inv[gs], ref.inv_scale[gs]) << "quantize=" << quantize << " I=" << I << " expert " << e
                                                    << " slot " << s;
          for (int64_t k = 0; k < ref.K_pad; ++k) {
            ASSERT_EQ(gpu.out[gs * ref.K_pad + k], ref.x[gs * ref.K_pad + k])
                << act_layout_name(layout) << " quantize=" << quantize << " I=" << I << " expert " << e << " slot " << s
                << " first bad storage index " << k;
            nonzero += (ref.x[gs * ref.K_pad + k] & 0x7FFF) != 0;
          }
        }
      EXPECT_GT(nonzero, 0);
    }
  }
}

// Ordinary gates: the k-major GPU output is the GPU's own mma-fragment output re-ordered (bitwise: same
// kernel arithmetic); both stay within the expf allowance of the reference, write 1/γ_a of every
// filled slot and leave slots past the count untouched.
TEST(SwigluQuant, KMajorIsTheFragmentOutputReorderedAndMatchesRef) {
  std::mt19937 rng(23);
  for (bool quantize : {true, false})
    for (int64_t I : {288, 768}) {
      const int E = 3, cap = 17;
      std::vector<uint16_t> h(static_cast<size_t>(E) * cap * 2 * I);
      std::normal_distribution<float> nd(0.0f, 2.0f);
      for (auto& v : h) v = f32_to_bf16(nd(rng));
      const std::vector<int32_t> counts = {17, 0, 5};
      const ActBatch ref = swiglu_quant_batch_ref(h, E, cap, I, counts, quantize, ActLayout::kKMajor);
      const SwigluRun kmaj = run_swiglu(h, counts, E, cap, I, ref.K_pad, quantize, ActLayout::kKMajor);
      const SwigluRun frag = run_swiglu(h, counts, E, cap, I, ref.K_pad, quantize, ActLayout::kMmaFragment);
      EXPECT_EQ(kmaj.inv, frag.inv);
      int64_t mismatch = 0, total = 0;
      for (int e = 0; e < E; ++e)
        for (int s = 0; s < cap; ++s) {
          const size_t gs = static_cast<size_t>(e) * cap + s;
          if (s >= std::min(counts[e], cap)) {
            EXPECT_EQ(kmaj.inv[gs], -1.0f) << "expert " << e << " slot " << s << " past count written";
            continue;
          }
          EXPECT_NEAR(kmaj.inv[gs], ref.inv_scale[gs], 1e-6 * std::fabs(ref.inv_scale[gs]));
          const uint16_t* row_k = kmaj.out.data() + gs * ref.K_pad;
          const uint16_t* row_f = frag.out.data() + gs * ref.K_pad;
          ASSERT_EQ(unpermute_row(row_k, I, ActLayout::kKMajor), unpermute_row(row_f, I, ActLayout::kMmaFragment))
              << "quantize=" << quantize << " I=" << I << " expert " << e << " slot " << s;
          for (int64_t k = I; k < ref.K_pad; ++k) ASSERT_EQ(row_k[k], 0) << "padding at " << k;
          for (int64_t k = 0; k < ref.K_pad; ++k, ++total) mismatch += row_k[k] != ref.x[gs * ref.K_pad + k];
        }
      std::printf("swiglu quantize=%d I=%lld: %lld of %lld values differ from the host ref\n", quantize,
                  static_cast<long long>(I), static_cast<long long>(mismatch), static_cast<long long>(total));
      EXPECT_GT(total, 0);
      EXPECT_LE(static_cast<double>(mismatch) / total, kSwigluMaxMismatchFraction);
    }
}

// fp32 gate|up input (h_f32, the engine's path): with gates ≥ 17 silu(g)·u = g·u exactly, so the
// quantized output must equal act_quant_row_f32_ref of the fp32 row (no bf16 rounding before the codes)
// bitwise, and the W4A16 output the bf16 rounding of that row.
TEST(SwigluQuant, Fp32InputMatchesFp32RowQuantizer) {
  std::mt19937 rng(77);
  const int E = 3, cap = 5;
  const int64_t I = 768, I_pad = padded_k(I);
  const std::vector<int32_t> counts = {5, 0, 2};
  std::vector<float> h(static_cast<size_t>(E) * cap * 2 * I);
  std::uniform_real_distribution<float> gd(17.0f, 40.0f);
  std::normal_distribution<float> ud(0.0f, 1.0f);
  for (size_t i = 0; i < h.size(); ++i) h[i] = (i / I) % 2 == 0 ? gd(rng) : ud(rng);
  const std::vector<float> gamma = {20.0f, 200.0f, 2000.0f};  // static γ_a per expert (dynamic false)
  for (bool stat : {false, true})
  for (bool quantize : {true, false})
    for (const ActLayout layout : {ActLayout::kMmaFragment, ActLayout::kKMajor}) {
      DevBuf<float> d_h(h), d_inv(std::vector<float>(static_cast<size_t>(E) * cap, -1.0f)), d_gamma(gamma);
      DevBuf<uint16_t> d_out(std::vector<uint16_t>(static_cast<size_t>(E) * cap * I_pad, kPoisonBf16));
      DevBuf<int32_t> d_counts(counts);
      ops::SwigluQuantArgs a;
      a.h_f32 = d_h.p, a.counts = d_counts.p, a.num_experts = E, a.capacity = cap, a.I = I, a.I_pad = I_pad;
      a.quantize = quantize, a.layout = layout, a.out = d_out.p, a.inv_scale = d_inv.p;
      a.act_gamma = stat ? d_gamma.p : nullptr;
      ops::swiglu_quant(a, nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      const auto out = d_out.download();
      const auto inv = d_inv.download();
      for (int e = 0; e < E; ++e)
        for (int s = 0; s < counts[e]; ++s) {
          const size_t gs = static_cast<size_t>(e) * cap + s;
          std::vector<float> row(I);
          for (int64_t i = 0; i < I; ++i) row[i] = h[gs * 2 * I + i] * h[gs * 2 * I + I + i];
          std::vector<uint16_t> want(I_pad, 0);
          float want_inv = 1.0f;
          if (quantize) {
            act_quant_row_f32_ref(row.data(), I, want.data(), &want_inv, layout, stat ? gamma[e] : 0.0f);
          } else {
            for (int64_t i = 0; i < I; ++i) want[act_storage_index(i, layout)] = f32_to_bf16(row[i]);
          }
          ASSERT_EQ(inv[gs], want_inv) << "expert " << e << " slot " << s;
          for (int64_t k = 0; k < I_pad; ++k)
            ASSERT_EQ(out[gs * I_pad + k], want[k]) << "static=" << stat << " quantize=" << quantize << " " << act_layout_name(layout)
                                                    << " expert " << e << " slot " << s << " storage index " << k;
        }
    }
}

// The route grid (moe_block's launch: one CTA per route, slots from slot_of_route) writes exactly
// what the (capacity, E) grid writes — same values, same untouched slots — in both layouts.
TEST(SwigluQuant, RouteGridEqualsSlotGrid) {
  std::mt19937 rng(31);
  for (const ActLayout layout : {ActLayout::kMmaFragment, ActLayout::kKMajor})
    for (bool quantize : {true, false}) {
      const int E = 4, cap = 6;
      const int64_t I = 768, I_pad = padded_k(I);
      const std::vector<int32_t> counts = {6, 0, 3, 9};
      std::vector<uint16_t> h(static_cast<size_t>(E) * cap * 2 * I);
      std::normal_distribution<float> nd(0.0f, 2.0f);
      for (auto& v : h) v = f32_to_bf16(nd(rng));
      const Routes routes = shuffled_routes(counts, cap, 5);
      const SwigluRun slots = run_swiglu(h, counts, E, cap, I, I_pad, quantize, layout);
      const SwigluRun by_route = run_swiglu(h, counts, E, cap, I, I_pad, quantize, layout, &routes);
      EXPECT_EQ(by_route.inv, slots.inv) << act_layout_name(layout) << " quantize=" << quantize;
      ASSERT_EQ(by_route.out, slots.out) << act_layout_name(layout) << " quantize=" << quantize;
      EXPECT_EQ(std::count(slots.inv.begin(), slots.inv.end(), -1.0f), 2 * cap - 3) << "untouched slots";
    }
}

// gpt-oss's experts (gate/up biases per expert, clamped SwiGLU) on the route grid from fp32 gate|up,
// W4A16 (bf16 out, K-major) and W4A4: the kernel equals the twin except where expf's last ulp moves a
// bf16 rounding or an NVFP4 code (kSwigluMaxMismatchFraction).
TEST(SwigluQuant, ExpertBiasesAndClampedSwigluMatchRef) {
  std::mt19937 rng(41);
  const int E = 4, cap = 6;
  const int64_t I = 96, I_pad = padded_k(I);
  const std::vector<int32_t> counts = {6, 0, 3, 9};
  std::normal_distribution<float> nd(0.0f, 5.0f);
  std::vector<float> h(static_cast<size_t>(E) * cap * 2 * I), bias(static_cast<size_t>(E) * 2 * I);
  for (auto& v : h) v = nd(rng);
  for (auto& v : bias) v = 0.5f * nd(rng);
  const Routes routes = shuffled_routes(counts, cap, 9);
  for (bool quantize : {false, true}) {
    DevBuf<float> d_h(h), d_bias(bias), d_inv(std::vector<float>(static_cast<size_t>(E) * cap, -1.0f));
    DevBuf<uint16_t> d_out(std::vector<uint16_t>(static_cast<size_t>(E) * cap * I_pad, kPoisonBf16));
    DevBuf<int32_t> d_counts(counts), d_ids(routes.ids), d_slots(routes.slots);
    ops::SwigluQuantArgs a;
    a.h_f32 = d_h.p, a.counts = d_counts.p, a.num_experts = E, a.capacity = cap, a.I = I, a.I_pad = I_pad;
    a.quantize = quantize, a.layout = ActLayout::kKMajor, a.out = d_out.p, a.inv_scale = d_inv.p;
    a.topk_ids = d_ids.p, a.slot_of_route = d_slots.p, a.routes = static_cast<int64_t>(routes.ids.size());
    a.gate_up_bias = d_bias.p, a.clamped = true, a.alpha = 1.702f, a.limit = 7.0f;
    ops::swiglu_quant(a, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    const auto out = d_out.download();
    std::vector<uint16_t> want(out.size(), kPoisonBf16);
    std::vector<float> want_inv(static_cast<size_t>(E) * cap, -1.0f);
    a.h_f32 = h.data(), a.counts = counts.data(), a.out = want.data(), a.inv_scale = want_inv.data();
    a.topk_ids = routes.ids.data(), a.slot_of_route = routes.slots.data(), a.gate_up_bias = bias.data();
    ops::swiglu_quant_ref(a);
    size_t differ = 0, written = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      written += want[i] != kPoisonBf16;
      differ += out[i] != want[i];
    }
    EXPECT_GT(written, static_cast<size_t>(9 * I)) << "quantize=" << quantize;
    EXPECT_LE(static_cast<double>(differ), kSwigluMaxMismatchFraction * static_cast<double>(written))
        << "quantize=" << quantize << ": " << differ << " of " << written << " differ";
  }
}

// An expert-parallel shard (SwigluQuantArgs::expert_begin / end): the route grid writes the slots of
// experts [1, 3) only, those exactly as the whole grid does, and leaves every other expert's untouched.
TEST(SwigluQuant, ShardWritesOnlyItsExpertsSlots) {
  const int E = 4, cap = 8;
  const int64_t I = 64, I_pad = padded_k(I);
  const std::vector<int32_t> counts = {5, 8, 3, 6};
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> h(static_cast<size_t>(E) * cap * 2 * I);
  for (auto& v : h) v = nd(rng);
  const Routes routes = shuffled_routes(counts, cap, 13);
  auto run = [&](int64_t b, int64_t e) {
    DevBuf<float> d_h(h), d_inv(std::vector<float>(static_cast<size_t>(E) * cap, -1.0f));
    DevBuf<uint16_t> d_out(std::vector<uint16_t>(static_cast<size_t>(E) * cap * I_pad, kPoisonBf16));
    DevBuf<int32_t> d_counts(counts), d_ids(routes.ids), d_slots(routes.slots);
    ops::SwigluQuantArgs a;
    a.h_f32 = d_h.p, a.counts = d_counts.p, a.num_experts = E, a.capacity = cap, a.I = I, a.I_pad = I_pad;
    a.quantize = true, a.out = d_out.p, a.inv_scale = d_inv.p;
    a.topk_ids = d_ids.p, a.slot_of_route = d_slots.p, a.routes = static_cast<int64_t>(routes.ids.size());
    a.expert_begin = b, a.expert_end = e;
    ops::swiglu_quant(a, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    return d_out.download();
  };
  const std::vector<uint16_t> whole = run(0, -1), shard = run(1, 3);
  const size_t row = static_cast<size_t>(I_pad);
  for (int ex = 0; ex < E; ++ex)
    for (int slot = 0; slot < cap; ++slot) {
      const size_t o = (static_cast<size_t>(ex) * cap + slot) * row;
      const bool mine = ex >= 1 && ex < 3;
      for (size_t k = 0; k < row; ++k)
        ASSERT_EQ(shard[o + k], mine ? whole[o + k] : kPoisonBf16) << "expert " << ex << " slot " << slot << " k " << k;
    }
}

TEST(SwigluQuant, RejectsUnknownLayout) {
  ops::SwigluQuantArgs s;
  s.I = 64;
  s.I_pad = 256;
  s.num_experts = 1;
  s.capacity = 1;
  s.layout = static_cast<ActLayout>(2);
  EXPECT_THROW(ops::swiglu_quant(s, nullptr), moesq::Error);
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
