// Dense NVFP4 and paired 4:8 NVFP4 (nvfp4.h): byte layout (a hand-checked worked example), bit-exact
// pack/unpack round trip, all 6 patterns, tiny / zero / saturating blocks, bits per weight measured
// from the bytes, format error bounds, fake quant == quantize→dequantize bit for bit, activation
// quantization, magnitude pattern choice, and the error messages for bad shapes and patterns.
//
// Non-obvious decision: the per-element error bound is derived from the STORED scale byte and the
// E2M1 grid (half the gap at the value's magnitude, or the saturation excess), not from the
// quantizer's own arithmetic, so it holds for any correct implementation and catches wrong
// rounding, wrong scales or misplaced nibbles. The whole-tensor limits are documented below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/fp_codecs.h"
#include "format/nvfp4.h"

using namespace moesq::format;

namespace {

// Whole-tensor format error limits: relative Frobenius error ‖Ŵ − W‖_F / ‖W‖_F on i.i.d. N(0, 1)
// weights of the pipeline's expert shape (128 × 256, seed 1). A block scaled so that its amax maps
// to 6 has E2M1 steps of 0.5 / 1 / 2 (in units of amax_b/6); for Gaussian blocks of 16 values that
// gives ≈ 0.095 (measured: dense 0.0953, kept values of paired 4:8 0.0974 — same statistics: 16
// values per scale). The limit 0.105 leaves ~8% headroom; a block scale one code too large measures
// 0.110 and fails it (the round-trip and element-bound tests catch that too).
constexpr double kDenseRelFroLimit = 0.105;
constexpr double kSparseKeptRelFroLimit = 0.105;
// Paired 4:8 vs the ORIGINAL dense weights (pruning included, magnitude patterns): pair energies of
// Gaussian weights are Exp(1); dropping the 2 smallest of 4 drops E[X(1) + X(2)] / 4 = (1/4 + 7/12) / 4
// = 5/24 ≈ 0.208 of the energy (√0.208 = 0.456); with the quantization error on top, measured 0.464.
constexpr double kSparseTotalRelFroLimit = 0.48;
// Integer-exact and "same bits" checks use exact equality; this tolerance is only for comparing a
// dequantized amax element with the true amax after the two fp32 roundings of γ and ŵ.
constexpr float kAmaxRelTol = 4e-7f;

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> random_patterns(int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, kNumPatterns - 1);
  std::vector<uint8_t> p(static_cast<size_t>(N * K / kGroup));
  for (auto& x : p) x = static_cast<uint8_t>(d(rng));
  return p;
}

double rel_fro(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Largest error allowed for one weight w quantized in a block with decoded scale s under γ:
// half the E2M1 gap at |w|·γ/s, or the saturation excess beyond 6; a block with s = 0 is only
// allowed when γ·amax_b/6 rounds to UE4M3 code 0, i.e. |w| ≤ 2^-10·6/γ.
double element_bound(float w, float s, float gamma) {
  const double slack = 1e-6 * std::fabs(w) + 1e-30;  // fp32 rounding of w·γ/s and of q·s/γ
  if (s == 0.0f) return std::ldexp(6.0, -10) / gamma + slack;
  const double v = std::fabs(double(w)) * gamma / s;
  const double half_gap = v <= 2.0 ? 0.25 : v <= 4.0 ? 0.5 : 1.0;
  return std::max(half_gap, v - 6.0) * s / gamma + slack;
}

// Checks every element of a dense-NVFP4 dequantization against element_bound; returns # checked.
int64_t check_dense_bounds(const float* W, const Nvfp4Tensor& t, const std::vector<float>& deq) {
  for (int64_t n = 0; n < t.N; ++n)
    for (int64_t k = 0; k < t.K; ++k) {
      const float s = e4m3_decode(t.scales[n * t.K / 16 + k / 16]);
      const float w = W[n * t.K + k], q = deq[n * t.K + k];
      EXPECT_TRUE(std::isfinite(q));
      if (std::fabs(double(q) - w) > element_bound(w, s, t.global_scale)) {
        ADD_FAILURE() << "N=" << t.N << " K=" << t.K << " row " << n << " k " << k << " block " << k / 16
                      << ": w=" << w << " deq=" << q << " s=" << s << " gamma=" << t.global_scale;
        return -1;
      }
    }
  return t.N * t.K;
}

}  // namespace

// ---- layout -------------------------------------------------------------------------------------

