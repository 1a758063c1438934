// The CPU twins of act_dispatch (ops/act_dispatch): the activation row quantizer against the format
// module's fake quant (bitwise), W4A16 permutation only, both layouts holding the same values, and the
// canonical slot order with capacity drops. GPU: tests/gpu/test_act_dispatch.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "format/fp_codecs.h"
#include "format/kernel_layout.h"
#include "format/nvfp4.h"
#include "ops/act_dispatch/act_dispatch.h"
#include "support/ops_fixtures.h"

namespace {

using namespace moesq;
using namespace moesq::format;
using namespace moesq::ops;
using namespace moesq::test;  // support/ops_fixtures.h

TEST(ActQuantRef, MatchesFormatFakeQuantBitwise) {
  std::mt19937 rng(99);
  for (int64_t K : {32, 64, 768, 2048}) {
    for (int rep = 0; rep < 5; ++rep) {
      auto x = random_rows(1, K, rng);
      if (rep == 1) for (int64_t k = 0; k < 32; ++k) x[k] = f32_to_bf16(1e-30f);  // tiny block → code 0
      if (rep == 2) x[K / 2] = f32_to_bf16(3e4f);                                  // one saturating outlier
      std::vector<float> fq(K);
      float amax = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        fq[k] = bf16_to_f32(x[k]);
        amax = std::max(amax, std::fabs(fq[k]));
      }
      format::quantize_activation_row(fq.data(), K);
      const float gamma = format::nvfp4_tensor_scale(amax);
      std::vector<uint16_t> out(padded_k(K));
      float inv = 0.0f;
      act_quant_row_ref(x.data(), K, true, out.data(), &inv);
      EXPECT_EQ(inv, 1.0f / gamma);
      for (int64_t k = 0; k < K; ++k) {
        const float v = bf16_to_f32(out[act_storage_index(k)]);
        ASSERT_EQ(v / gamma, fq[k]) << "K=" << K << " rep " << rep << " k=" << k;
      }
      for (int64_t k = K; k < padded_k(K); ++k) ASSERT_EQ(out[k], 0) << "padding at " << k;
    }
  }
}

// A static γ_a (input_global_scale, dynamic false) replaces the row's 448·6/amax: the values are
// format::nvfp4_fake_quant_blocks with that global scale, bitwise, for bf16 and fp32 rows — including
// a γ 4× the row's own, where block codes and E2M1 values saturate.
TEST(ActQuantRef, StaticGammaIsFormatFakeQuantWithThatScale) {
  std::mt19937 rng(123);
  for (int64_t K : {64, 768}) {
    const auto x = random_rows(1, K, rng);
    std::vector<float> xf(K);
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) xf[k] = bf16_to_f32(x[k]), amax = std::max(amax, std::fabs(xf[k]));
    for (float factor : {0.25f, 1.0f, 4.0f, 4096.0f}) {
      const float gamma = format::nvfp4_tensor_scale(amax) * factor;
      std::vector<float> fq = xf;
      format::nvfp4_fake_quant_blocks(fq.data(), K, 32, gamma);
      std::vector<uint16_t> out(padded_k(K)), out32(padded_k(K));
      float inv = 0.0f, inv32 = 0.0f;
      act_quant_row_ref(x.data(), K, true, out.data(), &inv, ActLayout::kMmaFragment, gamma);
      act_quant_row_f32_ref(xf.data(), K, out32.data(), &inv32, ActLayout::kMmaFragment, gamma);
      EXPECT_EQ(inv, 1.0f / gamma);
      EXPECT_EQ(inv32, 1.0f / gamma);
      EXPECT_EQ(out, out32) << "bf16 and fp32 rows hold the same values";
      int saturated = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float v = bf16_to_f32(out[act_storage_index(k)]);
        ASSERT_EQ(v / gamma, fq[k]) << "K=" << K << " factor " << factor << " k=" << k;
        saturated += std::fabs(v) == 6.0f * 448.0f;
      }
      if (factor == 4096.0f) EXPECT_GT(saturated, 0) << "the case must saturate";
    }
  }
}

