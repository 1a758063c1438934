// Dense NVFP4 and paired 4:8 NVFP4: quantize (pack), dequantize (unpack), patterns, fake quant and
// dynamic activation quantization (nvfp4.h; DESIGN.md §3; paper Eq. 3, 5, 7).
//
// Non-obvious decision: every path — dense pack, sparse pack, unpack, nvfp4_fake_quant_blocks and
// quantize_activation_row — goes through the same three inline helpers (block_scale, quant_value,
// dequant_value) with ONE fixed fp32 evaluation order:
//   block code  c = UE4M3((γ · amax_b) / 6)
//   value code  q = E2M1(w · (γ / s)),        s = dec(c)   (one reciprocal-style factor per block)
//   dequant     ŵ = (dec(q) · s) / γ          (dec(q)·s is exact: ≤ 6 significant bits)
// so fake quant agrees BIT-EXACTLY with quantize→dequantize, and the GPU activation quantizer can
// reproduce it by using the same order. A block whose code decodes to 0 (all-zero or tiny block)
// stores all-zero values: nothing is ever divided by a zero scale.
#include "format/nvfp4.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string_view>

#include "core/error.h"
#include "format/fp_codecs.h"

namespace moesq::format {

namespace {

// Divisor 6 of Eq. 5 / the block scale: the largest E2M1 magnitude.
constexpr float kE2M1MaxF = kE2M1Max;
// γ = 448·6 / amax (Eq. 5).
constexpr float kEq5Numerator = kE4M3Max * kE2M1Max;

struct BlockScale {
  uint8_t code;  // UE4M3 code of the block
  float scale;   // dec(code), 0 for a zero block
  float inv;     // γ / scale (0 for a zero block): the multiplier that maps w onto the E2M1 grid
};

inline BlockScale block_scale(float block_amax, float gamma) {
  const uint8_t code = ue4m3_encode(gamma * block_amax / kE2M1MaxF);
  const float s = e4m3_decode(code);
  return {code, s, s > 0.0f ? gamma / s : 0.0f};
}

inline uint8_t quant_value(float w, const BlockScale& b) {
  return b.scale > 0.0f ? e2m1_encode(w * b.inv) : uint8_t{0};
}

inline float dequant_value(uint8_t q, float scale, float gamma) {
  return e2m1_decode(q) * scale / gamma;
}

inline float max_abs(const float* x, int64_t n) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

// Index of the first non-finite entry of x [n], or -1. A separate pass: max_abs skips NaN (std::max
// keeps its first argument), so the amax alone cannot tell.
inline int64_t first_non_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

// Nibble → pattern id, −1 for the 10 nibbles that are not ordered metadata of a kept pair set.
struct NibbleTable {
  int8_t id[16];
  constexpr NibbleTable() : id{} {
    for (int n = 0; n < 16; ++n) id[n] = -1;
    for (int p = 0; p < kNumPatterns; ++p) id[kPatternPairs[p][0] | (kPatternPairs[p][1] << 2)] = p;
  }
};
constexpr NibbleTable kNibbleToPattern{};

// Positions (0..7) of the 4 kept weights of pattern p inside its group, ascending.
inline void kept_positions(int p, int pos[4]) {
  const int i0 = kPatternPairs[p][0], i1 = kPatternPairs[p][1];
  pos[0] = 2 * i0;
  pos[1] = 2 * i0 + 1;
  pos[2] = 2 * i1;
  pos[3] = 2 * i1 + 1;
}

inline void put_nibble(uint8_t* bytes, int64_t idx, uint8_t nib) {
  uint8_t& b = bytes[idx >> 1];
  b = (idx & 1) ? static_cast<uint8_t>((b & 0x0f) | (nib << 4)) : static_cast<uint8_t>((b & 0xf0) | nib);
}
inline uint8_t get_nibble(const uint8_t* bytes, int64_t idx) {
  return (idx & 1) ? static_cast<uint8_t>(bytes[idx >> 1] >> 4) : static_cast<uint8_t>(bytes[idx >> 1] & 0x0f);
}

void check_patterns(const uint8_t* patterns, int64_t N, int64_t K, const std::string& name) {
  MOESQ_CHECK(patterns != nullptr || N * K == 0, "tensor ", name, ": no pattern array given");
  const int64_t G = K / kGroup;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t p = patterns[n * G + g];
      MOESQ_CHECK(p < kNumPatterns, "tensor ", name, " [N=", N, ", K=", K, "]: pattern id ", int(p),
                  " at row ", n, " group ", g, " is out of range [0, ", kNumPatterns, ")");
    }
}

void check_gamma(float gamma, std::string_view name) {
  MOESQ_CHECK(std::isfinite(gamma) && gamma > 0.0f, "tensor ", name, ": global scale ", gamma,
              " is not a positive finite number");
}

// A stored UE4M3 block scale must be non-negative and not NaN (a checkpoint could hold anything).
void check_scale_codes(const std::vector<uint8_t>& scales, const char* what) {
  for (size_t i = 0; i < scales.size(); ++i)
    MOESQ_CHECK(!(scales[i] & 0x80) && scales[i] != 0x7f, what, ": block scale ", i, " has code 0x", std::hex,
                int(scales[i]), ", not a finite non-negative UE4M3 value");
}

}  // namespace

