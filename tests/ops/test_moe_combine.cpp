// CPU tests of the combine's twin (ops::moe_combine_ref) and of invert_route_of_slot, the logic the
// GPU kernel is compared against bitwise (tests/gpu/test_engine_ops.cu): the fixed order makes the
// result independent of where the dispatch put a route inside its expert, dropped routes add nothing,
// and the value is Σ_j w_j · y_j within fp32 rounding of an fp64 sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/moe_combine/moe_combine.h"
#include "support/random_routing.h"

namespace {

using moesq::ops::MoeCombineArgs;

// k fp32 products summed in fp32 vs fp64: k roundings of magnitude ≤ Σ|w·y|.
constexpr double kCombineRelTol = 1e-6;

struct Routing {
  int E = 12, k = 4, cap = 0;
  int64_t T = 0, H = 0, ldy = 0;
  std::vector<int32_t> ids, counts, ros, sor;  // [T, k], [E], [E, cap], [T, k]
  std::vector<float> w;                        // [T, k]
  std::vector<uint16_t> y;                     // [E, cap, ldy]
};

// Random distinct top-k ids per token; each expert's routes in a shuffled slot order; the routes of
// expert `drop_expert` past `keep` are dropped (not in any slot).
Routing make_routing(int64_t T, int64_t H, uint64_t seed, int drop_expert, int keep) {
  Routing r;
  r.T = T, r.H = H, r.ldy = H + 4, r.cap = static_cast<int>(T);
  std::mt19937_64 g(seed);
  moesq::test::RandomRouting rr = moesq::test::random_routing(T, r.E, r.k, r.cap, g, drop_expert, keep < 0 ? 0 : keep);
  r.ids = std::move(rr.ids), r.counts = std::move(rr.counts), r.ros = std::move(rr.ros), r.sor = std::move(rr.sor);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.05f, 0.5f);
  r.w.resize(T * r.k);
  for (auto& v : r.w) v = ud(g);
  r.y.resize(static_cast<size_t>(r.E) * r.cap * r.ldy);
  for (auto& v : r.y) v = moesq::f32_to_bf16(nd(g));
  return r;
}

std::vector<float> combine(const Routing& r, const std::vector<uint16_t>& y, const std::vector<int32_t>& sor,
                           const std::vector<float>& h0, const float* down_bias = nullptr) {
  std::vector<float> h = h0;
  MoeCombineArgs a;
  a.down_bias = down_bias;
  a.y = y.data(), a.topk_ids = r.ids.data(), a.topk_w = r.w.data(), a.slot_of_route = sor.data(), a.h = h.data();
  a.T = r.T, a.H = r.H, a.ldy = r.ldy, a.topk = r.k, a.num_experts = r.E, a.capacity = r.cap;
  moesq::ops::moe_combine_ref(a);
  return h;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// With fused_norm the twin is the combine, then rmsnorm_ref of h's rows (the GPU kernel runs rmsnorm's
// row code in the same CTA; bitwise against the two kernels in tests/gpu/test_engine_ops.cu); a norm
// over another buffer, or other rows, is refused.
TEST(MoeCombineRef, FusedNormIsTheCombineThenTheNorm) {
  const Routing r = make_routing(21, 24, 4, 2, 2);
  const std::vector<float> h0(r.T * r.H, 0.5f);
  std::vector<float> nw(r.H);
  for (int64_t c = 0; c < r.H; ++c) nw[c] = 0.5f + 0.01f * static_cast<float>(c);
  std::vector<float> h = h0;
  std::vector<uint16_t> y(r.T * r.H), y_lo(r.T * r.H);
  moesq::ops::RmsNormArgs n;
  n.x = h.data(), n.w = nw.data(), n.y = y.data(), n.y_lo = y_lo.data(), n.n = r.T, n.D = r.H, n.eps = 1e-6;
  MoeCombineArgs a;
  a.y = r.y.data(), a.topk_ids = r.ids.data(), a.topk_w = r.w.data(), a.slot_of_route = r.sor.data(), a.h = h.data();
  a.T = r.T, a.H = r.H, a.ldy = r.ldy, a.topk = r.k, a.num_experts = r.E, a.capacity = r.cap, a.fused_norm = &n;
  moesq::ops::moe_combine_ref(a);
  std::vector<float> h2 = combine(r, r.y, r.sor, h0);
  EXPECT_EQ(h, h2);
  std::vector<uint16_t> y2(r.T * r.H), y2_lo(r.T * r.H);
  moesq::ops::RmsNormArgs n2 = n;
  n2.x = h2.data(), n2.y = y2.data(), n2.y_lo = y2_lo.data();
  moesq::ops::rmsnorm_ref(n2);
  EXPECT_EQ(y, y2);
  EXPECT_EQ(y_lo, y2_lo);
  n.x = h2.data();  // another buffer's rows
  EXPECT_THROW(moesq::ops::moe_combine_ref(a), moesq::Error);
  n.x = h.data(), n.n = r.T - 1;  // not all T rows
  EXPECT_THROW(moesq::ops::moe_combine_ref(a), moesq::Error);
}

}  // namespace