TEST(ActQuantRef, W4A16OnlyPermutes) {
  std::mt19937 rng(5);
  auto x = random_rows(1, 96, rng);
  std::vector<uint16_t> out(padded_k(96));
  float inv = 0.0f;
  act_quant_row_ref(x.data(), 96, false, out.data(), &inv);
  EXPECT_EQ(inv, 1.0f);
  for (int k = 0; k < 96; ++k) EXPECT_EQ(out[act_storage_index(k)], x[k]);
}

// Both layouts hold the same bits; only their positions differ, and the padding stays zero.
TEST(ActQuantRef, KMajorHoldsTheSameValuesAsMmaFragment) {
  std::mt19937 rng(41);
  for (bool quantize : {true, false}) {
    for (int64_t K : {32, 96, 288, 2048}) {
      auto x = random_rows(1, K, rng);
      std::vector<uint16_t> frag(padded_k(K), 0xFFFF), kmaj(padded_k(K), 0xFFFF);
      float inv_frag = 0.0f, inv_kmaj = 0.0f;
      act_quant_row_ref(x.data(), K, quantize, frag.data(), &inv_frag, ActLayout::kMmaFragment);
      act_quant_row_ref(x.data(), K, quantize, kmaj.data(), &inv_kmaj, ActLayout::kKMajor);
      EXPECT_EQ(inv_kmaj, inv_frag) << "quantize=" << quantize << " K=" << K;
      const auto want = unpermute_row(frag.data(), K, ActLayout::kMmaFragment);
      const auto got = unpermute_row(kmaj.data(), K, ActLayout::kKMajor);
      bool nonzero = false;
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_EQ(got[k], want[k]) << "quantize=" << quantize << " K=" << K << " first bad k=" << k;
        nonzero |= (got[k] & 0x7FFF) != 0;
      }
      EXPECT_TRUE(nonzero);
      if (!quantize)
        for (int64_t k = 0; k < K; ++k) ASSERT_EQ(got[k], x[k]) << "W4A16 keeps the bf16 bits, k=" << k;
      for (int64_t k = K; k < padded_k(K); ++k) ASSERT_EQ(kmaj[k], 0) << "K=" << K << " padding at " << k;
      // The two layouts really differ (K ≥ 32 always has a column that step 2 moves).
      EXPECT_NE(kmaj, frag) << "quantize=" << quantize << " K=" << K;
    }
  }
}

TEST(DispatchRef, KMajorBatchMatchesMmaFragmentBatch) {
  std::mt19937 rng(12);
  const int T = 23, topk = 2, E = 4, cap = 7;  // ~11.5 routes per expert: some are dropped
  for (int64_t K : {96, 288}) {
    auto x = random_rows(T, K, rng);
    std::vector<int32_t> ids(T * topk);
    std::uniform_int_distribution<int> ed(0, E - 1);
    for (auto& v : ids) v = ed(rng);
    const ActBatch frag = act_dispatch_batch_ref(x.data(), T, K, ids.data(), topk, E, cap, true);
    const ActBatch kmaj = act_dispatch_batch_ref(x.data(), T, K, ids.data(), topk, E, cap, true, ActLayout::kKMajor);
    EXPECT_EQ(frag.layout, ActLayout::kMmaFragment);
    EXPECT_EQ(kmaj.layout, ActLayout::kKMajor);
    EXPECT_EQ(kmaj.K_pad, frag.K_pad);
    EXPECT_EQ(kmaj.counts, frag.counts);
    EXPECT_EQ(kmaj.route_of_slot, frag.route_of_slot);
    EXPECT_EQ(kmaj.inv_scale, frag.inv_scale);
    ASSERT_EQ(kmaj.x.size(), frag.x.size());
    for (size_t s = 0; s < frag.route_of_slot.size(); ++s) {
      const auto want = unpermute_row(frag.x.data() + s * frag.K_pad, K, ActLayout::kMmaFragment);
      const auto got = unpermute_row(kmaj.x.data() + s * kmaj.K_pad, K, ActLayout::kKMajor);
      ASSERT_EQ(got, want) << "K=" << K << " expert " << s / cap << " slot " << s % cap;
      for (int64_t k = K; k < kmaj.K_pad; ++k) ASSERT_EQ(kmaj.x[s * kmaj.K_pad + k], 0) << "padding at " << k;
    }
  }
}