TEST(FormatNvfp4, PatternTablesMatchTheOrderedMetadataOfDesign) {
  const uint8_t nibbles[kNumPatterns] = {0x4, 0x8, 0xc, 0x9, 0xd, 0xe};
  const uint8_t masks[kNumPatterns] = {0x0f, 0x33, 0xc3, 0x3c, 0xcc, 0xf0};
  for (int p = 0; p < kNumPatterns; ++p) {
    EXPECT_EQ(pattern_nibble(p), nibbles[p]) << "pattern " << p;
    EXPECT_EQ(pattern_from_nibble(nibbles[p]), p);
    EXPECT_EQ(pattern_mask8(p), masks[p]) << "pattern " << p;
  }
  int num_invalid = 0;
  for (int nib = 0; nib < 16; ++nib) {
    if (std::find(nibbles, nibbles + kNumPatterns, nib) != nibbles + kNumPatterns) continue;
    EXPECT_THROW(pattern_from_nibble(static_cast<uint8_t>(nib)), moesq::Error) << "nibble " << nib;
    ++num_invalid;
  }
  EXPECT_EQ(num_invalid, 10);
  EXPECT_THROW(pattern_mask8(6), moesq::Error);
}

// The one gate|up rule (docs/FORMAT.md): Eq. 5 over every entry of BOTH arrays — the larger amax
// wins whichever array holds it, and an entry a paired 4:8 pattern would prune still counts.
TEST(FormatNvfp4, GateUpTensorScaleIsEq5OverAllEntriesOfBoth) {
  std::vector<float> gate(64, 0.25f), up(64, -0.5f);
  EXPECT_EQ(gate_up_tensor_scale(gate.data(), up.data(), 64), nvfp4_tensor_scale(0.5f));
  gate[3] = -7.0f;  // position 3 of group 0: pruned by pattern {0,1}, still the amax
  EXPECT_EQ(gate_up_tensor_scale(gate.data(), up.data(), 64), nvfp4_tensor_scale(7.0f));
  EXPECT_EQ(gate_up_tensor_scale(up.data(), gate.data(), 64), nvfp4_tensor_scale(7.0f));
  std::vector<float> zero(64, 0.0f);
  EXPECT_EQ(gate_up_tensor_scale(zero.data(), zero.data(), 64), 1.0f);  // zero tensors: γ = 1
}

TEST(FormatNvfp4, WorkedExampleBytesOfOneRow) {
  // The worked example of docs/FORMAT.md: one row, K = 32, amax = 6 → γ = 448·6/6 = 448; the
  // block amax is 6 → code UE4M3(448) = 0x7e, s = 448, so w·γ/s = w and E2M1 values are exact.
  // Group 0 = [1, -2, 0.1, 0.2, 3, 0.5, -0.1, 0.3]: pair energies 5, 0.05, 9.25, 0.1 →
  // keep pairs {0, 2} = pattern 1, nibble 0x8; kept values 1, -2, 3, 0.5 = codes 2, 0xc, 5, 1.
  // Groups 1..3 repeat the 6 in position 0 and use patterns {2,3}, {0,1}, {1,3}.
  std::vector<float> W(32, 0.0f);
  const float g0[8] = {1, -2, 0.1f, 0.2f, 3, 0.5f, -0.1f, 0.3f};
  std::copy(g0, g0 + 8, W.begin());
  const float g1[8] = {0, 0, 0, 0, 6, -6, 1.5f, 4};  // keep {2,3}: nibble 0xe
  const float g2[8] = {-6, 0, 0, 0, 0, 0, 0, 0};     // tie among pairs 1..3 → {0,1}: nibble 0x4
  const float g3[8] = {0, 0, 0.5f, 1, 0, 0, -1.5f, -3};  // keep {1,3}: nibble 0xd
  std::copy(g1, g1 + 8, W.begin() + 8);
  std::copy(g2, g2 + 8, W.begin() + 16);
  std::copy(g3, g3 + 8, W.begin() + 24);
  const auto pat = magnitude_patterns(W.data(), 1, 32);
  ASSERT_EQ(pat, (std::vector<uint8_t>{1, 5, 0, 4}));
  const Sparse48Tensor t = sparse48_quantize(W.data(), 1, 32, pat.data(), 0.0f, "example");
  EXPECT_EQ(t.global_scale, 448.0f);
  EXPECT_EQ(t.scales, (std::vector<uint8_t>{0x7e}));
  EXPECT_EQ(t.meta, (std::vector<uint8_t>{0x8 | (0xe << 4), 0x4 | (0xd << 4)}));
  // Kept values in K order, low nibble first:
  // g0: 1(2) -2(c) 3(5) .5(1); g1: 6(7) -6(f) 1.5(3) 4(6); g2: -6(f) 0(0) 0(0) 0(0); g3: .5(1) 1(2) -1.5(b) -3(d)
  EXPECT_EQ(t.values, (std::vector<uint8_t>{0xc2, 0x15, 0xf7, 0x63, 0x0f, 0x00, 0x21, 0xdb}));
  std::vector<float> deq(32);
  sparse48_dequantize(t, deq.data());
  for (int k = 0; k < 32; ++k) {
    const bool kept = (pattern_mask8(pat[k / 8]) >> (k % 8)) & 1;
    EXPECT_EQ(deq[k], kept ? W[k] : 0.0f) << "k " << k;  // every kept value is on the E2M1 grid
  }
}

