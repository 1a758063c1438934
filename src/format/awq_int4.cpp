// AWQ int4 pack/unpack/quantize/dequantize and checkpoint tensors (see awq.h). Non-obvious: the
// scale is rounded to fp16 BEFORE the codes are chosen, so codes are optimal for the stored scale.
#include "format/awq_int4.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "core/splitmix64.h"

namespace moesq::format {

void awq_check_shape(int64_t N, int64_t K, const std::string& what) {
  MOESQ_CHECK(N > 0 && N % kAwqPack == 0, what, ": AWQ needs N % 8 == 0, got N=", N, " (K=", K, ")");
  MOESQ_CHECK(K > 0 && K % kAwqGroup == 0, what, ": AWQ needs K % 128 == 0 (group size), got K=", K,
              " (N=", N, ")");
}

std::vector<int32_t> awq_pack(const std::vector<uint8_t>& codes, int64_t R, int64_t N) {
  MOESQ_CHECK(static_cast<int64_t>(codes.size()) == R * N && N % kAwqPack == 0, "awq_pack: ", codes.size(),
              " codes for [", R, ", ", N, "]");
  std::vector<int32_t> out(R * N / kAwqPack);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < N / kAwqPack; ++w) {
      uint32_t word = 0;
      for (int i = 0; i < kAwqPack; ++i) {
        const uint8_t c = codes[r * N + w * kAwqPack + kAwqOrder[i]];
        MOESQ_CHECK(c < 16, "awq_pack: code ", int(c), " at [", r, ", ", w * kAwqPack + kAwqOrder[i],
                    "] is not int4");
        word |= static_cast<uint32_t>(c) << (4 * i);
      }
      out[r * (N / kAwqPack) + w] = static_cast<int32_t>(word);
    }
  return out;
}

std::vector<uint8_t> awq_unpack(const std::vector<int32_t>& words, int64_t R, int64_t N) {
  MOESQ_CHECK(static_cast<int64_t>(words.size()) * kAwqPack == R * N, "awq_unpack: ", words.size(),
              " words for [", R, ", ", N, "]");
  std::vector<uint8_t> out(R * N);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < N / kAwqPack; ++w) {
      const uint32_t word = static_cast<uint32_t>(words[r * (N / kAwqPack) + w]);
      for (int i = 0; i < kAwqPack; ++i) out[r * N + w * kAwqPack + kAwqOrder[i]] = (word >> (4 * i)) & 0xf;
    }
  return out;
}

AwqLinear awq_from_codes(int64_t N, int64_t K, const std::vector<uint8_t>& codes,
                         const std::vector<uint8_t>& zeros, const std::vector<uint16_t>& scales) {
  awq_check_shape(N, K, "awq_from_codes");
  MOESQ_CHECK(static_cast<int64_t>(scales.size()) == K / kAwqGroup * N, "awq_from_codes: scales has ",
              scales.size(), " entries, expected [K/128, N] = ", K / kAwqGroup * N);
  AwqLinear l;
  l.N = N;
  l.K = K;
  l.qweight = awq_pack(codes, K, N);
  l.qzeros = awq_pack(zeros, K / kAwqGroup, N);
  l.scales = scales;
  return l;
}

AwqLinear awq_quantize(const std::vector<float>& W, int64_t N, int64_t K, const std::string& what) {
  awq_check_shape(N, K, what);
  MOESQ_CHECK(static_cast<int64_t>(W.size()) == N * K, what, ": ", W.size(), " values for [", N, ", ", K, "]");
  const int64_t G = K / kAwqGroup;
  std::vector<uint8_t> codes(K * N), zeros(G * N);
  std::vector<uint16_t> scales(G * N);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const float* w = &W[n * K + g * kAwqGroup];
      float lo = w[0], hi = w[0];
      for (int i = 0; i < kAwqGroup; ++i) {
        MOESQ_CHECK(std::isfinite(w[i]), what, ": non-finite weight at [", n, ", ", g * kAwqGroup + i, "]");
        lo = std::min(lo, w[i]);
        hi = std::max(hi, w[i]);
      }
      const uint16_t s16 = f32_to_f16(std::max(hi - lo, 1e-5f) / 15.0f);
      const float s = f16_to_f32(s16);
      const int z = std::clamp(static_cast<int>(std::nearbyint(-lo / s)), 0, 15);
      scales[g * N + n] = s16;
      zeros[g * N + n] = static_cast<uint8_t>(z);
      for (int i = 0; i < kAwqGroup; ++i)
        codes[(g * kAwqGroup + i) * N + n] =
            static_cast<uint8_t>(std::clamp(static_cast<int>(std::nearbyint(w[i] / s)) + z, 0, 15));
    }
  return awq_from_codes(N, K, codes, zeros, scales);
}

float awq_dequant_one(const AwqLinear& w, int64_t n, int64_t k) {
  const int64_t g = k / kAwqGroup;
  return f16_to_f32(f32_to_f16(static_cast<float>(w.q(k, n) - w.zero(g, n)) * f16_to_f32(w.scale(g, n))));
}

std::vector<float> awq_dequantize_ref(const AwqLinear& w) {
  std::vector<float> out(w.N * w.K);
  for (int64_t n = 0; n < w.N; ++n)
    for (int64_t k = 0; k < w.K; ++k) out[n * w.K + k] = awq_dequant_one(w, n, k);
  return out;
}

AwqLinear awq_random(int64_t N, int64_t K, uint64_t seed, float scale_lo, float scale_hi) {
  awq_check_shape(N, K, "awq_random");
  SplitMix64 g(seed);
  std::vector<uint8_t> codes(K * N), zeros(K / kAwqGroup * N);
  std::vector<uint16_t> scales(K / kAwqGroup * N);
  for (size_t i = 0; i < codes.size(); i += 16) {  // 16 nibbles per 64-bit draw
    uint64_t bits = g.next();
    for (size_t j = i; j < std::min(codes.size(), i + 16); ++j, bits >>= 4) codes[j] = bits & 0xf;
  }
  for (auto& z : zeros) z = static_cast<uint8_t>(6 + g.below(4));
  for (auto& s : scales) s = f32_to_f16(scale_lo + (scale_hi - scale_lo) * g.uniform());
  return awq_from_codes(N, K, codes, zeros, scales);
}

}  // namespace moesq::format
