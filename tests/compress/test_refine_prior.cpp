// The prior initialization of the pattern logits (paper 002 §3.2, Eq. 2 init), one element at a time
// (ops::gumbel::prior_logit, which the GPU refinement draws with):
//   * refine::prior_logits keeps the bits of its first version (the formula written out below, over
//     the ρ tables of refine/gumbel_mask.h), so CPU refinements are unchanged;
//   * the twin ops::gumbel_prior_logits_ref gives the same bits, and names a bad pattern id;
//   * the overlap table agrees with ρ, and the prior pattern carries the largest mean logit.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "compress/refine/gumbel_mask.h"
#include "core/error.h"
#include "ops/gumbel_support/gumbel_support.h"

namespace {

using namespace moesq;
using namespace moesq::compress::refine;

// The first version of prior_logits (session 9), kept here as the specification of its bits.
std::vector<float> first_version(const std::vector<uint8_t>& prior, double sigma, double s, uint64_t key) {
  const int64_t R = static_cast<int64_t>(prior.size());
  std::vector<float> A(static_cast<size_t>(R * kNumPatterns));
  for (int64_t r = 0; r < R; ++r) {
    const int pr = prior[r];
    std::array<double, kNumPatterns> overlap{};
    double mean = 0.0;
    for (int p = 0; p < kNumPatterns; ++p) {
      for (int j = 0; j < kGroup; ++j) overlap[p] += kPatternRho[pr][j] * kPatternRho[p][j];
      mean += overlap[p] / kNumPatterns;
    }
    for (int p = 0; p < kNumPatterns; ++p) {
      const uint64_t i = static_cast<uint64_t>(r * kNumPatterns + p);
      const double u1 = rng_uniform(key, 2 * i), u2 = rng_uniform(key, 2 * i + 1);
      const double eps = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      A[static_cast<size_t>(i)] = static_cast<float>(sigma * (eps + s * (overlap[p] - mean)));
    }
  }
  return A;
}

std::vector<uint8_t> random_prior(int64_t R, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> prior(static_cast<size_t>(R));
  for (auto& p : prior) p = static_cast<uint8_t>(gen() % kNumPatterns);
  return prior;
}

TEST(RefinePrior, OverlapTableAgreesWithRho) {
  for (int p = 0; p < kNumPatterns; ++p)
    for (int q = 0; q < kNumPatterns; ++q) {
      int shared = 0;
      for (int j = 0; j < kGroup; ++j) shared += kPatternRho[p][j] * kPatternRho[q][j];
      EXPECT_EQ(ops::gumbel::pattern_overlap(p, q), shared) << p << " " << q;
    }
}

TEST(RefinePrior, LogitsKeepTheFirstVersionsBitsAndTheTwinGivesThem) {
  for (const int64_t R : {int64_t{1}, int64_t{7}, int64_t{4099}}) {
    const std::vector<uint8_t> prior = random_prior(R, static_cast<uint32_t>(R));
    for (const double sigma : {0.01, 1.0}) {
      const double s = 3.0;
      const uint64_t key = rng_key(42, static_cast<uint64_t>(R), kRngPriorInit, 0, 1);
      const std::vector<float> want = first_version(prior, sigma, s, key);
      std::vector<float> got(want.size()), twin(want.size());
      prior_logits(prior.data(), R, sigma, s, key, got.data());
      ops::gumbel_prior_logits_ref({.R = R, .prior = prior.data(), .sigma = sigma, .s = s, .key = key, .A = twin.data()});
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << "R=" << R << " sigma=" << sigma << " element " << i;
        ASSERT_EQ(twin[i], want[i]) << "R=" << R << " sigma=" << sigma << " element " << i;
      }
    }
  }
}

TEST(RefinePrior, ThePriorPatternLeadsAndTheNoiseIsStandardNormal) {
  // With s = 3: the prior pattern's logit is σ(ε + 6), a one-pair neighbour's σ(ε), the disjoint one's
  // σ(ε − 6); over many groups the means are those and the noise has unit variance.
  const int64_t R = 20000;
  const std::vector<uint8_t> prior(static_cast<size_t>(R), 2);
  std::vector<float> A(static_cast<size_t>(R * kNumPatterns));
  prior_logits(prior.data(), R, 1.0, 3.0, rng_key(7, 0, kRngPriorInit, 0, 0), A.data());
  std::array<double, kNumPatterns> mean{};
  double var = 0.0;
  for (int64_t r = 0; r < R; ++r)
    for (int p = 0; p < kNumPatterns; ++p) mean[p] += A[r * kNumPatterns + p] / static_cast<double>(R);
  for (int64_t r = 0; r < R; ++r)
    for (int p = 0; p < kNumPatterns; ++p) {
      const double d = A[r * kNumPatterns + p] - mean[p];
      var += d * d / static_cast<double>(R * kNumPatterns);
    }
  for (int p = 0; p < kNumPatterns; ++p) {
    const double want = 3.0 * (ops::gumbel::pattern_overlap(2, p) - 2.0);
    EXPECT_NEAR(mean[p], want, 0.05) << "pattern " << p;  // 5 σ/√R ≈ 0.035
  }
  EXPECT_NEAR(var, 1.0, 0.03);
}

TEST(RefinePrior, TwinNamesABadPatternId) {
  std::vector<uint8_t> prior = {0, 5, 6};
  std::vector<float> A(prior.size() * kNumPatterns);
  try {
    ops::gumbel_prior_logits_ref({.R = 3, .prior = prior.data(), .sigma = 1.0, .s = 1.0, .key = 1, .A = A.data()});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pattern id 6 of group 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::gumbel_prior_logits_ref({.R = 3, .prior = nullptr, .A = A.data()}), Error);
}

}  // namespace