TEST(FormatNvfp4, DenseNibbleOrderIsLowNibbleFirst) {
  // amax 6 → γ = 448, s = 448: integer-exact values; element 2j goes to the low nibble of byte j.
  std::vector<float> W = {6, -0.5f, 1, 2, 0, 3, -4, 1.5f, 0, 0, 0, 0, 0, 0, 0, -6};
  const Nvfp4Tensor t = nvfp4_quantize(W.data(), 1, 16);
  EXPECT_EQ(t.global_scale, 448.0f);
  EXPECT_EQ(t.scales, (std::vector<uint8_t>{0x7e}));
  EXPECT_EQ(t.values, (std::vector<uint8_t>{0x97, 0x42, 0x50, 0x3e, 0, 0, 0, 0xf0}));
  std::vector<float> deq(16);
  nvfp4_dequantize(t, deq.data());
  EXPECT_TRUE(same_bits(deq, W));
}

// ---- round trips, patterns ----------------------------------------------------------------------

TEST(FormatNvfp4, SparseRoundTripIsBitExactForAwkwardShapes) {
  for (int64_t N : {1, 2, 3, 17}) {
    for (int64_t K : {32, 64, 96, 256}) {
      const uint32_t seed = static_cast<uint32_t>(1000 * N + K);
      const auto W = gaussian(N * K, seed, 0.02f);
      const auto pat = random_patterns(N, K, seed + 1);
      const Sparse48Tensor t = sparse48_quantize(W.data(), N, K, pat.data(), 0.0f, "w");
      EXPECT_EQ(sparse48_patterns(t), pat) << "N=" << N << " K=" << K;
      std::vector<float> deq(static_cast<size_t>(N * K));
      sparse48_dequantize(t, deq.data());
      int64_t num_nonzero = 0;
      for (int64_t i = 0; i < N * K; ++i) {
        const bool kept = (pattern_mask8(pat[i / 8]) >> (i % 8)) & 1;
        if (!kept) ASSERT_EQ(deq[i], 0.0f) << "pruned position " << i << " N=" << N << " K=" << K;
        num_nonzero += deq[i] != 0.0f;
      }
      EXPECT_GT(num_nonzero, N * K / 4) << "N=" << N << " K=" << K;
      const Sparse48Tensor t2 = sparse48_quantize(deq.data(), N, K, pat.data(), t.global_scale, "w");
      EXPECT_EQ(t2.values, t.values) << "N=" << N << " K=" << K;
      EXPECT_EQ(t2.meta, t.meta) << "N=" << N << " K=" << K;
      EXPECT_EQ(t2.scales, t.scales) << "N=" << N << " K=" << K;
    }
  }
}

TEST(FormatNvfp4, DenseRoundTripIsBitExactForAwkwardShapes) {
  for (int64_t N : {1, 2, 3, 17}) {
    for (int64_t K : {16, 48, 256}) {
      const auto W = gaussian(N * K, static_cast<uint32_t>(7 * N + K), 3.0f);
      const Nvfp4Tensor t = nvfp4_quantize(W.data(), N, K);
      std::vector<float> deq(static_cast<size_t>(N * K));
      nvfp4_dequantize(t, deq.data());
      EXPECT_EQ(check_dense_bounds(W.data(), t, deq), N * K);
      const Nvfp4Tensor t2 = nvfp4_quantize(deq.data(), N, K, t.global_scale);
      EXPECT_EQ(t2.values, t.values) << "N=" << N << " K=" << K;
      EXPECT_EQ(t2.scales, t.scales) << "N=" << N << " K=" << K;
    }
  }
}

