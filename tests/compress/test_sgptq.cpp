// Tests of SGPTQ (compress/sgptq.h): it must beat magnitude + RTN on the calibration outputs of a
// layer with correlated inputs, emit a valid paired 4:8 NVFP4 tensor whose unpacked values are the
// ones it reports, fall back (finite, documented) without usable calibration data, handle dead
// inputs, and be deterministic. Inputs are fresh Gaussians with fixed seeds.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "compress/hessian.h"
#include "compress/sgptq.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "support/correlated_layer.h"

namespace mc = moesq::compress;
namespace mf = moesq::format;

namespace {

// SGPTQ must cut the relative calibration-output error of magnitude + RTN by at least this factor
// on the correlated synthetic layer. Measured 0.572 here (0.49–0.59 over 6 seeds and both expert
// shapes); with error propagation switched off (percdamp 1e6) SGPTQ degenerates to exactly
// magnitude + RTN (ratio 1.0), so 0.8 fails a broken propagation but tolerates tuning changes.
constexpr double kMinImprovement = 0.8;
// The lazy (BLAS, block 128) path and the plain-loop twin differ only in fp64 summation order;
// a handful of E2M1 roundings may flip at ties, so the output errors agree to 1 % and ≥ 99 % of
// the value codes are identical.
constexpr double kRefErrorRelTol = 0.01;
constexpr double kRefMinSameCodes = 0.99;

std::vector<float> gaussian(size_t count, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

// The correlated synthetic layer and its output error (tests/support/correlated_layer.h, shared with
// the JSQ/OBR tests; output_rel_error is found by argument-dependent lookup).
using Layer = moesq::test::CorrelatedLayer;
Layer make_layer(int64_t N, int64_t K, int64_t n, uint32_t seed) { return moesq::test::correlated_layer(N, K, n, seed); }

std::vector<float> dequant(const mf::Sparse48Tensor& t) {
  std::vector<float> out(t.N * t.K);
  mf::sparse48_dequantize(t, out.data());
  return out;
}

float tensor_scale(const std::vector<float>& W) {
  float amax = 0.0f;
  for (float w : W) amax = std::max(amax, std::fabs(w));
  return mf::nvfp4_tensor_scale(amax);
}

// Magnitude pattern + NVFP4 round-to-nearest: the baseline and the fallback's definition.
mf::Sparse48Tensor magnitude_rtn(const std::vector<float>& W, int64_t N, int64_t K, float gamma) {
  const auto pat = mf::magnitude_patterns(W.data(), N, K);
  return mf::sparse48_quantize(W.data(), N, K, pat.data(), gamma);
}

bool same_bytes(const mf::Sparse48Tensor& a, const mf::Sparse48Tensor& b) {
  return a.N == b.N && a.K == b.K && a.values == b.values && a.meta == b.meta &&
         a.scales == b.scales && std::memcmp(&a.global_scale, &b.global_scale, sizeof(float)) == 0;
}

// Valid paired 4:8: each group of the unpacked tensor is zero outside the two kept pairs of its
// pattern, the patterns read back from the metadata equal the reported ones, and the reported
// dense_rounded equals the unpacked value at every kept position, bit for bit.
void expect_valid_sparse48(const mc::SgptqResult& r, int64_t N, int64_t K) {
  ASSERT_EQ(r.patterns.size(), static_cast<size_t>(N * K / 8));
  ASSERT_EQ(r.dense_rounded.size(), static_cast<size_t>(N * K));
  EXPECT_EQ(mf::sparse48_patterns(r.packed), r.patterns);
  const auto D = dequant(r.packed);
  int64_t nonzero = 0;
  for (int64_t row = 0; row < N; ++row)
    for (int64_t g = 0; g < K / 8; ++g) {
      const int p = r.patterns[row * (K / 8) + g];
      ASSERT_LT(p, mf::kNumPatterns) << "row " << row << " group " << g;
      const uint8_t mask = mf::pattern_mask8(p);
      for (int j = 0; j < 8; ++j) {
        const int64_t idx = row * K + g * 8 + j;
        ASSERT_TRUE(std::isfinite(D[idx])) << "row " << row << " col " << g * 8 + j;
        if (!(mask >> j & 1)) {
          ASSERT_EQ(D[idx], 0.0f) << "pruned position not zero: row " << row << " col " << g * 8 + j;
        } else {
          ASSERT_EQ(std::memcmp(&D[idx], &r.dense_rounded[idx], sizeof(float)), 0)
              << "row " << row << " col " << g * 8 + j << ": unpacked " << D[idx]
              << " vs dense_rounded " << r.dense_rounded[idx];
          nonzero += D[idx] != 0.0f;
        }
      }
    }
  EXPECT_GT(nonzero, N * K / 4) << "almost all kept values are zero";
  EXPECT_DOUBLE_EQ(mf::bits_per_weight(r.packed.packed_bytes() - 4, N, K), 2.75);
}

}  // namespace

TEST(Sgptq, BeatsMagnitudeRtnOnCorrelatedInputs) {
  const auto l = make_layer(128, 256, 2048, 1001);
  const float gamma = tensor_scale(l.W);
  const auto h = mc::accumulate_hessian(l.X.data(), l.n, l.K);
  const auto t0 = std::chrono::steady_clock::now();
  const auto res = mc::sgptq(l.W.data(), l.N, l.K, h, gamma, {});
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(res.fallback) << res.fallback_reason;
  EXPECT_EQ(res.dead_columns, 0);
  EXPECT_EQ(res.packed.global_scale, gamma);
  expect_valid_sparse48(res, l.N, l.K);

  const double e_mag = output_rel_error(l, dequant(magnitude_rtn(l.W, l.N, l.K, gamma)));
  const double e_sg = output_rel_error(l, dequant(res.packed));
  mc::SgptqOptions scale_block;
  scale_block.pattern_at_group = false;
  const double e_sb = output_rel_error(
      l, dequant(mc::sgptq(l.W.data(), l.N, l.K, h, gamma, scale_block).packed));
  std::printf("[sgptq] N=128 K=256 n=2048: rel output error magnitude+RTN %.4f, SGPTQ %.4f "
              "(ratio %.3f), SGPTQ with supports fixed per scale block %.4f; one solve %.2f ms\n",
              e_mag, e_sg, e_sg / e_mag, e_sb, ms);
  EXPECT_LT(e_sg, kMinImprovement * e_mag);
  EXPECT_LT(e_sb, kMinImprovement * e_mag);
  // The default (per-group supports, provisional scale) was chosen because it measured better.
  EXPECT_LE(e_sg, e_sb);
}

TEST(Sgptq, LazyPathMatchesPlainLoopTwin) {
  const auto l = make_layer(64, 320, 1024, 2002);  // K = 320: a last lazy block of 64 columns
  const float gamma = tensor_scale(l.W);
  const auto h = mc::accumulate_hessian(l.X.data(), l.n, l.K);
  const auto fast = mc::sgptq(l.W.data(), l.N, l.K, h, gamma, {});
  const auto ref = mc::sgptq_ref(l.W.data(), l.N, l.K, h, gamma, {});
  expect_valid_sparse48(ref, l.N, l.K);
  const double ef = output_rel_error(l, dequant(fast.packed));
  const double er = output_rel_error(l, dequant(ref.packed));
  EXPECT_NEAR(ef, er, kRefErrorRelTol * er);
  int64_t same = 0;
  const auto Df = dequant(fast.packed), Dr = dequant(ref.packed);
  for (size_t i = 0; i < Df.size(); ++i) same += Df[i] == Dr[i];
  EXPECT_GE(static_cast<double>(same) / Df.size(), kRefMinSameCodes)
      << same << " of " << Df.size() << " unpacked values identical";
}

TEST(Sgptq, NoTokensFallsBackToMagnitudeRtnExactly) {
  const int64_t N = 48, K = 128;
  const auto W = gaussian(N * K, 3003);
  const float gamma = tensor_scale(W);
  const mc::Hessian empty = mc::accumulate_hessian(nullptr, 0, K);
  const auto res = mc::sgptq(W.data(), N, K, empty, gamma, {});
  EXPECT_TRUE(res.fallback);
  EXPECT_NE(res.fallback_reason.find("no calibration tokens"), std::string::npos)
      << res.fallback_reason;
  expect_valid_sparse48(res, N, K);
  for (float v : res.dense_rounded) ASSERT_TRUE(std::isfinite(v));
  // Identity Hessian: saliency = w², no error propagation → exactly magnitude + RTN, byte for byte.
  EXPECT_TRUE(same_bytes(res.packed, magnitude_rtn(W, N, K, gamma)));
  // A default-constructed Hessian (K = 0, n = 0) is the same "no tokens" case.
  EXPECT_TRUE(same_bytes(mc::sgptq(W.data(), N, K, mc::Hessian{}, gamma, {}).packed, res.packed));
}

TEST(Sgptq, TooFewTokensAndSingularHessianFallBack) {
  const auto l = make_layer(32, 128, 16, 4004);  // n = 16 < K: rank-deficient Hessian
  const float gamma = tensor_scale(l.W);
  const auto h = mc::accumulate_hessian(l.X.data(), l.n, l.K);
  mc::SgptqOptions few;
  few.min_tokens = 64;
  const auto a = mc::sgptq(l.W.data(), l.N, l.K, h, gamma, few);
  EXPECT_TRUE(a.fallback);
  EXPECT_NE(a.fallback_reason.find("min_tokens"), std::string::npos) << a.fallback_reason;
  mc::SgptqOptions undamped;
  undamped.percdamp = 0.0;
  const auto b = mc::sgptq(l.W.data(), l.N, l.K, h, gamma, undamped);
  EXPECT_TRUE(b.fallback);
  EXPECT_NE(b.fallback_reason.find("not positive definite"), std::string::npos)
      << b.fallback_reason;
  for (const auto* r : {&a, &b}) {
    expect_valid_sparse48(*r, l.N, l.K);
    EXPECT_TRUE(same_bytes(r->packed, magnitude_rtn(l.W, l.N, l.K, gamma)));
  }
  // With the default damping the same 16 rows are usable: no fallback, finite output.
  const auto c = mc::sgptq(l.W.data(), l.N, l.K, h, gamma, {});
  EXPECT_FALSE(c.fallback) << c.fallback_reason;
  expect_valid_sparse48(c, l.N, l.K);
}

TEST(Sgptq, DeadColumnsAreZeroedAndStillBeatMagnitude) {
  auto l = make_layer(64, 256, 1024, 5005);
  const std::vector<int64_t> dead = {0, 3, 100, 200, 201, 202, 203, 204, 205, 206, 207, 255};
  for (int64_t t = 0; t < l.n; ++t)
    for (int64_t k : dead) l.X[t * l.K + k] = 0.0f;
  const float gamma = tensor_scale(l.W);
  const auto h = mc::accumulate_hessian(l.X.data(), l.n, l.K);
  const auto res = mc::sgptq(l.W.data(), l.N, l.K, h, gamma, {});
  ASSERT_FALSE(res.fallback) << res.fallback_reason;
  EXPECT_EQ(res.dead_columns, static_cast<int64_t>(dead.size()));
  expect_valid_sparse48(res, l.N, l.K);
  const auto D = dequant(res.packed);
  for (int64_t r = 0; r < l.N; ++r)
    for (int64_t k : dead) ASSERT_EQ(D[r * l.K + k], 0.0f) << "dead column " << k << " row " << r;
  const double e_mag = output_rel_error(l, dequant(magnitude_rtn(l.W, l.N, l.K, gamma)));
  const double e_sg = output_rel_error(l, D);
  EXPECT_LT(e_sg, kMinImprovement * e_mag) << "magnitude " << e_mag << " sgptq " << e_sg;
}

TEST(Sgptq, DeterministicBytes) {
  const auto l = make_layer(32, 256, 512, 6006);
  const float gamma = tensor_scale(l.W);
  const auto h = mc::accumulate_hessian(l.X.data(), l.n, l.K);
  const auto a = mc::sgptq(l.W.data(), l.N, l.K, h, gamma, {});
  const auto b = mc::sgptq(l.W.data(), l.N, l.K, h, gamma, {});
  EXPECT_TRUE(same_bytes(a.packed, b.packed));
  EXPECT_EQ(a.patterns, b.patterns);
  ASSERT_EQ(a.dense_rounded.size(), b.dense_rounded.size());
  EXPECT_EQ(std::memcmp(a.dense_rounded.data(), b.dense_rounded.data(),
                        a.dense_rounded.size() * sizeof(float)),
            0);
  // A different global scale (gate/up share one) is stored as given.
  const auto c = mc::sgptq(l.W.data(), l.N, l.K, h, 0.5f * gamma, {});
  EXPECT_EQ(c.packed.global_scale, 0.5f * gamma);
  expect_valid_sparse48(c, l.N, l.K);
}

TEST(Sgptq, RejectsBadShapesAndInputs) {
  const auto W = gaussian(8 * 64, 7007);
  const auto h = mc::accumulate_hessian(nullptr, 0, 64);
  EXPECT_THROW(mc::sgptq(W.data(), 8, 40, mc::Hessian{}, 1.0f, {}), moesq::Error);  // K % 32
  const auto X = gaussian(100 * 32, 7008);
  const auto h32 = mc::accumulate_hessian(X.data(), 100, 32);
  EXPECT_THROW(mc::sgptq(W.data(), 8, 64, h32, 1.0f, {}), moesq::Error);  // Hessian K mismatch
  mc::SgptqOptions bad_block;
  bad_block.block_size = 48;
  EXPECT_THROW(mc::sgptq(W.data(), 8, 64, h, 1.0f, bad_block), moesq::Error);
  auto Wnan = W;
  Wnan[77] = std::nanf("");
  try {
    mc::sgptq(Wnan.data(), 8, 64, h, 1.0f, {}, "layers.0.mlp.experts.3.down_proj");
    FAIL() << "NaN weight accepted";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.3.down_proj"), std::string::npos) << e.what();
  }
}
