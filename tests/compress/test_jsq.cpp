// Tests of JSQ (compress/jsq.h) and the pair-score support choice (compress/pair_scores.h): the
// activation editing, the range salience ss and the pattern choice on hand-checked cases, the fast ss
// against its reference-form twin on fresh random inputs, JSQ = RTN of its own support, the Wanda
// term beating magnitude on unevenly scaled inputs, and the no-rows fallback.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "compress/jsq.h"
#include "compress/pair_scores.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "support/correlated_layer.h"

namespace mc = moesq::compress;
namespace mf = moesq::format;
namespace mt = moesq::test;

namespace {

// The fast ss (one product + rank-1 corrections) and the reference form (one product per zeroed
// column) sum the same fp64 terms in different orders: relative 1e-12 of the output scale.
constexpr double kSsRelTol = 1e-12;

TEST(Jsq, ClipClampsAboveTheKthLargestMagnitude) {
  // 200 entries ±1..±200: k = floor(0.01 · 200) = 2, threshold = 2nd largest |x| = 199.
  std::vector<float> X(200);
  for (int i = 0; i < 200; ++i) X[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i + 1);
  const auto C = mc::clip_activations(X.data(), 2, 100, 0.01);
  EXPECT_EQ(C[199], -199.0f);  // x = −200 → −199
  EXPECT_EQ(C[198], 199.0f);   // 199 stays
  EXPECT_EQ(C[0], 1.0f);
  // k = 0 (100 entries · 0.005): unchanged.
  const auto U = mc::clip_activations(X.data(), 1, 100, 0.005);
  EXPECT_EQ(U, std::vector<float>(X.begin(), X.begin() + 100));
  EXPECT_THROW(mc::clip_activations(X.data(), 2, 100, 1.0), moesq::Error);
}

TEST(Jsq, RangeSalienceHandCase) {
  // X rows (1, 2), (3, −1). Row 0 of W = (1, 1): y = (3, 2); zero col 0 → (2, −1), range 3;
  // zero col 1 → (1, 3), range 2. Row 1 = (2, −1): y = (0, 7); col 0 → (−2, 1) range 3;
  // col 1 → (2, 6) range 4.
  const std::vector<float> X = {1, 2, 3, -1}, W = {1, 1, 2, -1};
  const auto ss = mc::jsq_range_salience(W.data(), 2, 2, X.data(), 2);
  EXPECT_DOUBLE_EQ(ss[0], 3.0);
  EXPECT_DOUBLE_EQ(ss[1], 2.0);
  EXPECT_DOUBLE_EQ(ss[2], 3.0);
  EXPECT_DOUBLE_EQ(ss[3], 4.0);
  EXPECT_EQ(mc::jsq_range_salience_ref(W.data(), 2, 2, X.data(), 2), ss);
}

TEST(Jsq, RangeSalienceFastMatchesReferenceForm) {
  for (uint32_t seed : {3u, 17u}) {
    const mt::CorrelatedLayer l = mt::correlated_layer(7, 32, 53, seed);
    const auto a = mc::jsq_range_salience(l.W.data(), l.N, l.K, l.X.data(), l.n);
    const auto b = mc::jsq_range_salience_ref(l.W.data(), l.N, l.K, l.X.data(), l.n);
    double scale = 0.0;
    for (double v : b) scale = std::max(scale, std::fabs(v));
    ASSERT_GT(scale, 0.0);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], kSsRelTol * scale) << "seed " << seed << " [" << i / l.K << ", " << i % l.K << "]";
  }
}

TEST(Jsq, ScoreIsWandaPlusRhoTimesRangeOnMeanRows) {
  // rows_per_mean 1 and no clipping: S = |W| · sqrt(Σx²/n) + ρ · ss on the rows themselves.
  const std::vector<float> X = {1, 2, 3, -1}, W = {1, 1, 2, -1};
  mc::JsqOptions o;
  o.rho = 2.1;
  o.clip_high = 0.0;
  o.rows_per_mean = 1;
  const auto S = mc::jsq_scores(W.data(), 2, 2, X.data(), 2, o);
  const double n0 = std::sqrt(5.0), n1 = std::sqrt(2.5);
  EXPECT_NEAR(S[0], 1 * n0 + 2.1 * 3, 1e-12);
  EXPECT_NEAR(S[1], 1 * n1 + 2.1 * 2, 1e-12);
  EXPECT_NEAR(S[2], 2 * n0 + 2.1 * 3, 1e-12);
  EXPECT_NEAR(S[3], 1 * n1 + 2.1 * 4, 1e-12);
  // rows_per_mean 2: one mean row (2, 0.5): a single row has range 0, S = Wanda term.
  o.rows_per_mean = 2;
  const auto S2 = mc::jsq_scores(W.data(), 2, 2, X.data(), 2, o);
  EXPECT_NEAR(S2[3], 1 * n1, 1e-12);
}