TEST(FormatNvfp4, EveryPatternPacksAndUnpacksAtEveryGroupPosition) {
  // Row r uses pattern (r + g) % 6 in group g: each pattern appears at every group position
  // (even/odd nibble, first/last group of a scale block).
  const int64_t N = 6, K = 64;
  const auto W = gaussian(N * K, 42);
  std::vector<uint8_t> pat(N * K / 8);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < K / 8; ++g) pat[r * (K / 8) + g] = static_cast<uint8_t>((r + g) % kNumPatterns);
  const Sparse48Tensor t = sparse48_quantize(W.data(), N, K, pat.data());
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < K / 8; ++g) {
      const uint8_t byte = t.meta[r * (K / 16) + g / 2];
      EXPECT_EQ((g % 2) ? byte >> 4 : byte & 0xf, pattern_nibble((r + g) % kNumPatterns)) << "row " << r << " g " << g;
    }
  EXPECT_EQ(sparse48_patterns(t), pat);
  std::vector<float> deq(N * K);
  sparse48_dequantize(t, deq.data());
  // Kept values carry their sign and sit within the element bound of the original; pruned are 0.
  for (int64_t i = 0; i < N * K; ++i) {
    const bool kept = (pattern_mask8(pat[i / 8]) >> (i % 8)) & 1;
    const float s = e4m3_decode(t.scales[i / 32]);
    if (kept) {
      EXPECT_LE(std::fabs(double(deq[i]) - W[i]), element_bound(W[i], s, t.global_scale)) << "i " << i;
      if (deq[i] != 0.0f) EXPECT_EQ(std::signbit(deq[i]), std::signbit(W[i])) << "i " << i;
    } else {
      EXPECT_EQ(deq[i], 0.0f) << "i " << i;
    }
  }
}

TEST(FormatNvfp4, PrunedPositionsAreNeverRead) {
  // NaN / huge values at pruned positions must not change a single byte.
  const int64_t N = 3, K = 64;
  auto W = gaussian(N * K, 5);
  const auto pat = random_patterns(N, K, 6);
  const Sparse48Tensor a = sparse48_quantize(W.data(), N, K, pat.data());
  for (int64_t i = 0; i < N * K; ++i)
    if (!((pattern_mask8(pat[i / 8]) >> (i % 8)) & 1)) W[i] = (i % 2) ? NAN : 1e30f;
  const Sparse48Tensor b = sparse48_quantize(W.data(), N, K, pat.data());
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.global_scale, b.global_scale);
}

// ---- tiny, zero and saturating blocks -----------------------------------------------------------

TEST(FormatNvfp4, ZeroTensorAndZeroBlocksNeverDivideByZero) {
  const int64_t N = 2, K = 64;
  std::vector<float> Z(N * K, 0.0f);
  const auto pat = random_patterns(N, K, 9);
  const Sparse48Tensor s = sparse48_quantize(Z.data(), N, K, pat.data());
  EXPECT_EQ(s.global_scale, 1.0f);
  for (uint8_t c : s.scales) EXPECT_EQ(c, 0);
  for (uint8_t v : s.values) EXPECT_EQ(v, 0);
  const Nvfp4Tensor d = nvfp4_quantize(Z.data(), N, K);
  EXPECT_EQ(d.global_scale, 1.0f);
  std::vector<float> deq(N * K, 1.0f);
  sparse48_dequantize(s, deq.data());
  EXPECT_TRUE(same_bits(deq, Z));
  nvfp4_dequantize(d, deq.data());
  EXPECT_TRUE(same_bits(deq, Z));
  // One zero block inside a non-zero tensor: code 0, zeros out, everything else finite.
  auto W = gaussian(N * K, 10);
  std::fill(W.begin() + 32, W.begin() + 48, 0.0f);  // dense block 2 of row 0
  const Nvfp4Tensor t = nvfp4_quantize(W.data(), N, K);
  EXPECT_EQ(t.scales[2], 0);
  nvfp4_dequantize(t, deq.data());
  for (int i = 32; i < 48; ++i) EXPECT_EQ(deq[i], 0.0f);
  EXPECT_EQ(check_dense_bounds(W.data(), t, deq), N * K);
}