int pattern_from_nibble(uint8_t nibble) {
  const int p = nibble < 16 ? kNibbleToPattern.id[nibble] : -1;
  MOESQ_CHECK(p >= 0, "metadata nibble 0x", std::hex, int(nibble),
              " is not one of the 6 paired 4:8 patterns (0x4 0x8 0xc 0x9 0xd 0xe)");
  return p;
}

uint8_t pattern_mask8(int p) {
  MOESQ_CHECK(p >= 0 && p < kNumPatterns, "pattern id ", p, " is out of range [0, ", kNumPatterns, ")");
  return static_cast<uint8_t>((0x3u << (2 * kPatternPairs[p][0])) | (0x3u << (2 * kPatternPairs[p][1])));
}

float nvfp4_tensor_scale(float amax) {
  if (!(amax > 0.0f)) return 1.0f;  // zero tensor (or NaN amax): γ = 1, every block gets code 0
  const float gamma = kEq5Numerator / amax;
  // amax below 2688 / FLT_MAX (≈ 8e-36) overflows γ: such a tensor quantizes to zeros like a zero one.
  return std::isfinite(gamma) ? gamma : 1.0f;
}

void check_stored_tensor_scale(float gamma, std::string_view name) {
  MOESQ_CHECK(std::isfinite(gamma) && gamma > 0.0f && std::isfinite(kEq5Numerator / gamma), "tensor ", name,
              ": global scale ", gamma, " is not a finite number >= ", kEq5Numerator / FLT_MAX,
              " (the largest code would decode to 6 * 448 / global scale = ", kEq5Numerator / gamma, ")");
}

float amax_abs(const float* x, int64_t n) { return max_abs(x, n); }

float gate_up_tensor_scale(const float* gate, const float* up, int64_t n) {
  return nvfp4_tensor_scale(std::max(max_abs(gate, n), max_abs(up, n)));
}

float sparse48_kept_amax(const float* W, int64_t N, int64_t K, const uint8_t* patterns,
                         const std::string& name) {
  MOESQ_CHECK(K % kSparseScaleBlock == 0, "tensor ", name, " [N=", N, ", K=", K,
              "]: paired 4:8 NVFP4 needs K % ", kSparseScaleBlock, " == 0");
  check_patterns(patterns, N, K, name);
  const int64_t G = K / kGroup;
  float amax = 0.0f;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      int pos[4];
      kept_positions(patterns[n * G + g], pos);
      const float* w = W + n * K + g * kGroup;
      for (int j = 0; j < 4; ++j) {
        MOESQ_CHECK(std::isfinite(w[pos[j]]), "tensor ", name, " [N=", N, ", K=", K, "]: non-finite kept weight ",
                    w[pos[j]], " at row ", n, " column ", g * kGroup + pos[j]);
        amax = std::max(amax, std::fabs(w[pos[j]]));
      }
    }
  return amax;
}

void apply_patterns(float* W, int64_t N, int64_t K, const uint8_t* patterns, const std::string& name) {
  MOESQ_CHECK(K % kGroup == 0, "tensor ", name, " [N=", N, ", K=", K, "]: K % ", kGroup, " != 0");
  check_patterns(patterns, N, K, name);
  const int64_t G = K / kGroup;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t mask = pattern_mask8(patterns[n * G + g]);
      float* w = W + n * K + g * kGroup;
      for (int j = 0; j < kGroup; ++j)
        if (!((mask >> j) & 1)) w[j] = 0.0f;
    }
}