TEST(DispatchRef, CanonicalSlotsCountsAndCapacityDrops) {
  std::mt19937 rng(11);
  const int T = 37, topk = 3, E = 5, cap = 9;
  auto x = random_rows(T, 64, rng);
  std::vector<int32_t> ids(T * topk);
  std::uniform_int_distribution<int> ed(0, E - 1);
  for (auto& v : ids) v = ed(rng);
  const ActBatch a = act_dispatch_batch_ref(x.data(), T, 64, ids.data(), topk, E, cap, true);
  std::vector<int> want(E, 0);
  for (int v : ids) ++want[v];
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(a.counts[e], want[e]);
    int prev = -1;
    for (int s = 0; s < std::min(want[e], cap); ++s) {
      const int r = a.route_of_slot[e * cap + s];
      EXPECT_EQ(ids[r], e);
      EXPECT_GT(r, prev) << "canonical order: ascending route id";
      prev = r;
    }
    for (int s = std::min(want[e], cap); s < cap; ++s) EXPECT_EQ(a.route_of_slot[e * cap + s], -1);
  }
}

// The twin on the launcher's descriptor: with x_lo and quantize each slot holds act_quant_row_f32_ref
// of x + x_lo in fp32; slot_of_route inverts route_of_slot (−1 for a dropped route); a K_pad wider than
// padded_k(K) is zero past K; slots no route fills are untouched.
TEST(DispatchRef, DescriptorWithResiduesSlotOfRouteAndWideKPad) {
  std::mt19937 rng(31);
  const int T = 13, topk = 2, E = 3, cap = 8;  // ~8.7 routes per expert: some dropped
  const int64_t K = 96, K_pad = 512;           // padded_k(96) = 256 < K_pad
  const auto x = random_rows(T, K, rng), x_lo_big = random_rows(T, K, rng);
  std::vector<uint16_t> x_lo(T * K);
  for (size_t i = 0; i < x_lo.size(); ++i) x_lo[i] = f32_to_bf16(bf16_to_f32(x_lo_big[i]) / 512);  // residue-sized
  std::vector<int32_t> ids(T * topk);
  std::uniform_int_distribution<int> ed(0, E - 1);
  for (auto& v : ids) v = ed(rng);
  constexpr uint16_t kUntouched = 0x7f7f;
  std::vector<uint16_t> out(static_cast<size_t>(E) * cap * K_pad, kUntouched);
  std::vector<float> inv(E * cap, -1.0f);
  std::vector<int32_t> counts(E, 99), ros(E * cap, -7), sor(T * topk, -7);
  DispatchArgs a;
  a.x = x.data(), a.x_lo = x_lo.data(), a.topk_ids = ids.data(), a.T = T, a.topk = topk, a.K = K, a.K_pad = K_pad;
  a.num_experts = E, a.capacity = cap, a.quantize = true, a.out = out.data(), a.inv_scale = inv.data();
  a.counts = counts.data(), a.route_of_slot = ros.data(), a.slot_of_route = sor.data();
  act_dispatch_ref(a);
  std::vector<int> want_counts(E, 0);
  for (int v : ids) ++want_counts[v];
  std::vector<float> row(K);
  std::vector<uint16_t> want(padded_k(K));
  for (int e = 0; e < E; ++e) {
    ASSERT_EQ(counts[e], want_counts[e]) << "expert " << e;
    for (int slot = 0; slot < cap; ++slot) {
      const size_t s = static_cast<size_t>(e) * cap + slot;
      if (slot >= want_counts[e]) {
        EXPECT_EQ(ros[s], -7) << "empty slot " << slot << " of expert " << e << " untouched";
        EXPECT_EQ(out[s * K_pad], kUntouched) << "empty slot " << slot << " of expert " << e << " untouched";
        continue;
      }
      const int r = ros[s];
      ASSERT_EQ(ids[r], e);
      ASSERT_EQ(sor[r], slot) << "route " << r;
      for (int64_t k = 0; k < K; ++k) row[k] = bf16_to_f32(x[(r / topk) * K + k]) + bf16_to_f32(x_lo[(r / topk) * K + k]);
      float want_inv = 0.0f;
      act_quant_row_f32_ref(row.data(), K, want.data(), &want_inv);
      EXPECT_EQ(inv[s], want_inv) << "expert " << e << " slot " << slot;
      for (int64_t k = 0; k < K_pad; ++k)
        ASSERT_EQ(out[s * K_pad + k], k < padded_k(K) ? want[k] : 0) << "expert " << e << " slot " << slot << " k=" << k;
    }
  }
  int dropped = 0;
  for (int r = 0; r < T * topk; ++r) dropped += sor[r] == -1;
  int want_dropped = 0;
  for (int e = 0; e < E; ++e) want_dropped += std::max(0, want_counts[e] - cap);
  EXPECT_EQ(dropped, want_dropped);
  EXPECT_GT(want_dropped, 0) << "the case must drop routes";
  // Without the residues the same routes land in the same slots with the bf16 rows' values.
  a.x_lo = nullptr;
  std::vector<uint16_t> out16(out.size(), kUntouched);
  a.out = out16.data();
  act_dispatch_ref(a);
  EXPECT_NE(out16, out) << "x_lo must change the quantized values";
}

}  // namespace