TEST(FormatNvfp4, TinyBlocksKeepTheirElementBoundAndRoundTrip) {
  // Row blocks at 1, 1e-2, 1e-4 of the tensor amax (normal UE4M3 scales: bit-exact round trip),
  // and at 1e-6, 1e-8 (subnormal or zero scale: bounded error, no NaN, values stay finite).
  const int64_t N = 1, K = 16 * 5;
  auto W = gaussian(N * K, 77);
  const float mult[5] = {1.0f, 1e-2f, 1e-4f, 1e-6f, 1e-8f};
  for (int b = 0; b < 5; ++b)
    for (int j = 0; j < 16; ++j) W[b * 16 + j] *= mult[b];
  const Nvfp4Tensor t = nvfp4_quantize(W.data(), N, K);
  std::vector<float> deq(N * K);
  nvfp4_dequantize(t, deq.data());
  EXPECT_EQ(check_dense_bounds(W.data(), t, deq), N * K);
  EXPECT_EQ(t.scales[4], 0) << "1e-8 of amax is below half the smallest UE4M3 step";
  for (int b = 0; b < 3; ++b) EXPECT_GE(t.scales[b], 0x08) << "block " << b << " should have a normal scale";
  // Bit-exact round trip on the blocks with normal scales (the first 48 values).
  std::vector<float> head(deq.begin(), deq.begin() + 48);
  const Nvfp4Tensor t2 = nvfp4_quantize(head.data(), 1, 48, t.global_scale);
  EXPECT_EQ(t2.scales, std::vector<uint8_t>(t.scales.begin(), t.scales.begin() + 3));
  EXPECT_EQ(t2.values, std::vector<uint8_t>(t.values.begin(), t.values.begin() + 24));
  // Relative error of the 1e-2 block stays at the format level (block-local scaling).
  std::vector<float> b1(W.begin() + 16, W.begin() + 32), d1(deq.begin() + 16, deq.begin() + 32);
  EXPECT_LT(rel_fro(d1, b1), 0.25);
}

TEST(FormatNvfp4, SaturatingBlocksClampToTheLargestCodes) {
  // Eq. 5 maps the tensor amax block exactly to scale 448 (code 0x7e) and its max to E2M1 6.
  const int64_t N = 4, K = 64;
  const auto W = gaussian(N * K, 31);
  const Nvfp4Tensor t = nvfp4_quantize(W.data(), N, K);
  int64_t imax = 0;
  for (int64_t i = 0; i < N * K; ++i)
    if (std::fabs(W[i]) > std::fabs(W[imax])) imax = i;
  EXPECT_EQ(t.scales[imax / 16], 0x7e);
  std::vector<float> deq(N * K);
  nvfp4_dequantize(t, deq.data());
  EXPECT_NEAR(deq[imax], W[imax], kAmaxRelTol * std::fabs(W[imax]));
  // A global scale 4× larger than Eq. 5 (as when gate|up share a scale the other way round, or a
  // caller's mistake): blocks saturate at 448 and values at ±6, nothing becomes NaN or inf, and the
  // round trip is still bit-exact.
  const Nvfp4Tensor s = nvfp4_quantize(W.data(), N, K, 4.0f * t.global_scale);
  int num_sat_scales = 0, num_sat_values = 0;
  for (uint8_t c : s.scales) num_sat_scales += c == 0x7e;
  for (int64_t i = 0; i < N * K; ++i) {
    const uint8_t q = (s.values[i / 2] >> (4 * (i % 2))) & 0xf;
    num_sat_values += (q & 7) == 7;
  }
  EXPECT_GT(num_sat_scales, 0);
  EXPECT_GT(num_sat_values, 0);
  nvfp4_dequantize(s, deq.data());
  EXPECT_EQ(check_dense_bounds(W.data(), s, deq), N * K);
  const Nvfp4Tensor s2 = nvfp4_quantize(deq.data(), N, K, s.global_scale);
  EXPECT_EQ(s2.values, s.values);
  EXPECT_EQ(s2.scales, s.scales);
}

// ---- bits per weight and format error -----------------------------------------------------------

