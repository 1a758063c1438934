// ops::gdn_conv_ref + ops::gdn_recurrence_ref (the GPU kernels' twins, src/ops/gated_deltanet) against
// the CPU mixer model::gated_deltanet_forward on fresh random inputs: several sequences in one call,
// each continuing its slot's state over calls of uneven runs; a run of T tokens equals T one-token
// calls bitwise (prefill = decode); malformed runs are refused naming the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/mixers/gated_deltanet.h"
#include "ops/gated_deltanet/gated_deltanet.h"
#include "support/expect_error.h"
#include "support/family_reference.h"

namespace {

using namespace moesq;
using moesq::test::max_abs_diff;

// Twin vs mixer: the reduction orders differ (lane/butterfly vs sequential sums, fma vs mul + add),
// values O(1) after the gated norm, dk ≤ 64: a few fp32 ulps through a 24-token recurrence.
constexpr double kMixerAtol = 2e-5;

std::vector<float> rnd(size_t n, std::mt19937& g, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// y [M, N] = x [M, K] · Wᵀ (W [N, K]) into columns [col, col + N) of a [M, ld] matrix.
void linear_into(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N, float* y, int64_t ld,
                 int64_t col) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(x[m * K + k]) * W[n * K + k];
      y[m * ld + col + n] = static_cast<float>(acc);
    }
}

struct Layer {
  model::GdnShape s;
  model::GdnWeights w;
};

Layer random_layer(int64_t nk, int64_t nv, int64_t dk, int64_t dv, int64_t kc, std::mt19937& g) {
  Layer L;
  model::GdnShape& s = L.s;
  s.hidden = 64, s.num_k_heads = nk, s.num_v_heads = nv, s.head_k_dim = dk, s.head_v_dim = dv, s.conv_kernel = kc;
  const int64_t H = s.hidden, C = s.conv_dim(), Vd = s.value_dim();
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  model::GdnWeights& w = L.w;
  w.in_proj_qkv = rnd(C * H, g, ws), w.in_proj_z = rnd(Vd * H, g, ws);
  w.in_proj_b = rnd(nv * H, g, ws), w.in_proj_a = rnd(nv * H, g, ws);
  w.conv1d = rnd(C * kc, g, 0.5f), w.dt_bias = rnd(nv, g, 0.5f), w.A_log = rnd(nv, g, 0.5f);
  w.norm = rnd(dv, g, 0.3f);
  for (float& v : w.norm) v += 1.0f;
  w.out_proj = rnd(H * Vd, g, 1.0f / std::sqrt(static_cast<float>(Vd)));
  return L;
}

// The GPU engine's order for one call: the fused projection [T, C | Vd | nv | nv], conv, recurrence
// (gated-normed o [T, Vd]), out_proj. Runs (slot, first row, rows) over x's rows [T, H].
struct OpsLayer {
  const Layer& L;
  int slots;
  std::vector<float> window, S;
  OpsLayer(const Layer& l, int n_slots) : L(l), slots(n_slots) {
    window.assign(static_cast<size_t>(slots * L.s.conv_dim() * (L.s.conv_kernel - 1)), 0.0f);
    S.assign(static_cast<size_t>(slots * L.s.num_v_heads * L.s.head_k_dim * L.s.head_v_dim), 0.0f);
  }
  std::vector<float> call(const std::vector<float>& x, const std::vector<int32_t>& start,
                          const std::vector<int32_t>& slot, bool update_state = true) {
    const model::GdnShape& s = L.s;
    const int64_t T = start.back(), H = s.hidden, C = s.conv_dim(), Vd = s.value_dim(), nv = s.num_v_heads;
    const int64_t ld = C + Vd + 2 * nv;
    std::vector<float> proj(static_cast<size_t>(T * ld)), qkv(static_cast<size_t>(T * C)), o(static_cast<size_t>(T * Vd));
    linear_into(x.data(), T, H, L.w.in_proj_qkv, C, proj.data(), ld, 0);
    linear_into(x.data(), T, H, L.w.in_proj_z, Vd, proj.data(), ld, C);
    linear_into(x.data(), T, H, L.w.in_proj_b, nv, proj.data(), ld, C + Vd);
    linear_into(x.data(), T, H, L.w.in_proj_a, nv, proj.data(), ld, C + Vd + nv);
    const ops::GdnRuns runs{start.data(), slot.data(), static_cast<int>(slot.size()), slots};
    ops::gdn_conv_ref({.x = proj.data(), .ldx = ld, .w = L.w.conv1d.data(), .window = window.data(), .out = qkv.data(),
                       .runs = runs, .C = static_cast<int>(C), .Kc = static_cast<int>(s.conv_kernel),
                       .update_state = update_state});
    ops::GdnRecurrenceArgs r;
    r.qkv = qkv.data(), r.z = proj.data() + C, r.b = proj.data() + C + Vd, r.a = proj.data() + C + Vd + nv, r.ldz = ld;
    r.A_log = L.w.A_log.data(), r.dt_bias = L.w.dt_bias.data(), r.norm = L.w.norm.data(), r.S = S.data();
    r.out = o.data(), r.runs = runs;
    r.nk = static_cast<int>(s.num_k_heads), r.dk = static_cast<int>(s.head_k_dim);
    r.nv = static_cast<int>(nv), r.dv = static_cast<int>(s.head_v_dim), r.eps = s.eps;
    r.update_state = update_state;
    ops::gdn_recurrence_ref(r);
    std::vector<float> y(static_cast<size_t>(T * H));
    linear_into(o.data(), T, Vd, L.w.out_proj, H, y.data(), H, 0);
    return y;
  }
};