// ---- dense NVFP4 ------------------------------------------------------------------------------

Nvfp4Tensor nvfp4_quantize(const float* W, int64_t N, int64_t K, float global_scale,
                           const std::string& name) {
  MOESQ_CHECK(N >= 0 && K > 0 && K % kDenseScaleBlock == 0, "tensor ", name, " [N=", N, ", K=", K,
              "]: dense NVFP4 needs K > 0 and K % ", kDenseScaleBlock, " == 0");
  for (int64_t i = 0; i < N * K; ++i)
    MOESQ_CHECK(std::isfinite(W[i]), "tensor ", name, " [N=", N, ", K=", K, "]: non-finite weight ", W[i],
                " at row ", i / K, " column ", i % K);
  const float amax = max_abs(W, N * K);
  Nvfp4Tensor t;
  t.N = N;
  t.K = K;
  t.global_scale = global_scale > 0.0f ? global_scale : nvfp4_tensor_scale(amax);
  check_gamma(t.global_scale, name);
  t.values.assign(static_cast<size_t>(N * K / 2), 0);
  t.scales.assign(static_cast<size_t>(N * K / kDenseScaleBlock), 0);
  const int64_t B = K / kDenseScaleBlock;
  for (int64_t n = 0; n < N; ++n) {
    const float* w = W + n * K;                 // [K]
    uint8_t* vals = t.values.data() + n * K / 2;  // [K/2] packed e2m1
    for (int64_t b = 0; b < B; ++b) {
      const float* wb = w + b * kDenseScaleBlock;
      const BlockScale bs = block_scale(max_abs(wb, kDenseScaleBlock), t.global_scale);
      t.scales[n * B + b] = bs.code;
      for (int j = 0; j < kDenseScaleBlock; ++j)
        put_nibble(vals, b * kDenseScaleBlock + j, quant_value(wb[j], bs));
    }
  }
  return t;
}

void nvfp4_dequantize(const Nvfp4Tensor& t, float* out) {
  const int64_t N = t.N, K = t.K;
  MOESQ_CHECK(K > 0 && K % kDenseScaleBlock == 0 && t.values.size() == static_cast<size_t>(N * K / 2) &&
                  t.scales.size() == static_cast<size_t>(N * K / kDenseScaleBlock),
              "dense NVFP4 tensor [N=", N, ", K=", K, "]: values has ", t.values.size(), " bytes and scales ",
              t.scales.size(), ", expected ", N * K / 2, " and ", N * K / kDenseScaleBlock);
  check_stored_tensor_scale(t.global_scale, "dense NVFP4 tensor");
  check_scale_codes(t.scales, "dense NVFP4 tensor");
  const int64_t B = K / kDenseScaleBlock;
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* vals = t.values.data() + n * K / 2;
    for (int64_t b = 0; b < B; ++b) {
      const float s = e4m3_decode(t.scales[n * B + b]);
      for (int j = 0; j < kDenseScaleBlock; ++j) {
        const int64_t k = b * kDenseScaleBlock + j;
        out[n * K + k] = dequant_value(get_nibble(vals, k), s, t.global_scale);
      }
    }
  }
}

// ---- paired 4:8 NVFP4 -------------------------------------------------------------------------