TEST(FormatNvfp4, BitsPerWeightMeasuredFromTheBytes) {
  for (auto [N, K] : {std::pair<int64_t, int64_t>{128, 256}, {256, 128}, {3, 32}}) {
    const auto W = gaussian(N * K, 3);
    const auto pat = magnitude_patterns(W.data(), N, K);
    const Sparse48Tensor s = sparse48_quantize(W.data(), N, K, pat.data());
    const size_t sparse_bytes = s.values.size() + s.meta.size() + s.scales.size() + sizeof(s.global_scale);
    EXPECT_EQ(s.packed_bytes(), sparse_bytes);
    // Eq. 7: 4·4/8 (values) + 4/8 (metadata) + 8/32 (scales) = 2.75, plus the 32-bit γ.
    EXPECT_DOUBLE_EQ(bits_per_weight(sparse_bytes, N, K), 2.75 + 32.0 / double(N * K)) << N << "x" << K;
    const Nvfp4Tensor d = nvfp4_quantize(W.data(), N, K);
    const size_t dense_bytes = d.values.size() + d.scales.size() + sizeof(d.global_scale);
    EXPECT_EQ(d.packed_bytes(), dense_bytes);
    EXPECT_DOUBLE_EQ(bits_per_weight(dense_bytes, N, K), 4.5 + 32.0 / double(N * K)) << N << "x" << K;
  }
  EXPECT_THROW(bits_per_weight(10, 0, 32), moesq::Error);
}

TEST(FormatNvfp4, FormatErrorOnGaussianWeightsIsBelowTheDocumentedLimits) {
  const int64_t N = 128, K = 256;
  const auto W = gaussian(N * K, 1);
  std::vector<float> deq(N * K);
  const Nvfp4Tensor d = nvfp4_quantize(W.data(), N, K);
  nvfp4_dequantize(d, deq.data());
  const double dense_err = rel_fro(deq, W);
  EXPECT_EQ(check_dense_bounds(W.data(), d, deq), N * K);

  const auto pat = magnitude_patterns(W.data(), N, K);
  std::vector<float> masked = W;
  apply_patterns(masked.data(), N, K, pat.data());
  const Sparse48Tensor s = sparse48_quantize(W.data(), N, K, pat.data());
  sparse48_dequantize(s, deq.data());
  const double kept_err = rel_fro(deq, masked), total_err = rel_fro(deq, W);
  std::printf("rel Frobenius error (N=%lld K=%lld, N(0,1), seed 1): dense NVFP4 %.4f, paired 4:8 kept %.4f, "
              "paired 4:8 vs dense W %.4f\n",
              (long long)N, (long long)K, dense_err, kept_err, total_err);
  EXPECT_LT(dense_err, kDenseRelFroLimit);
  EXPECT_LT(kept_err, kSparseKeptRelFroLimit);
  EXPECT_LT(total_err, kSparseTotalRelFroLimit);
  EXPECT_GT(dense_err, 0.0);  // a lossless result on Gaussian data would mean nothing was quantized
}

// ---- fake quant and activations -----------------------------------------------------------------

TEST(FormatNvfp4, FakeQuantIsBitExactWithQuantizeDequantize) {
  const int64_t N = 5, K = 128;
  const auto W = gaussian(N * K, 2024, 0.05f);
  // Dense: blocks of 16 along the flattened [N, K] (rows are whole blocks).
  const Nvfp4Tensor d = nvfp4_quantize(W.data(), N, K);
  std::vector<float> ref(N * K), fq = W;
  nvfp4_dequantize(d, ref.data());
  nvfp4_fake_quant_blocks(fq.data(), N * K, kDenseScaleBlock, d.global_scale);
  EXPECT_TRUE(same_bits(fq, ref));
  // Paired 4:8: the kept values of a row, compacted in K order, form blocks of 16.
  const auto pat = random_patterns(N, K, 2025);
  const Sparse48Tensor s = sparse48_quantize(W.data(), N, K, pat.data(), 0.0f);
  sparse48_dequantize(s, ref.data());
  std::vector<float> kept, out(N * K, 0.0f);
  for (int64_t i = 0; i < N * K; ++i)
    if ((pattern_mask8(pat[i / 8]) >> (i % 8)) & 1) kept.push_back(W[i]);
  ASSERT_EQ(kept.size(), size_t(N * K / 2));
  nvfp4_fake_quant_blocks(kept.data(), int64_t(kept.size()), kSparseScaleBlock / 2, s.global_scale);
  for (int64_t i = 0, j = 0; i < N * K; ++i)
    if ((pattern_mask8(pat[i / 8]) >> (i % 8)) & 1) out[i] = kept[j++];
  EXPECT_TRUE(same_bits(out, ref));
  // γ <= 0 means Eq. 5 on the input's amax, the same γ the quantizer picks.
  std::vector<float> fq2 = W;
  nvfp4_fake_quant_blocks(fq2.data(), N * K, kDenseScaleBlock, 0.0f);
  nvfp4_dequantize(d, ref.data());
  EXPECT_TRUE(same_bits(fq2, ref));
  EXPECT_THROW(nvfp4_fake_quant_blocks(fq2.data(), 40, 16, 1.0f), moesq::Error);
}

