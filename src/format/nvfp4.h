// NVFP4 quantization (DESIGN.md §3, paper Eq. 3 and 5), dense and paired 4:8 sparse.
//
// Tensor scale  γ = 448·6 / amax(W)                                   (Eq. 5)
// Block code    c_b = UE4M3(γ · amax_b / 6)   (amax_b over the block's KEPT values)
// Value code    q = E2M1(w · γ / dec(c_b));   dequant  ŵ = dec(q) · dec(c_b) / γ
// A zero block gets code 0 and all-zero values (never a division by zero). A zero tensor gets γ = 1.
// fp32 evaluation order (fixed, so that every implementation reproduces the same bits):
//   c_b = UE4M3((γ · amax_b) / 6);  s = dec(c_b);  q = E2M1(w · (γ / s));  ŵ = (dec(q) · s) / γ.
// A block whose code decodes to 0 (a zero block, or one below the smallest UE4M3 step) stores q = 0.
//
// Dense NVFP4: 16-element blocks along K, 4.5 bits/weight.
//   values [N, K/2]  two E2M1 codes per byte, element 2j in the low nibble
//   scales [N, K/16] UE4M3 codes
// Paired 4:8 NVFP4: groups of 8 along K = 4 pairs; exactly 2 pairs kept (6 patterns); 32-element
// (logical) scale blocks = 16 kept values; 2.75 bits/weight (Eq. 7).
//   values [N, K/4]  the K/2 kept values in K order, two E2M1 codes per byte, low nibble first
//   meta   [N, K/16] one ordered-metadata nibble per group (i0 | i1 << 2, i0 < i1), group g in byte
//                    g/2, low nibble for even g
//   scales [N, K/32] UE4M3 codes
// Requires K % 32 == 0 (Error naming the tensor otherwise).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moesq::format {

constexpr int kGroup = 8;             // paired 4:8 group along K
constexpr int kNumPatterns = 6;       // C(4,2)
constexpr int kSparseScaleBlock = 32; // logical weights per UE4M3 scale (16 kept values)
constexpr int kDenseScaleBlock = 16;  // dense NVFP4 block
constexpr int kActScaleBlock = 32;    // activation quantization block (same as the sparse weights)

// Kept pair indices of each pattern, ascending: {0,1},{0,2},{0,3},{1,2},{1,3},{2,3}.
constexpr std::array<std::array<uint8_t, 2>, kNumPatterns> kPatternPairs = {
    {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}}};
inline uint8_t pattern_nibble(int p) { return kPatternPairs[p][0] | (kPatternPairs[p][1] << 2); }
int pattern_from_nibble(uint8_t nibble);  // Error for a nibble that is not one of the 6
// Mask of pattern p over the 8 positions of a group: bit j set when position j is kept.
uint8_t pattern_mask8(int p);

// Eq. 5. amax <= 0 (zero tensor) → 1; amax so small that γ overflows fp32 (< ~8e-36) → 1 as well.
float nvfp4_tensor_scale(float amax);

// A STORED tensor scale γ that decodes: finite, > 0, and large enough that the largest code,
// 6 · 448 / γ (dequant_value), stays a finite fp32 — γ ≥ 2688 / FLT_MAX ≈ 7.9e-36, which Eq. 5 gives
// for every finite tensor. Checkpoint readers and both dequantizers call it. Error naming `name`.
void check_stored_tensor_scale(float gamma, std::string_view name);

// max |x_i| over x [n] (NaN entries ignored).
float amax_abs(const float* x, int64_t n);
// THE gate|up rule (docs/FORMAT.md "Checkpoint layout"): the one tensor scale γ shared by gate_proj
// and up_proj of an expert, Eq. 5 over the amax of ALL entries of both dense arrays being packed
// (gate [n], up [n]; pruned positions included): γ = nvfp4_tensor_scale(max(amax(gate), amax(up))).
// Every method (rtn, magnitude, sgptq, moesq refinement and its objective) calls this function.
float gate_up_tensor_scale(const float* gate, const float* up, int64_t n);
// max |w| over the KEPT positions of W [N, K] under patterns [N, K/8] (Eq. 5's amax for paired 4:8).
// Error naming `name` for K % 32 != 0, a pattern id out of range or a non-finite kept weight.
float sparse48_kept_amax(const float* W, int64_t N, int64_t K, const uint8_t* patterns,
                         const std::string& name = "weight");