Sparse48Tensor sparse48_quantize(const float* W, int64_t N, int64_t K, const uint8_t* patterns,
                                 float global_scale, const std::string& name) {
  MOESQ_CHECK(N >= 0 && K > 0 && K % kSparseScaleBlock == 0, "tensor ", name, " [N=", N, ", K=", K,
              "]: paired 4:8 NVFP4 needs K > 0 and K % ", kSparseScaleBlock, " == 0");
  const float amax = sparse48_kept_amax(W, N, K, patterns, name);  // also range-checks the patterns
  Sparse48Tensor t;
  t.N = N;
  t.K = K;
  t.global_scale = global_scale > 0.0f ? global_scale : nvfp4_tensor_scale(amax);
  check_gamma(t.global_scale, name);
  t.values.assign(static_cast<size_t>(N * K / 4), 0);
  t.meta.assign(static_cast<size_t>(N * K / 16), 0);
  t.scales.assign(static_cast<size_t>(N * K / kSparseScaleBlock), 0);
  constexpr int kGroupsPerBlock = kSparseScaleBlock / kGroup;  // 4
  constexpr int kKeptPerBlock = kSparseScaleBlock / 2;        // 16
  const int64_t G = K / kGroup, B = K / kSparseScaleBlock;
  for (int64_t n = 0; n < N; ++n) {
    const float* w = W + n * K;                     // [K]
    const uint8_t* pat = patterns + n * G;          // [K/8]
    uint8_t* vals = t.values.data() + n * K / 4;    // [K/4] packed e2m1, kept values in K order
    uint8_t* meta = t.meta.data() + n * K / 16;     // [K/16] two nibbles per byte
    for (int64_t b = 0; b < B; ++b) {
      float kept[kKeptPerBlock];
      for (int gi = 0; gi < kGroupsPerBlock; ++gi) {
        const int64_t g = b * kGroupsPerBlock + gi;
        int pos[4];
        kept_positions(pat[g], pos);
        for (int j = 0; j < 4; ++j) kept[gi * 4 + j] = w[g * kGroup + pos[j]];
        put_nibble(meta, g, pattern_nibble(pat[g]));
      }
      const BlockScale bs = block_scale(max_abs(kept, kKeptPerBlock), t.global_scale);
      t.scales[n * B + b] = bs.code;
      for (int j = 0; j < kKeptPerBlock; ++j) put_nibble(vals, b * kKeptPerBlock + j, quant_value(kept[j], bs));
    }
  }
  return t;
}

namespace {
void check_sparse48(const Sparse48Tensor& t) {
  const int64_t N = t.N, K = t.K;
  MOESQ_CHECK(K > 0 && K % kSparseScaleBlock == 0 && t.values.size() == static_cast<size_t>(N * K / 4) &&
                  t.meta.size() == static_cast<size_t>(N * K / 16) &&
                  t.scales.size() == static_cast<size_t>(N * K / kSparseScaleBlock),
              "paired 4:8 NVFP4 tensor [N=", N, ", K=", K, "]: values/meta/scales have ", t.values.size(), "/",
              t.meta.size(), "/", t.scales.size(), " bytes, expected ", N * K / 4, "/", N * K / 16, "/",
              N * K / kSparseScaleBlock);
}
int checked_pattern(const uint8_t* meta, int64_t n, int64_t g) {
  const uint8_t nib = get_nibble(meta, g);
  const int p = kNibbleToPattern.id[nib];
  MOESQ_CHECK(p >= 0, "paired 4:8 NVFP4 tensor: metadata nibble 0x", std::hex, int(nib), std::dec, " at row ", n,
              " group ", g, " is not one of the 6 patterns");
  return p;
}
}  // namespace

void sparse48_dequantize(const Sparse48Tensor& t, float* out) {
  check_sparse48(t);
  check_stored_tensor_scale(t.global_scale, "paired 4:8 NVFP4 tensor");
  check_scale_codes(t.scales, "paired 4:8 NVFP4 tensor");
  const int64_t N = t.N, K = t.K, G = K / kGroup;
  constexpr int kKeptPerBlock = kSparseScaleBlock / 2;
  std::array<float, 256> dec{};  // the scale codes' values (all finite: checked above)
  for (int c = 0; c < 256; ++c) dec[static_cast<size_t>(c)] = e4m3_decode(static_cast<uint8_t>(c));
  // One pass: each group's 8 outputs (its 4 kept values, zeros elsewhere) written together — the
  // compression's error stage dequantizes every expert it packs (session 20: ≈ 65 ms per 2,048 × 7,168
  // tensor as a zero fill plus a scatter, on a worker thread per expert).
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* vals = t.values.data() + n * K / 4;
    const uint8_t* meta = t.meta.data() + n * K / 16;
    const uint8_t* scales = t.scales.data() + n * K / kSparseScaleBlock;
    float* row = out + n * K;
    for (int64_t g = 0; g < G; ++g) {
      int pos[4];
      kept_positions(checked_pattern(meta, n, g), pos);
      const float s = dec[scales[g * 4 / kKeptPerBlock]];  // 4 kept values per group
      float v[kGroup] = {};
      const uint8_t b0 = vals[g * 2], b1 = vals[g * 2 + 1];  // the group's 4 nibbles, low nibble first
      v[pos[0]] = dequant_value(static_cast<uint8_t>(b0 & 0x0f), s, t.global_scale);
      v[pos[1]] = dequant_value(static_cast<uint8_t>(b0 >> 4), s, t.global_scale);
      v[pos[2]] = dequant_value(static_cast<uint8_t>(b1 & 0x0f), s, t.global_scale);
      v[pos[3]] = dequant_value(static_cast<uint8_t>(b1 >> 4), s, t.global_scale);
      std::memcpy(row + g * kGroup, v, sizeof(v));
    }
  }
}

