// GPU tests of ops::act_dispatch (ops/act_dispatch) in both activation layouts (format::ActLayout,
// docs/KERNEL_LAYOUT.md §1: kMmaFragment for the mma.sp grouped GEMM, kKMajor for the wgmma.sp one) vs
// its CPU twins act_dispatch_batch_ref / act_quant_row_ref, bitwise; the device K-order table vs the host one.
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
#include "ops/act_dispatch/act_dispatch.h"
#include "ops/common/nvfp4_row.cuh"
#include "ops/moe_combine/moe_combine.h"
#include "support/gpu_test_main.h"
#include "support/ops_fixtures.h"

namespace {

using namespace moesq;
using namespace moesq::format;
using namespace moesq::ops;
using moesq::test::unpermute_row;

constexpr uint16_t kPoisonBf16 = 0xFFFF;  // a NaN: any element left unwritten stays NaN

// The device index table (nvfp4_row.cuh) and the host one (kernel_layout.cpp) are written twice: pin
// them to each other for both layouts.
TEST(ActStorageIndex, DeviceStepTableMatchesHost) {
  for (ActLayout layout : {ActLayout::kMmaFragment, ActLayout::kKMajor})
    for (int kk = 0; kk < 32; ++kk)
      ASSERT_EQ(ops::detail::act_storage_in_step(kk, static_cast<int>(layout)), act_storage_index(kk, layout))
          << act_layout_name(layout) << " kk=" << kk;
}

TEST(ActDispatch, MatchesRefPerRouteInBothLayouts) {
  std::mt19937 rng(43);
  for (const ActLayout layout : {ActLayout::kMmaFragment, ActLayout::kKMajor})
  for (bool quantize : {true, false})
  for (bool with_lo : {false, true})  // x_lo: the fp32-row quantizer (x + x_lo), W4A4 engine path
  for (bool stat : {false, true}) {     // static γ_a per expert (input_global_scale, dynamic false)
    for (int64_t K : {96, 288, 2048}) {  // 288: K_pad = 512, padding columns written as zeros
      const int T = 41, topk = 4, E = 16, cap = 12;
      std::vector<uint16_t> x(T * K);
      std::normal_distribution<float> nd(0.0f, 1.5f);
      for (auto& v : x) v = f32_to_bf16(nd(rng));
      std::vector<uint16_t> xl(T * K);
      for (size_t i = 0; i < xl.size(); ++i) xl[i] = f32_to_bf16(bf16_to_f32(x[i]) * nd(rng) / 512.0f);
      for (int64_t k = 0; k < K; ++k) x[2 * K + k] = 0;  // a zero token: γ = 1, all codes 0
      std::vector<int32_t> ids(T * topk);
      std::uniform_int_distribution<int> ed(0, E - 1);
      for (auto& v : ids) v = ed(rng);
      for (int r = 0; r < 16; ++r) ids[4 * r] = 7;  // crowd expert 7 past its capacity: drops
      const ActBatch ref = act_dispatch_batch_ref(x.data(), T, K, ids.data(), topk, E, cap, quantize, layout);
      ASSERT_EQ(ref.layout, layout);

      DevBuf<uint16_t> d_x(x), d_xl(xl), d_out(std::vector<uint16_t>(static_cast<size_t>(E) * cap * ref.K_pad, kPoisonBf16));
      DevBuf<int32_t> d_ids(ids), d_counts(E), d_ros(static_cast<size_t>(E) * cap);
      DevBuf<int32_t> d_sor(std::vector<int32_t>(static_cast<size_t>(T) * topk, -7));  // -7: never written
      DevBuf<float> d_inv(static_cast<size_t>(E) * cap);
      // Around the dynamic γ of a unit-normal row (2688/≈5), ×1/4 … ×4: some blocks saturate.
      std::vector<float> gamma(E);
      for (int e = 0; e < E; ++e) gamma[e] = 2688.0f / 5.0f * std::ldexp(1.0f, e % 5 - 2) * (1.0f + 0.1f * e);
      DevBuf<float> d_gamma(gamma);
      ops::DispatchArgs a;
      a.x = d_x.p;
      a.x_lo = with_lo ? d_xl.p : nullptr;
      a.topk_ids = d_ids.p;
      a.T = T;
      a.topk = topk;
      a.K = K;
      a.K_pad = ref.K_pad;
      a.num_experts = E;
      a.capacity = cap;
      a.quantize = quantize;
      a.layout = layout;
      a.out = d_out.p;
      a.inv_scale = d_inv.p;
      a.counts = d_counts.p;
      a.route_of_slot = d_ros.p;
      a.slot_of_route = d_sor.p;
      a.act_gamma = stat ? d_gamma.p : nullptr;
      ops::act_dispatch(a, nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      const auto out = d_out.download();
      const auto inv = d_inv.download();
      const auto counts = d_counts.download();
      const auto ros = d_ros.download();
      const auto sor = d_sor.download();
      ASSERT_GT(ref.counts[7], cap) << "the test must exercise dropped routes";
      // slot_of_route is route_of_slot inverted: every route's slot, −1 exactly for the dropped ones.
      std::vector<int32_t> want_sor(static_cast<size_t>(T) * topk);
      ops::invert_route_of_slot(ros.data(), counts.data(), E, cap, T * topk, want_sor.data());
      ASSERT_EQ(sor, want_sor);
      int64_t dropped = 0;
      for (int e = 0; e < E; ++e) dropped += std::max(ref.counts[e] - cap, 0);
      EXPECT_EQ(std::count(sor.begin(), sor.end(), -1), dropped);
      int64_t checked = 0, nonzero = 0;
      for (int e = 0; e < E; ++e) {
        ASSERT_EQ(counts[e], ref.counts[e]) << "expert " << e;
        for (int s = 0; s < std::min(counts[e], cap); ++s) {
          const size_t gs = static_cast<size_t>(e) * cap + s;
          const int r = ros[gs];
          ASSERT_TRUE(r >= 0 && r < T * topk && ids[r] == e) << "expert " << e << " slot " << s << " route " << r;
          // GPU slots are in atomic order and drop other routes than the canonical ref: compare each
          // slot with the ref row of its own route.
          std::vector<uint16_t> want(ref.K_pad);
          float want_inv = 0.0f;
          if (with_lo && quantize) {
            std::vector<float> row(K);
            for (int64_t k = 0; k < K; ++k)
              row[k] = bf16_to_f32(x[(r / topk) * K + k]) + bf16_to_f32(xl[(r / topk) * K + k]);
            act_quant_row_f32_ref(row.data(), K, want.data(), &want_inv, layout, stat ? gamma[e] : 0.0f);
          } else {
            act_quant_row_ref(x.data() + (r / topk) * K, K, quantize, want.data(), &want_inv, layout,
                              stat ? gamma[e] : 0.0f);
          }
          ASSERT_EQ(inv[gs], want_inv) << "route " << r;
          for (int64_t k = 0; k < ref.K_pad; ++k) {
            ASSERT_EQ(out[gs * ref.K_pad + k], want[k]) << act_layout_name(layout) << " quantize=" << quantize << " x_lo=" << with_lo
                                                         << " static=" << stat << " K=" << K << " expert " << e
                                                         << " route " << r << " first bad storage index " << k;
            nonzero += (want[k] & 0x7FFF) != 0;
          }
          ++checked;
        }
      }
      EXPECT_GT(checked, 0);
      EXPECT_GT(nonzero, 0);
    }
  }
}

TEST(ActDispatch, RejectsUnknownLayout) {
  ops::DispatchArgs d;
  d.K = 64;
  d.K_pad = 256;
  d.num_experts = 1;
  d.topk = 1;
  d.layout = static_cast<ActLayout>(2);
  EXPECT_THROW(ops::act_dispatch(d, nullptr), moesq::Error);
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