namespace {

// Dispatch with per-expert static γ_a: each filled slot holds act_quant_row_ref of its route's token row
// with ITS expert's γ (not the row's amax); a non-positive γ is refused naming act_gamma.
TEST(DispatchRef, StaticGammaPerExpert) {
  std::mt19937 rng(8);
  const int T = 9, topk = 2, E = 3, cap = 18;
  const int64_t K = 64;
  const auto x = random_rows(T, K, rng);
  std::vector<int32_t> ids(T * topk);
  for (int r = 0; r < T * topk; ++r) ids[r] = r % E;
  const std::vector<float> gamma = {30.0f, 300.0f, 3000.0f};
  std::vector<uint16_t> out(static_cast<size_t>(E) * cap * padded_k(K));
  std::vector<float> inv(E * cap);
  std::vector<int32_t> counts(E), ros(E * cap, -1);
  DispatchArgs a;
  a.x = x.data(), a.topk_ids = ids.data(), a.T = T, a.topk = topk, a.K = K, a.K_pad = padded_k(K);
  a.num_experts = E, a.capacity = cap, a.quantize = true, a.act_gamma = gamma.data();
  a.out = out.data(), a.inv_scale = inv.data(), a.counts = counts.data(), a.route_of_slot = ros.data();
  act_dispatch_ref(a);
  std::vector<uint16_t> want(padded_k(K));
  for (int e = 0; e < E; ++e)
    for (int slot = 0; slot < counts[e]; ++slot) {
      const size_t s = static_cast<size_t>(e) * cap + slot;
      float want_inv = 0.0f;
      act_quant_row_ref(x.data() + (ros[s] / topk) * K, K, true, want.data(), &want_inv, ActLayout::kMmaFragment,
                        gamma[e]);
      EXPECT_EQ(inv[s], 1.0f / gamma[e]) << "expert " << e;
      ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin() + s * padded_k(K))) << "expert " << e << " slot " << slot;
    }
  const std::vector<float> bad = {30.0f, 0.0f, 3000.0f};
  a.act_gamma = bad.data();
  try {
    act_dispatch_ref(a);
    FAIL() << "a zero static γ_a was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("act_gamma[1]"), std::string::npos) << err.what();
  }
}

}  // namespace
