// CPU tests of the synthetic weight twins (ops/synth_pack; GPU vs twin bitwise in
// tests/gpu/test_engine_ops.cu) against their plain definitions:
//   synth_bf16_ref:        out[i] = bf16(mean + scale·√3·(2u_i − 1)), u_i the top 24 bits of the (i+1)-th
//                          draw of SplitMix64(seed) (core/splitmix64.h), i.e. uniform noise of variance scale²;
//   synth_sparse48_kl_ref: per 1408-byte chunk, random E2M1 code bytes, UE4M3 scale bytes in [0x30, 0x3f],
//                          and metadata nibbles that each keep an ordered pair i0 < i1 of a group of 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/splitmix64.h"
#include "format/kernel_layout.h"
#include "ops/synth_pack/synth_pack.h"

namespace {

using moesq::bf16_to_f32;
using moesq::ops::SynthBf16Args;
using moesq::ops::SynthSparseArgs;

// Sample statistics of n uniform draws: the mean's standard error is scale/√n and the variance's about
// scale²·√(0.8/n) (uniform: excess kurtosis −1.2); 6 standard errors never fail by chance in practice.
constexpr double kStatSigmas = 6.0;
constexpr int64_t kDraws = 200000;

std::vector<uint16_t> synth(int64_t n, uint64_t seed, float scale, float mean) {
  std::vector<uint16_t> out(n, 0);
  SynthBf16Args a;
  a.out = out.data(), a.n = n, a.seed = seed, a.scale = scale, a.mean = mean;
  moesq::ops::synth_bf16_ref(a);
  return out;
}

TEST(SynthBf16Ref, IsTheSplitMix64StreamBitwise) {
  for (uint64_t seed : {0ull, 1ull, 0x5eedull}) {
    const float scale = 0.02f, mean = 0.25f;
    const auto out = synth(1000, seed, scale, mean);
    moesq::SplitMix64 g(seed);
    for (int64_t i = 0; i < 1000; ++i) {
      const float u = g.uniform();
      const float want = mean + scale * (1.7320508f * (2.0f * u - 1.0f));
      ASSERT_EQ(out[i], moesq::f32_to_bf16(want)) << "seed " << seed << " first bad index " << i;
    }
  }
}

TEST(SynthBf16Ref, UniformNoiseOfTheRequestedMeanAndScale) {
  const float scale = 0.5f, mean = -1.0f;
  const auto out = synth(kDraws, 77, scale, mean);
  double s = 0.0, s2 = 0.0;
  const double half_width = scale * std::sqrt(3.0) * (1.0 + 1.0 / 256);  // + a bf16 rounding
  for (uint16_t b : out) {
    const double v = bf16_to_f32(b);
    ASSERT_LE(std::fabs(v - mean), half_width) << "value " << v << " outside mean ± scale·√3";
    s += v, s2 += v * v;
  }
  const double m = s / kDraws, var = s2 / kDraws - m * m;
  EXPECT_LE(std::fabs(m - mean), kStatSigmas * scale / std::sqrt(double(kDraws)));
  // bf16 rounding of values near 1 adds a relative variance of about 2^-18: far below the sampling error.
  EXPECT_LE(std::fabs(var - scale * scale), kStatSigmas * scale * scale * std::sqrt(0.8 / kDraws));
  EXPECT_NE(synth(64, 1, scale, mean), synth(64, 2, scale, mean)) << "different seeds, different weights";
}

TEST(SynthSparse48Ref, ChunksAreValidPaired48Packings) {
  constexpr int kChunk = moesq::format::kChunkBytes;
  static_assert(kChunk == 1408, "synth_sparse_byte assumes a 1408-byte chunk");
  const int64_t chunks = 300;
  std::vector<uint8_t> out(chunks * kChunk, 0);
  SynthSparseArgs a;
  a.out = out.data(), a.num_chunks = chunks, a.seed = 12;
  moesq::ops::synth_sparse48_kl_ref(a);
  const int code_end = moesq::format::kChunkCodeBytes, scale_end = code_end + moesq::format::kChunkScaleBytes;
  std::vector<int64_t> pattern(16, 0);
  int64_t code_nonzero = 0;
  for (int64_t c = 0; c < chunks; ++c)
    for (int b = 0; b < kChunk; ++b) {
      const uint8_t v = out[c * kChunk + b];
      if (b < code_end) {
        code_nonzero += v != 0;
      } else if (b < scale_end) {
        ASSERT_TRUE(v >= 0x30 && v <= 0x3f) << "chunk " << c << " scale byte " << b << " = " << int(v);
      } else {
        for (int nib : {v & 0xf, v >> 4}) {
          const int i0 = nib & 3, i1 = nib >> 2;  // the two kept positions of a group of 4
          ASSERT_LT(i0, i1) << "chunk " << c << " metadata byte " << b << " nibble " << nib
                            << " is not an ordered pair";
          ++pattern[nib];
        }
      }
    }
  EXPECT_GT(code_nonzero, chunks * code_end * 9 / 10) << "random code bytes are rarely 0";
  // The 6 ordered pairs appear equally often: each count within 6 standard errors of n/6.
  const double n = chunks * moesq::format::kChunkMetaBytes * 2.0, sd = std::sqrt(n * (1.0 / 6) * (5.0 / 6));
  int kinds = 0;
  for (int nib = 0; nib < 16; ++nib)
    if (pattern[nib]) {
      ++kinds;
      EXPECT_LE(std::fabs(pattern[nib] - n / 6), kStatSigmas * sd) << "pattern " << nib;
    }
  EXPECT_EQ(kinds, 6);
}

TEST(SynthSparse48Ref, SeedDecidesTheBytesAndChunksAreIndependentOfTheCount) {
  auto run = [](int64_t chunks, uint64_t seed) {
    std::vector<uint8_t> out(chunks * 1408, 0);
    SynthSparseArgs a;
    a.out = out.data(), a.num_chunks = chunks, a.seed = seed;
    moesq::ops::synth_sparse48_kl_ref(a);
    return out;
  };
  const auto a5 = run(5, 3), a2 = run(2, 3), b5 = run(5, 4);
  EXPECT_TRUE(std::equal(a2.begin(), a2.end(), a5.begin())) << "chunk c depends on (seed, c) only";
  EXPECT_NE(a5, b5);
  SynthSparseArgs bad;
  bad.num_chunks = -1;
  EXPECT_THROW(moesq::ops::synth_sparse48_kl_ref(bad), moesq::Error);
  SynthBf16Args bad16;
  bad16.n = -1;
  EXPECT_THROW(moesq::ops::synth_bf16_ref(bad16), moesq::Error);
}

}  // namespace