TEST(GdnOps, TwinsContinueEachSlotLikeTheMixer) {
  std::mt19937 g(77);
  struct Case {
    int64_t nk, nv, dk, dv, kc;
  };
  for (const Case c : {Case{2, 4, 32, 32, 4}, Case{1, 2, 64, 64, 3}, Case{2, 2, 32, 64, 1}}) {
    const Layer L = random_layer(c.nk, c.nv, c.dk, c.dv, c.kc, g);
    const int64_t H = L.s.hidden;
    // Two sequences of 24 and 11 tokens in slots 2 and 0 of 3, over three calls of uneven runs.
    const int64_t TA = 24, TB = 11;
    const std::vector<float> xa = rnd(TA * H, g, 1.0f), xb = rnd(TB * H, g, 1.0f);
    std::vector<float> ya(TA * H), yb(TB * H);
    model::gated_deltanet_forward(L.s, L.w, xa.data(), TA, ya.data(), nullptr, 1);
    model::gated_deltanet_forward(L.s, L.w, xb.data(), TB, yb.data(), nullptr, 1);
    OpsLayer ops(L, 3);
    const int64_t cuts_a[] = {0, 9, 10, 24}, cuts_b[] = {0, 5, 5, 11};  // B has an empty run in call 2
    for (int call = 0; call < 3; ++call) {
      const int64_t a0 = cuts_a[call], a1 = cuts_a[call + 1], b0 = cuts_b[call], b1 = cuts_b[call + 1];
      std::vector<float> x(xb.begin() + b0 * H, xb.begin() + b1 * H);  // B's run first, then A's
      x.insert(x.end(), xa.begin() + a0 * H, xa.begin() + a1 * H);
      const std::vector<int32_t> start = {0, static_cast<int32_t>(b1 - b0), static_cast<int32_t>(b1 - b0 + a1 - a0)};
      const std::vector<float> y = ops.call(x, start, {0, 2});
      EXPECT_LE(max_abs_diff(y.data(), &yb[b0 * H], (b1 - b0) * H), kMixerAtol) << "call " << call << " slot 0";
      EXPECT_LE(max_abs_diff(y.data() + (b1 - b0) * H, &ya[a0 * H], (a1 - a0) * H), kMixerAtol)
          << "call " << call << " slot 2, dk " << c.dk << " dv " << c.dv;
    }
  }
}

TEST(GdnOps, ARunEqualsItsTokensOneByOneBitwise) {
  std::mt19937 g(5);
  const Layer L = random_layer(2, 4, 32, 32, 4, g);
  const int64_t T = 13, H = L.s.hidden;
  const std::vector<float> x = rnd(T * H, g, 1.0f);
  OpsLayer whole(L, 1), steps(L, 1);
  const std::vector<float> y = whole.call(x, {0, static_cast<int32_t>(T)}, {0});
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    const std::vector<float> yt = steps.call(xt, {0, 1}, {0});
    ASSERT_EQ(0, std::memcmp(yt.data(), &y[t * H], sizeof(float) * H)) << "token " << t;
  }
  EXPECT_EQ(whole.S, steps.S);
  EXPECT_EQ(whole.window, steps.window);
}

// The engine's eager decode step before a graph capture: the same outputs, the states left as they were.
TEST(GdnOps, WithoutStateUpdateTheOutputsAreTheSameAndTheStatesStay) {
  std::mt19937 g(11);
  const Layer L = random_layer(2, 4, 32, 32, 4, g);
  const int64_t H = L.s.hidden;
  OpsLayer a(L, 2), b(L, 2);
  const std::vector<float> x0 = rnd(5 * H, g, 1.0f), x1 = rnd(2 * H, g, 1.0f);
  a.call(x0, {0, 3, 5}, {1, 0});
  b.call(x0, {0, 3, 5}, {1, 0});
  const std::vector<float> window = b.window, S = b.S;
  const std::vector<float> kept = b.call(x1, {0, 1, 2}, {0, 1}, /*update_state=*/false);
  EXPECT_EQ(b.window, window);
  EXPECT_EQ(b.S, S);
  const std::vector<float> moved = a.call(x1, {0, 1, 2}, {0, 1});
  ASSERT_EQ(0, std::memcmp(kept.data(), moved.data(), sizeof(float) * kept.size()));
  EXPECT_NE(a.S, S);
  EXPECT_NE(a.window, window);
}

TEST(GdnOps, MalformedRunsAndShapesAreRefused) {
  std::vector<float> x(8 * 4), w(8 * 4), win(2 * 8 * 3), out(8 * 4);
  const std::vector<int32_t> start = {0, 2, 4}, twice = {1, 1}, outside = {0, 2};
  ops::GdnConvArgs a{.x = x.data(), .ldx = 8, .w = w.data(), .window = win.data(), .out = out.data(),
                     .runs = {start.data(), twice.data(), 2, 2}, .C = 8, .Kc = 4};
  EXPECT_ERROR_CONTAINING(ops::gdn_conv_ref(a), "slot 1 has two runs");
  a.runs = {start.data(), outside.data(), 2, 2};
  EXPECT_ERROR_CONTAINING(ops::gdn_conv_ref(a), "slot 2 outside [0, 2)");
  a.Kc = 9;
  EXPECT_ERROR_CONTAINING(ops::gdn_conv_ref(a), "conv kernel 9");
  ops::GdnRecurrenceArgs r;
  r.dk = 48, r.dv = 32, r.nk = 1, r.nv = 1, r.ldz = 32;
  EXPECT_ERROR_CONTAINING(ops::gdn_recurrence_check(r), "key head dim 48");
}

}  // namespace
