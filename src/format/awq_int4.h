// AWQ int4 weights (asymmetric, group 128, zero points) in the layout AutoAWQ publishes (GEMM version).
//
// For a Linear with weight W [N, K] (PyTorch layout, K = in_features):
//   qweight [K, N/8]        int32, 8 output columns per word, AWQ nibble order: nibble i holds column
//                           8·w + kAwqOrder[i], i.e. columns [0,2,4,6,1,3,5,7] from the low nibble up
//   qzeros  [K/128, N/8]    int32, same packing, zero point z ∈ [0, 15]
//   scales  [K/128, N]      fp16 scale s
// Dequant ŵ[n][k] = (q − z) · s in fp16 (as Marlin does in registers: (q − z) is an exact small
// integer, the product is rounded once to fp16).
// Quantization is AWQ's: per (group, column) s = max(amax − amin, 1e-5) / 15 (rounded to fp16),
// z = clamp(round(−amin / s), 0, 15), q = clamp(round(w / s) + z, 0, 15). The activation-aware
// per-channel search of AWQ is not applied here (this is the format, with its RTN quantizer).
// The one non-obvious decision: we keep the published int32 words as THE in-memory form, so a checkpoint
// round-trips bit for bit and the kernels read exactly what the hub ships.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace moesq::format {

constexpr int kAwqGroup = 128;  // K elements per (scale, zero) group
constexpr int kAwqPack = 8;     // int4 values per int32 word
// Column held by nibble i of a word (AutoAWQ's AWQ_ORDER).
constexpr std::array<int, 8> kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7};
// Nibble that holds column c % 8 (AutoAWQ's AWQ_REVERSE_ORDER).
constexpr std::array<int, 8> kAwqReverseOrder = {0, 4, 1, 5, 2, 6, 3, 7};

struct AwqLinear {
  int64_t N = 0, K = 0;
  std::vector<int32_t> qweight;  // [K, N/8] int32, AWQ nibble order
  std::vector<int32_t> qzeros;   // [K/128, N/8] int32, AWQ nibble order
  std::vector<uint16_t> scales;  // [K/128, N] fp16 bits

  bool empty() const { return qweight.empty(); }
  int q(int64_t k, int64_t n) const {  // int4 code of W[n][k]
    return (qweight[k * (N / 8) + n / 8] >> (4 * kAwqReverseOrder[n % 8])) & 0xf;
  }
  int zero(int64_t g, int64_t n) const { return (qzeros[g * (N / 8) + n / 8] >> (4 * kAwqReverseOrder[n % 8])) & 0xf; }
  uint16_t scale(int64_t g, int64_t n) const { return scales[g * N + n]; }
  size_t packed_bytes() const { return 4 * (qweight.size() + qzeros.size()) + 2 * scales.size(); }
};

// Checks N % 8 == 0 and K % 128 == 0 (Error naming `what`, N, K).
void awq_check_shape(int64_t N, int64_t K, const std::string& what);

// Packs int4 codes `codes` [R, N] (values 0..15, row-major) into AWQ words [R, N/8].
std::vector<int32_t> awq_pack(const std::vector<uint8_t>& codes, int64_t R, int64_t N);
std::vector<uint8_t> awq_unpack(const std::vector<int32_t>& words, int64_t R, int64_t N);  // inverse

// Builds an AwqLinear from codes [K, N], zeros [K/128, N] and fp16 scales [K/128, N].
AwqLinear awq_from_codes(int64_t N, int64_t K, const std::vector<uint8_t>& codes,
                         const std::vector<uint8_t>& zeros, const std::vector<uint16_t>& scales);

// Quantizes W [N, K] fp32 (PyTorch layout) to AWQ int4 (see the header comment).
AwqLinear awq_quantize(const std::vector<float>& W, int64_t N, int64_t K, const std::string& what = "weight");
// ŵ as fp32 values of fp16 numbers, [N, K] (PyTorch layout). The plain reference dequantizer.
std::vector<float> awq_dequantize_ref(const AwqLinear& w);
// One dequantized weight (q − z)·s rounded to fp16, returned as fp32.
float awq_dequant_one(const AwqLinear& w, int64_t n, int64_t k);

// Random AWQ weights from a seed: codes uniform 0..15, zeros uniform in [6, 9], fp16 scales
// uniform in [scale_lo, scale_hi). Deterministic per seed (used by the audit fixture).
AwqLinear awq_random(int64_t N, int64_t K, uint64_t seed, float scale_lo, float scale_hi);

}  // namespace moesq::format