// Zeroes the pruned positions of W [N, K] in place under patterns [N, K/8]. K % 8 == 0.
void apply_patterns(float* W, int64_t N, int64_t K, const uint8_t* patterns,
                    const std::string& name = "weight");

struct Nvfp4Tensor {
  int64_t N = 0, K = 0;
  std::vector<uint8_t> values;  // [N, K/2]
  std::vector<uint8_t> scales;  // [N, K/16] UE4M3
  float global_scale = 1.0f;    // γ (divisor)
  size_t packed_bytes() const { return values.size() + scales.size() + 4; }
};

struct Sparse48Tensor {
  int64_t N = 0, K = 0;
  std::vector<uint8_t> values;  // [N, K/4]
  std::vector<uint8_t> meta;    // [N, K/16]
  std::vector<uint8_t> scales;  // [N, K/32] UE4M3
  float global_scale = 1.0f;    // γ (divisor)
  size_t packed_bytes() const { return values.size() + meta.size() + scales.size() + 4; }
};

// W: [N, K] fp32 row-major. global_scale <= 0 → computed from amax(W) by Eq. 5.
Nvfp4Tensor nvfp4_quantize(const float* W, int64_t N, int64_t K, float global_scale = 0.0f,
                           const std::string& name = "weight");
void nvfp4_dequantize(const Nvfp4Tensor& t, float* out);  // out: [N, K]

// patterns: [N, K/8] pattern ids in [0, 6). Pruned positions are ignored (their values are not
// looked at), so W may be dense. global_scale <= 0 → Eq. 5 on the kept values.
Sparse48Tensor sparse48_quantize(const float* W, int64_t N, int64_t K, const uint8_t* patterns,
                                 float global_scale = 0.0f, const std::string& name = "weight");
void sparse48_dequantize(const Sparse48Tensor& t, float* out);  // out: [N, K], zeros where pruned
std::vector<uint8_t> sparse48_patterns(const Sparse48Tensor& t);  // [N, K/8] pattern ids

// Pattern choice by magnitude: per group keep the two pairs with the largest w0² + w1².
// Ties → the lower pattern id. Returns [N, K/8].
std::vector<uint8_t> magnitude_patterns(const float* W, int64_t N, int64_t K);

// Fake-quantizes (quantize then dequantize) blocks of `block` values that share one UE4M3 code
// under tensor scale γ, in place: the Q_w of Eq. 3 on a dense vector. Used by RTN, GPTQ and the
// refinement forward. `x`: [n], n % block == 0. global_scale <= 0 → Eq. 5 on amax(x).
// Bit-exact with quantize→dequantize of the same values and γ (the same fp32 expressions).
// Error for a non-finite entry of x. `unscaled` (optional, [n]): each value's dec(q)·s before the
// division by γ — an E2M1 value times a UE4M3 scale, ≤ 6 significant bits, so exact in bf16 — the
// operand the GPU refinement's bf16 forward GEMMs read (x = unscaled / γ, bit for bit).
void nvfp4_fake_quant_blocks(float* x, int64_t n, int block, float global_scale, float* unscaled = nullptr);

// Dynamic NVFP4 activation quantization of one token row x [K] (W4A4 eval, Eq. 4's Q_a):
// per-token tensor scale from amax(x), `block`-element UE4M3 blocks (32 for paired 4:8 experts,
// 16 for dense NVFP4: the same block size as the weights), in place. K % block == 0.
// A non-finite entry is an Error naming its column (the caller adds layer / expert / projection):
// the amax would skip a NaN and E2M1 has no NaN code, so quantizing it would hide it.
// `unscaled` / `gamma_out` (optional): as nvfp4_fake_quant_blocks' unscaled values, and the row's γ.
void quantize_activation_row(float* x, int64_t K, int block = kActScaleBlock, float* unscaled = nullptr,
                             float* gamma_out = nullptr);

// Measured bits per weight of a packed tensor: 8 · packed bytes / (N·K).
double bits_per_weight(size_t packed_bytes, int64_t N, int64_t K);

}  // namespace moesq::format