// A slice drawn alone (`first`) has the bits of that slice of the whole tensor: what lets each rank of
// an expert-parallel engine draw only its own experts of a synthetic model (docs/PARALLEL.md).
TEST(SynthPackRef, ASliceDrawnAloneIsThatSliceOfTheWhole) {
  const int64_t n = 5000, first = 1234, len = 777;
  std::vector<uint16_t> whole(n), part(len);
  SynthBf16Args a;
  a.out = whole.data(), a.n = n, a.seed = 91, a.scale = 0.02f, a.mean = 0.1f;
  moesq::ops::synth_bf16_ref(a);
  a.out = part.data(), a.n = len, a.first = first;
  moesq::ops::synth_bf16_ref(a);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + first));
  const int64_t chunks = 40, c0 = 13, cn = 9;
  std::vector<uint8_t> all(chunks * 1408), some(cn * 1408);
  SynthSparseArgs s;
  s.out = all.data(), s.num_chunks = chunks, s.seed = 5;
  moesq::ops::synth_sparse48_kl_ref(s);
  s.out = some.data(), s.num_chunks = cn, s.first = c0;
  moesq::ops::synth_sparse48_kl_ref(s);
  EXPECT_TRUE(std::equal(some.begin(), some.end(), all.begin() + c0 * 1408));
  a.first = -1;
  EXPECT_THROW(moesq::ops::synth_bf16_ref(a), moesq::Error);
}
