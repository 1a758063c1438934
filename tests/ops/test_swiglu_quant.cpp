// The CPU twin of swiglu_quant (ops/swiglu_quant): both layouts hold the same values, and
// silu(gate)·up is computed then quantized. GPU: tests/gpu/test_swiglu_quant.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "core/error.h"
#include "core/half.h"
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

}  // namespace
