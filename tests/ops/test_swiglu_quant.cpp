// The CPU twin of swiglu_quant (ops/swiglu_quant): both layouts hold the same values, and
// silu(gate)·up is computed then quantized. GPU: tests/gpu/test_swiglu_quant.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "core/swiglu.h"
#include "format/fp_codecs.h"
#include "format/kernel_layout.h"
#include "format/nvfp4.h"
#include "ops/swiglu_quant/swiglu_quant.h"
#include "support/ops_fixtures.h"

namespace {

using namespace moesq;
using namespace moesq::format;
using namespace moesq::ops;
using namespace moesq::test;  // support/ops_fixtures.h

TEST(SwigluQuantRef, KMajorHoldsTheSameValuesAsMmaFragment) {
  std::mt19937 rng(9);
  const int E = 3, cap = 4;
  for (bool quantize : {true, false}) {
    for (int64_t I : {64, 288}) {
      auto h = random_rows(E * cap, 2 * I, rng);
      const std::vector<int32_t> counts = {4, 0, 6};  // full, empty, over capacity
      const ActBatch frag = swiglu_quant_batch_ref(h, E, cap, I, counts, quantize);
      const ActBatch kmaj = swiglu_quant_batch_ref(h, E, cap, I, counts, quantize, ActLayout::kKMajor);
      EXPECT_EQ(kmaj.layout, ActLayout::kKMajor);
      EXPECT_EQ(kmaj.counts, frag.counts);
      EXPECT_EQ(kmaj.inv_scale, frag.inv_scale);
      int64_t nonzero = 0;
      for (size_t s = 0; s < static_cast<size_t>(E) * cap; ++s) {
        const auto want = unpermute_row(frag.x.data() + s * frag.K_pad, I, ActLayout::kMmaFragment);
        const auto got = unpermute_row(kmaj.x.data() + s * kmaj.K_pad, I, ActLayout::kKMajor);
        ASSERT_EQ(got, want) << "quantize=" << quantize << " I=" << I << " expert " << s / cap << " slot " << s % cap;
        for (uint16_t v : got) nonzero += (v & 0x7FFF) != 0;
        for (int64_t k = I; k < kmaj.K_pad; ++k) ASSERT_EQ(kmaj.x[s * kmaj.K_pad + k], 0) << "padding at " << k;
      }
      EXPECT_GT(nonzero, 0);
    }
  }
}

TEST(SwigluQuantRef, SiluTimesUpThenQuantized) {
  std::mt19937 rng(8);
  const int E = 2, cap = 3;
  const int64_t I = 64;
  auto h = random_rows(E * cap, 2 * I, rng);
  std::vector<int32_t> counts = {2, 0};
  const ActBatch a = swiglu_quant_batch_ref(h, E, cap, I, counts, false);
  for (int s = 0; s < 2; ++s) {
    for (int64_t i = 0; i < I; ++i) {
      const float g = bf16_to_f32(h[s * 2 * I + i]), u = bf16_to_f32(h[s * 2 * I + I + i]);
      const float want = round_bf16(g / (1.0f + std::exp(-g)) * u);
      EXPECT_EQ(bf16_to_f32(a.x[s * a.K_pad + act_storage_index(i)]), want);
    }
  }
  for (int64_t k = 0; k < a.K_pad; ++k) EXPECT_EQ(a.x[2 * a.K_pad + k], 0) << "slot past count untouched";
}

// The twin on the launcher's descriptor: the route grid fills the same slots with the same bits as the
// E × capacity grid; from fp32 gate|up with quantize the product stays fp32 into act_quant_row_f32_ref.
TEST(SwigluQuantRef, RouteGridAndFp32InputOnTheDescriptor) {
  std::mt19937 rng(21);
  const int E = 3, cap = 5;
  const int64_t I = 96, I_pad = 512;  // padded_k(96) = 256 < I_pad
  const std::vector<int32_t> counts = {5, 2, 7};  // full, partial, over capacity
  std::vector<float> hf(static_cast<size_t>(E) * cap * 2 * I);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& v : hf) v = nd(rng);
  // Routes naming every filled slot once, in a shuffled order, plus one dropped route.
  std::vector<int32_t> topk_ids, slot_of_route;
  for (int e = 0; e < E; ++e)
    for (int slot = 0; slot < std::min(counts[e], cap); ++slot) topk_ids.push_back(e), slot_of_route.push_back(slot);
  topk_ids.push_back(1), slot_of_route.push_back(-1);
  std::vector<size_t> perm(topk_ids.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> ids_p, sor_p;
  for (size_t i : perm) ids_p.push_back(topk_ids[i]), sor_p.push_back(slot_of_route[i]);
  const std::vector<float> act_gamma = {40.0f, 400.0f, 4000.0f};  // static γ_a per expert (dynamic false)
  for (bool stat : {false, true})
  for (bool quantize : {true, false}) {
    constexpr uint16_t kUntouched = 0x7f7f;
    std::vector<uint16_t> grid(static_cast<size_t>(E) * cap * I_pad, kUntouched), routes = grid;
    std::vector<float> inv_grid(E * cap, -1.0f), inv_routes = inv_grid;
    SwigluQuantArgs a;
    a.h_f32 = hf.data(), a.counts = counts.data(), a.num_experts = E, a.capacity = cap, a.I = I, a.I_pad = I_pad;
    a.quantize = quantize, a.out = grid.data(), a.inv_scale = inv_grid.data();
    a.act_gamma = stat ? act_gamma.data() : nullptr;
    swiglu_quant_ref(a);
    a.out = routes.data(), a.inv_scale = inv_routes.data();
    a.topk_ids = ids_p.data(), a.slot_of_route = sor_p.data(), a.routes = static_cast<int64_t>(ids_p.size());
    swiglu_quant_ref(a);
    EXPECT_EQ(routes, grid) << "quantize=" << quantize << " static=" << stat;
    EXPECT_EQ(inv_routes, inv_grid) << "quantize=" << quantize;
    // An expert-parallel shard [1, 2): expert 1's slots as the whole grid's, the others untouched.
    std::vector<uint16_t> shard(grid.size(), kUntouched);
    std::vector<float> inv_shard(inv_grid.size(), -1.0f);
    a.out = shard.data(), a.inv_scale = inv_shard.data(), a.expert_begin = 1, a.expert_end = 2;
    swiglu_quant_ref(a);
    a.expert_begin = 0, a.expert_end = -1;
    for (int e = 0; e < E; ++e)
      for (int slot = 0; slot < cap; ++slot) {
        const size_t s = static_cast<size_t>(e) * cap + slot;
        const bool want_written = e == 1 && slot < std::min(counts[e], cap);
        EXPECT_EQ(shard[s * I_pad], want_written ? grid[s * I_pad] : kUntouched) << "shard, expert " << e << " slot " << slot;
        EXPECT_EQ(inv_shard[s], want_written ? inv_grid[s] : -1.0f) << "shard, expert " << e << " slot " << slot;
      }
    std::vector<float> row(I);
    std::vector<uint16_t> row16(I), want(padded_k(I));
    for (int e = 0; e < E; ++e)
      for (int slot = 0; slot < cap; ++slot) {
        const size_t s = static_cast<size_t>(e) * cap + slot;
        if (slot >= std::min(counts[e], cap)) {
          EXPECT_EQ(grid[s * I_pad], kUntouched) << "slot past the count untouched";
          continue;
        }
        for (int64_t i = 0; i < I; ++i) {
          const float g = hf[s * 2 * I + i], u = hf[s * 2 * I + I + i];
          row[i] = g / (1.0f + std::exp(-g)) * u;
          row16[i] = f32_to_bf16(row[i]);
        }
        float want_inv = 0.0f;
        if (quantize)
          act_quant_row_f32_ref(row.data(), I, want.data(), &want_inv, ActLayout::kMmaFragment, stat ? act_gamma[e] : 0.0f);
        else act_quant_row_ref(row16.data(), I, false, want.data(), &want_inv);
        EXPECT_EQ(inv_grid[s], want_inv) << "quantize=" << quantize << " expert " << e << " slot " << slot;
        for (int64_t k = 0; k < I_pad; ++k)
          ASSERT_EQ(grid[s * I_pad + k], k < padded_k(I) ? want[k] : 0)
              << "quantize=" << quantize << " expert " << e << " slot " << slot << " k=" << k;
      }
  }
}

// gpt-oss's experts: expert e's gate and up biases are added first, then the clamped SwiGLU (gates and
// ups well past the limit, so both clamps act), rounded to bf16 (W4A16 path: quantize false) in the
// K-major order; each expert reads its own biases (distinct per expert here).
TEST(SwigluQuantRef, ExpertBiasesThenClampedSwiglu) {
  std::mt19937 rng(23);
  const int E = 3, cap = 4;
  const int64_t I = 64, I_pad = padded_k(I);
  const std::vector<int32_t> counts = {4, 1, 3};
  std::normal_distribution<float> nd(0.0f, 6.0f);
  std::vector<float> hf(static_cast<size_t>(E) * cap * 2 * I), bias(static_cast<size_t>(E) * 2 * I);
  for (auto& v : hf) v = nd(rng);
  for (auto& v : bias) v = 0.5f * nd(rng);
  std::vector<uint16_t> out(static_cast<size_t>(E) * cap * I_pad, 0x7f7f);
  std::vector<float> inv(E * cap, -1.0f);
  SwigluQuantArgs a;
  a.h_f32 = hf.data(), a.counts = counts.data(), a.num_experts = E, a.capacity = cap, a.I = I, a.I_pad = I_pad;
  a.quantize = false, a.layout = ActLayout::kKMajor, a.out = out.data(), a.inv_scale = inv.data();
  a.gate_up_bias = bias.data(), a.clamped = true, a.alpha = 1.702f, a.limit = 7.0f;
  swiglu_quant_ref(a);
  int clamped_g = 0, clamped_u = 0;
  for (int e = 0; e < E; ++e)
    for (int slot = 0; slot < counts[e]; ++slot) {
      const size_t s = static_cast<size_t>(e) * cap + slot;
      for (int64_t i = 0; i < I; ++i) {
        const float g = hf[s * 2 * I + i] + bias[e * 2 * I + i], u = hf[s * 2 * I + I + i] + bias[e * 2 * I + I + i];
        clamped_g += g > 7.0f, clamped_u += std::fabs(u) > 7.0f;
        const float want = (std::clamp(u, -7.0f, 7.0f) + 1.0f) * (std::min(g, 7.0f) * sigmoid(1.702f * std::min(g, 7.0f)));
        ASSERT_EQ(out[s * I_pad + act_storage_index(i, ActLayout::kKMajor)], f32_to_bf16(want))
            << "expert " << e << " slot " << slot << " column " << i;
      }
    }
  EXPECT_GT(clamped_g, 10);
  EXPECT_GT(clamped_u, 10);
  // Without the clamp, the same biases feed plain SwiGLU.
  a.clamped = false;
  swiglu_quant_ref(a);
  const float g0 = hf[0] + bias[0], u0 = hf[I] + bias[I];
  EXPECT_EQ(out[act_storage_index(0, ActLayout::kKMajor)], f32_to_bf16(silu_mul(g0, u0)));
}

}  // namespace