TEST(MoeCombineRef, InvertRouteOfSlotIsTheInverse) {
  const Routing r = make_routing(9, 16, 1, 5, 1);
  int64_t dropped = 0;
  for (int64_t q = 0; q < r.T * r.k; ++q) {
    const int s = r.sor[q];
    if (s < 0) {
      ++dropped;
      EXPECT_EQ(r.ids[q], 5) << "only expert 5 drops routes";
      continue;
    }
    ASSERT_LT(s, r.counts[r.ids[q]]);
    EXPECT_EQ(r.ros[static_cast<int64_t>(r.ids[q]) * r.cap + s], q) << "route " << q;
  }
  EXPECT_GT(dropped, 0);
}

TEST(MoeCombineRef, InvertRejectsARouteOutOfRange) {
  const std::vector<int32_t> ros = {0, 7}, counts = {2};
  std::vector<int32_t> sor(4);
  EXPECT_THROW(moesq::ops::invert_route_of_slot(ros.data(), counts.data(), 1, 2, 4, sor.data()), moesq::Error);
}

// Moving routes to other slots (the dispatch's atomic order) changes no bit of h.
TEST(MoeCombineRef, BitsDoNotDependOnSlotOrder) {
  const Routing r = make_routing(21, 40, 2, -1, 0);
  std::vector<float> h0(r.T * r.H);
  std::mt19937_64 g(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : h0) v = nd(g);
  const std::vector<float> h1 = combine(r, r.y, r.sor, h0);
  // Reverse every expert's slots, moving the y rows with them.
  std::vector<uint16_t> y2(r.y.size());
  std::vector<int32_t> sor2 = r.sor;
  for (int e = 0; e < r.E; ++e)
    for (int s = 0; s < r.counts[e]; ++s) {
      const int s2 = r.counts[e] - 1 - s;
      std::copy_n(r.y.begin() + (static_cast<int64_t>(e) * r.cap + s) * r.ldy, r.ldy,
                  y2.begin() + (static_cast<int64_t>(e) * r.cap + s2) * r.ldy);
      sor2[r.ros[static_cast<int64_t>(e) * r.cap + s]] = s2;
    }
  const std::vector<float> h2 = combine(r, y2, sor2, h0);
  for (size_t i = 0; i < h1.size(); ++i) ASSERT_EQ(bits(h1[i]), bits(h2[i])) << "element " << i;
  EXPECT_NE(h1, h0);
}

// h += Σ over the kept routes of w · y (fp64 reference), dropped routes contribute nothing.
TEST(MoeCombineRef, SumsTheKeptRoutes) {
  const Routing r = make_routing(17, 24, 4, 2, 2);
  const std::vector<float> h0(r.T * r.H, 0.5f);
  const std::vector<float> h = combine(r, r.y, r.sor, h0);
  for (int64_t t = 0; t < r.T; ++t)
    for (int64_t c = 0; c < r.H; ++c) {
      double want = 0.0, mag = 0.0;
      for (int j = 0; j < r.k; ++j) {
        const int64_t q = t * r.k + j;
        if (r.sor[q] < 0) continue;
        const double v = static_cast<double>(r.w[q]) *
                         moesq::bf16_to_f32(r.y[(static_cast<int64_t>(r.ids[q]) * r.cap + r.sor[q]) * r.ldy + c]);
        want += v, mag += std::fabs(v);
      }
      const double got = static_cast<double>(h[t * r.H + c]) - 0.5;
      ASSERT_NEAR(got, want, kCombineRelTol * (mag + 0.5)) << "token " << t << " col " << c;
    }
}

// gpt-oss's down biases: h += Σ over the kept routes of w · (y + bias[e]) (fp64 reference); a dropped
// route adds neither its output nor its bias.
TEST(MoeCombineRef, AddsEachKeptRoutesDownBias) {
  const Routing r = make_routing(13, 24, 6, 2, 2);
  std::vector<float> bias(static_cast<size_t>(r.E) * r.H);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  const std::vector<float> h0(r.T * r.H, 0.5f);
  const std::vector<float> h = combine(r, r.y, r.sor, h0, bias.data());
  int dropped = 0;
  for (int64_t t = 0; t < r.T; ++t)
    for (int64_t c = 0; c < r.H; ++c) {
      double want = 0.0, mag = 0.0;
      for (int j = 0; j < r.k; ++j) {
        const int64_t q = t * r.k + j;
        if (r.sor[q] < 0) {
          dropped += c == 0;
          continue;
        }
        const double y = moesq::bf16_to_f32(r.y[(static_cast<int64_t>(r.ids[q]) * r.cap + r.sor[q]) * r.ldy + c]);
        const double v = static_cast<double>(r.w[q]) * (y + bias[static_cast<size_t>(r.ids[q]) * r.H + c]);
        want += v, mag += std::fabs(v);
      }
      ASSERT_NEAR(static_cast<double>(h[t * r.H + c]) - 0.5, want, kCombineRelTol * (mag + 0.5)) << "token " << t << " col " << c;
    }
  EXPECT_GT(dropped, 0);
}