TEST(FormatNvfp4, ActivationRowQuantization) {
  for (int block : {16, 32}) {
    for (int64_t K : {int64_t(block), int64_t(4 * block), int64_t(768)}) {
      const auto x0 = gaussian(K, static_cast<uint32_t>(K + block), 2.5f);
      std::vector<float> x = x0;
      quantize_activation_row(x.data(), K, block);
      // Same result as dense NVFP4 of the row with Eq. 5's per-token scale when block == 16.
      if (block == kDenseScaleBlock) {
        const Nvfp4Tensor t = nvfp4_quantize(x0.data(), 1, K);
        std::vector<float> ref(K);
        nvfp4_dequantize(t, ref.data());
        EXPECT_TRUE(same_bits(x, ref)) << "K=" << K;
      }
      // Every value within its element bound under the block scale the row must have used.
      const float gamma = nvfp4_tensor_scale(amax_abs(x0.data(), K));
      int64_t imax = 0, num_nonzero = 0;
      for (int64_t k = 0; k < K; ++k) {
        if (std::fabs(x0[k]) > std::fabs(x0[imax])) imax = k;
        num_nonzero += x[k] != 0.0f;
      }
      for (int64_t b = 0; b < K; b += block) {
        float amax_b = 0;
        for (int j = 0; j < block; ++j) amax_b = std::max(amax_b, std::fabs(x0[b + j]));
        const float s = e4m3_decode(ue4m3_encode(gamma * amax_b / 6.0f));
        for (int j = 0; j < block; ++j)
          ASSERT_LE(std::fabs(double(x[b + j]) - x0[b + j]), element_bound(x0[b + j], s, gamma))
              << "block=" << block << " K=" << K << " k=" << b + j;
      }
      EXPECT_NEAR(x[imax], x0[imax], kAmaxRelTol * std::fabs(x0[imax])) << "the token amax is exact";
      EXPECT_GT(num_nonzero, K / 2);
    }
  }
  // Integer-valued row already on the grid (amax 6 → γ = 448, s = 448): unchanged, bit for bit.
  std::vector<float> grid(32);
  const float vals[8] = {0, 0.5f, -1, 1.5f, -2, 3, -4, 6};
  for (int k = 0; k < 32; ++k) grid[k] = vals[(k * 5) % 8];
  std::vector<float> g = grid;
  quantize_activation_row(g.data(), 32, 32);
  EXPECT_TRUE(same_bits(g, grid));
  // Zero row stays zero; K not a multiple of the block is an error naming K and the block.
  std::vector<float> z(32, 0.0f);
  quantize_activation_row(z.data(), 32, 16);
  for (float v : z) EXPECT_EQ(v, 0.0f);
  try {
    quantize_activation_row(z.data(), 24, 16);
    ADD_FAILURE() << "expected an error";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("K=24"), std::string::npos) << e.what();
  }
}

// ---- pattern choice -----------------------------------------------------------------------------

TEST(FormatNvfp4, MagnitudePatternsKeepTheTwoLargestPairsWithLowestIdOnTies) {
  // Fresh random groups with small-integer values (exact energies, frequent ties), checked by
  // brute force over all 6 patterns: maximal kept energy, lowest pattern id among the maxima.
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> d(-2, 2);
  const int64_t N = 64, K = 64;
  std::vector<float> W(N * K);
  for (auto& w : W) w = float(d(rng));
  const auto pat = magnitude_patterns(W.data(), N, K);
  int num_ties = 0;
  for (int64_t g = 0; g < N * K / 8; ++g) {
    const float* w = W.data() + g * 8;
    double best = -1;
    int best_p = -1, num_best = 0;
    for (int p = 0; p < kNumPatterns; ++p) {
      double e = 0;
      for (int j = 0; j < 8; ++j)
        if ((pattern_mask8(p) >> j) & 1) e += double(w[j]) * w[j];
      if (e > best) best = e, best_p = p, num_best = 1;
      else if (e == best) ++num_best;
    }
    num_ties += num_best > 1;
    ASSERT_EQ(pat[g], best_p) << "group " << g;
  }
  EXPECT_GT(num_ties, 10);  // the tie rule was exercised
  EXPECT_THROW(magnitude_patterns(W.data(), 1, 12), moesq::Error);
}