std::vector<uint8_t> sparse48_patterns(const Sparse48Tensor& t) {
  check_sparse48(t);
  const int64_t G = t.K / kGroup;
  std::vector<uint8_t> p(static_cast<size_t>(t.N * G));
  for (int64_t n = 0; n < t.N; ++n)
    for (int64_t g = 0; g < G; ++g)
      p[n * G + g] = static_cast<uint8_t>(checked_pattern(t.meta.data() + n * t.K / 16, n, g));
  return p;
}

std::vector<uint8_t> magnitude_patterns(const float* W, int64_t N, int64_t K) {
  MOESQ_CHECK(K % kGroup == 0, "magnitude_patterns: K=", K, " is not a multiple of ", kGroup);
  const int64_t G = K / kGroup;
  std::vector<uint8_t> out(static_cast<size_t>(N * G));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const float* w = W + n * K + g * kGroup;
      double e[4];  // pair energies w0² + w1² (double: no ties manufactured by fp32 rounding)
      for (int i = 0; i < 4; ++i) e[i] = double(w[2 * i]) * w[2 * i] + double(w[2 * i + 1]) * w[2 * i + 1];
      // Largest pair first (lowest index among equals), then the largest of the rest: the
      // lexicographically smallest kept set among ties = the lowest pattern id.
      int a = 0;
      for (int i = 1; i < 4; ++i)
        if (e[i] > e[a]) a = i;
      int b = a == 0 ? 1 : 0;
      for (int i = 0; i < 4; ++i)
        if (i != a && e[i] > e[b]) b = i;
      const int i0 = std::min(a, b), i1 = std::max(a, b);
      int p = 0;
      while (kPatternPairs[p][0] != i0 || kPatternPairs[p][1] != i1) ++p;
      out[n * G + g] = static_cast<uint8_t>(p);
    }
  return out;
}

// ---- fake quant and activations ---------------------------------------------------------------

void nvfp4_fake_quant_blocks(float* x, int64_t n, int block, float global_scale, float* unscaled) {
  MOESQ_CHECK(block > 0 && n % block == 0, "nvfp4_fake_quant_blocks: n=", n, " is not a multiple of block=", block);
  const int64_t bad = first_non_finite(x, n);
  MOESQ_CHECK(bad < 0, "NVFP4 quantization: non-finite value ", x[bad], " at index ", bad, " of ", n);
  const float gamma = global_scale > 0.0f ? global_scale : nvfp4_tensor_scale(max_abs(x, n));
  check_gamma(gamma, "nvfp4_fake_quant_blocks");
  for (int64_t b = 0; b < n; b += block) {
    float* xb = x + b;
    const BlockScale bs = block_scale(max_abs(xb, block), gamma);
    for (int j = 0; j < block; ++j) {
      const uint8_t q = quant_value(xb[j], bs);
      xb[j] = dequant_value(q, bs.scale, gamma);
      if (unscaled) unscaled[b + j] = e2m1_decode(q) * bs.scale;
    }
  }
}

void quantize_activation_row(float* x, int64_t K, int block, float* unscaled, float* gamma_out) {
  MOESQ_CHECK(block > 0 && K % block == 0, "activation quantization: K=", K, " is not a multiple of the block size ",
              block);
  const int64_t bad = first_non_finite(x, K);
  MOESQ_CHECK(bad < 0, "activation quantization: non-finite activation ", x[bad], " at column ", bad, " of K=", K);
  const float gamma = nvfp4_tensor_scale(max_abs(x, K));
  if (gamma_out) *gamma_out = gamma;
  nvfp4_fake_quant_blocks(x, K, block, gamma, unscaled);
}

double bits_per_weight(size_t packed_bytes, int64_t N, int64_t K) {
  MOESQ_CHECK(N > 0 && K > 0, "bits_per_weight: empty tensor [N=", N, ", K=", K, "]");
  return 8.0 * static_cast<double>(packed_bytes) / (static_cast<double>(N) * static_cast<double>(K));
}

}  // namespace moesq::format