TEST(PairScores, KeepsTheTwoBestPairsTiesToLowerId) {
  // pairs (1+1, 5+0, 0+0, 2+2) = (2, 5, 0, 4): keep pairs 1 and 3 = pattern {1, 3} = id 4.
  // second group all equal: pattern 0 ({0, 1}).
  const std::vector<double> s = {1, 1, 5, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0};
  const auto p = mc::patterns_from_scores(s.data(), 1, 16);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], 4);
  EXPECT_EQ(p[1], 0);
  const std::vector<double> bad = {1, 1, 1, NAN, 0, 0, 0, 0};
  EXPECT_THROW(mc::patterns_from_scores(bad.data(), 1, 8), moesq::Error);
}

TEST(Jsq, PackedIsRoundToNearestOfItsSupport) {
  const mt::CorrelatedLayer l = mt::correlated_layer(16, 64, 300, 5);
  const float gamma = mf::nvfp4_tensor_scale(mf::amax_abs(l.W.data(), l.N * l.K));
  const mc::JsqResult r = mc::jsq(l.W.data(), l.N, l.K, l.X.data(), l.n, gamma);
  EXPECT_FALSE(r.fallback);
  EXPECT_EQ(mf::sparse48_patterns(r.packed), r.patterns);
  EXPECT_TRUE(mt::same_packed(r.packed, mf::sparse48_quantize(l.W.data(), l.N, l.K, r.patterns.data(), gamma)));
  // The support is the score's: recomputing it gives the same patterns.
  const auto S = mc::jsq_scores(l.W.data(), l.N, l.K, l.X.data(), l.n, {});
  EXPECT_EQ(mc::patterns_from_scores(S.data(), l.N, l.K), r.patterns);
}

TEST(Jsq, WandaTermBeatsMagnitudeOnUnevenInputs) {
  // ρ = 0 is the Wanda support + RTN; with lognormal channel scales it must beat magnitude + RTN
  // on the output error (printed below); a score that ignores X fails it.
  for (uint32_t seed : {1u, 2u}) {
    const mt::CorrelatedLayer l = mt::correlated_layer(32, 64, 400, seed);
    const float gamma = mf::nvfp4_tensor_scale(mf::amax_abs(l.W.data(), l.N * l.K));
    mc::JsqOptions o;
    o.rho = 0.0;
    const mc::JsqResult r = mc::jsq(l.W.data(), l.N, l.K, l.X.data(), l.n, gamma, o);
    const auto mag = mf::magnitude_patterns(l.W.data(), l.N, l.K);
    const double e_jsq = mt::output_rel_error(l, mt::dequantized(r.packed));
    const double e_mag = mt::output_rel_error(l, mt::dequantized(mf::sparse48_quantize(l.W.data(), l.N, l.K, mag.data(), gamma)));
    std::printf("seed %u: Wanda + RTN %.4f, magnitude + RTN %.4f\n", seed, e_jsq, e_mag);
    EXPECT_LT(e_jsq, e_mag) << "seed " << seed;
    EXPECT_GT(e_jsq, 0.0);
  }
}

TEST(Jsq, NoRowsFallsBackToMagnitude) {
  const mt::CorrelatedLayer l = mt::correlated_layer(4, 32, 1, 9);
  const mc::JsqResult r = mc::jsq(l.W.data(), l.N, l.K, nullptr, 0, 0.0f);
  EXPECT_TRUE(r.fallback);
  EXPECT_NE(r.fallback_reason.find("no calibration tokens"), std::string::npos);
  EXPECT_EQ(r.patterns, mf::magnitude_patterns(l.W.data(), l.N, l.K));
}

TEST(Jsq, BadShapeNamesTheTensor) {
  const std::vector<float> W(4 * 40, 1.0f);
  try {
    mc::jsq(W.data(), 4, 40, nullptr, 0, 0.0f, {}, "layers.0.experts.3.up_proj.weight");
    FAIL() << "K = 40 accepted";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("up_proj"), std::string::npos) << e.what();
  }
}

}  // namespace