TEST(FormatNvfp4, KeptAmaxAndApplyPatterns) {
  const int64_t N = 3, K = 64;
  auto W = gaussian(N * K, 123);
  const auto pat = random_patterns(N, K, 124);
  std::vector<float> m = W;
  apply_patterns(m.data(), N, K, pat.data());
  EXPECT_EQ(sparse48_kept_amax(W.data(), N, K, pat.data()), amax_abs(m.data(), N * K));
  int64_t num_zero = 0;
  for (float v : m) num_zero += v == 0.0f;
  EXPECT_EQ(num_zero, N * K / 2);
  // γ from the kept amax is what sparse48_quantize picks by default (Eq. 5 on the kept values).
  EXPECT_EQ(sparse48_quantize(W.data(), N, K, pat.data()).global_scale,
            nvfp4_tensor_scale(sparse48_kept_amax(W.data(), N, K, pat.data())));
}

// ---- errors -------------------------------------------------------------------------------------

namespace {
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const moesq::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(FormatNvfp4, ErrorsNameTheTensorAndTheShape) {
  std::vector<float> W(4 * 48, 1.0f);
  std::vector<uint8_t> pat(4 * 6, 0);
  const std::string sparse_k =
      error_of([&] { sparse48_quantize(W.data(), 4, 48, pat.data(), 0.0f, "layers.0.experts.3.up_proj"); });
  EXPECT_NE(sparse_k.find("layers.0.experts.3.up_proj"), std::string::npos) << sparse_k;
  EXPECT_NE(sparse_k.find("K=48"), std::string::npos) << sparse_k;
  EXPECT_NE(sparse_k.find("32"), std::string::npos) << sparse_k;

  const std::string dense_k = error_of([&] { nvfp4_quantize(W.data(), 8, 24, 0.0f, "down_proj"); });
  EXPECT_NE(dense_k.find("down_proj"), std::string::npos) << dense_k;
  EXPECT_NE(dense_k.find("K=24"), std::string::npos) << dense_k;

  std::vector<uint8_t> bad(4 * 4, 1);
  bad[5] = 6;  // row 1, group 1
  const std::string bad_p = error_of([&] { sparse48_quantize(W.data(), 4, 32, bad.data(), 0.0f, "gate_proj"); });
  EXPECT_NE(bad_p.find("gate_proj"), std::string::npos) << bad_p;
  EXPECT_NE(bad_p.find("pattern id 6"), std::string::npos) << bad_p;
  EXPECT_NE(bad_p.find("row 1 group 1"), std::string::npos) << bad_p;

  std::vector<float> nanw(32, 1.0f);
  nanw[3] = NAN;
  std::vector<uint8_t> p0(4, 0);
  EXPECT_NE(error_of([&] { sparse48_quantize(nanw.data(), 1, 32, p0.data(), 0.0f, "nan_w"); }).find("nan_w"),
            std::string::npos);
  EXPECT_NE(error_of([&] { nvfp4_quantize(nanw.data(), 1, 32, 0.0f, "nan_d"); }).find("nan_d"), std::string::npos);

  // Corrupt packed tensors: an invalid metadata nibble, a NaN block scale, a wrong byte count.
  const auto Wg = gaussian(32, 8);
  Sparse48Tensor t = sparse48_quantize(Wg.data(), 1, 32, p0.data());
  std::vector<float> out(32);
  Sparse48Tensor bad_meta = t;
  bad_meta.meta[1] = 0x35;  // group 2 nibble 0x5
  EXPECT_NE(error_of([&] { sparse48_dequantize(bad_meta, out.data()); }).find("group 2"), std::string::npos);
  Sparse48Tensor bad_scale = t;
  bad_scale.scales[0] = 0x7f;
  EXPECT_NE(error_of([&] { sparse48_dequantize(bad_scale, out.data()); }).find("block scale"), std::string::npos);
  Sparse48Tensor short_vals = t;
  short_vals.values.pop_back();
  EXPECT_NE(error_of([&] { sparse48_dequantize(short_vals, out.data()); }).find("K=32"), std::string::npos);
}
