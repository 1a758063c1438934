// Launchers: the non-GEMM steps of multi-head latent attention on the GPU (DeepSeek-V2 §2.1,
// DeepSeek-V3 §2.1.1; the engine's block is runtime/layers/mla_block.h), in the absorbed form of
// model/mixers/mla_decode.cpp, with a latent KV cache of r_kv + rope bf16 values per token:
//
//   mla_prep        after the fused [q_a | kv_a] GEMM: RMSNorm of the q LoRA part (q_a_layernorm →
//                   bf16 hi + lo, the q_b GEMM's input), RMSNorm of the latent c (kv_a_layernorm) and
//                   RoPE of the shared k_pe, both appended to the cache row of (slot, position);
//   mla_q           after the q_b GEMM: q_nope per head as bf16 hi + lo rows [nh, T, nope] (the W_UKᵀ
//                   grouped GEMM's input) and the rotated q_pe into columns [r_kv, r_kv + rope) of the
//                   attention's query rows [nh, T, r_kv + rope];
//   mla_attention   causal attention of those query rows over the latent cache (keys = whole rows,
//                   values = their first r_kv columns): o_lat [nh, T, r_kv] as bf16 hi + lo (the W_UV
//                   grouped GEMM's input);
//   mla_heads_to_rows  [nh, T, v] fp32 head outputs → [T, nh·v] bf16 hi + lo rows (o_proj's input).
//
// CPU twins (mla_ref.cpp): mla_prep, mla_q and mla_heads_to_rows are bitwise (fp64 RMS sums in the
// kernel's warp-butterfly order, fp32 products rounded as written); mla_attention_ref replays the
// kernel's fma chains, butterflies and merge order, with std::exp where the kernel calls expf (a few
// ulp apart).
//
// Non-obvious decisions:
//  - the cache row is [ĉ (r_kv) | k_pe (rope)]: one row is a key of r_kv + rope dims and its first r_kv
//    dims are the value, so a token's cache is r_kv + rope values for every head together (Kimi-K2.5:
//    576 bf16 = 1,152 B per token per layer, against 2·64·128 for the same heads in GQA);
//  - determinism (batch invariance, decode = prefill bitwise): a token's keys are cut into fixed 64-key
//    chunks by absolute index (a KV block, ops/attention/kv_layout.h) and the chunks into fixed ranges
//    of kMlaRangeChunks; each chunk's (max, Σ exp, Σ exp·v) comes from ONE device function, merged by
//    ONE merge function in ascending order into its range's partial, and the range partials merged in
//    ascending order into the output — either all in the CTA that walks the token's keys (sequential
//    path: a CTA per token and 4 heads) or with a CTA per range writing its partial and a combine
//    kernel merging them (split-KV: decode, where T is small). Same operations in the same order, so
//    the caller may pick the path by T; nothing depends on the batch, T or the other sequences. A
//    range (not a chunk) is the split unit so that the workspace stays small at long max_len; 256 keys
//    (not 1,024) and 4 heads per CTA (not 8) so that a decode token at 1–2k positions spreads over
//    ≈ 80 CTAs (Kimi-K2.5, 64 heads) instead of 8–16 (session 19 measured 371 µs per layer there);
//  - a CTA's query rows live in registers (18 dims per lane per head at D = 576) and each warp computes
//    P·V for a slice of ĉ's columns for ALL the CTA's heads (the values are shared by the heads), so a
//    value is read from shared memory once per CTA, not once per head. Which thread computes a
//    (head, column) does not change its arithmetic: the bits stay the twin's.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"
#include "ops/attention/kv_layout.h"

namespace moesq::ops {

constexpr int kMlaMaxLatent = 512;  // r_kv (kv_lora_rank) built: a multiple of 32, at most this
constexpr int kMlaMaxRope = 64;     // qk_rope_head_dim built: even, at most this
constexpr int kMlaHeadsPerCta = 4;  // mla_attention: query heads per CTA (4 warps)
constexpr int kMlaRangeChunks = 4;  // mla_attention: 64-key chunks per key range (256 keys), the split-KV unit

// Where a (slot, position) latent row lives: the KV layout of ops/attention/kv_layout.h with one
// "head" of r_kv + rope values per token.
struct MlaCacheArgs {
  uint16_t* cache = nullptr;          // [slots·max_len or kv_blocks·64, r_kv + rope] bf16
  const int32_t* block_table = nullptr;  // paged layout (kv_layout.h), or nullptr (contiguous)
  int64_t kv_blocks = 0;
  int64_t max_len = 0;
};

struct MlaPrepArgs {
  const float* a = nullptr;        // [T, lda] fp32: cols [0, q_cols) q part, [q_cols, +r_kv) c, then k_pe [rope]
  int64_t lda = 0;                 // ≥ q_cols + r_kv + rope
  int64_t q_cols = 0;              // r_q (q LoRA) or nh·(nope + rope) (q_proj: no norm here)
  int r_q = 0;                     // q_lora_rank; 0 = no q LoRA (qa_out unused)
  const float* q_a_norm = nullptr; // [r_q] q_a_layernorm weight
  uint16_t* qa_out = nullptr;      // [T, r_q] bf16 normalized q_a (hi), the q_b GEMM's input
  uint16_t* qa_out_lo = nullptr;   // [T, r_q] bf16 rounding residue
  const float* kv_a_norm = nullptr;  // [r_kv] kv_a_layernorm weight
  int r_kv = 0, rope = 0;
  bool rope_interleave = true;     // k_pe stored as interleaved pairs (deepseek_v3 rope_interleave)
  const float* cos = nullptr;      // [max_len, rope/2] fp32 (model::rope_tables of the MLA frequencies)
  const float* sin = nullptr;
  const int32_t* tok_slot = nullptr;  // [T]
  const int32_t* tok_pos = nullptr;   // [T] < max_len
  MlaCacheArgs kv;
  int64_t T = 0;
  double eps = 1e-6;               // model::kMlaLatentNormEps
};

struct MlaQArgs {
  const float* q = nullptr;        // [T, ldq] fp32: nh heads of [nope | rope] at column 0
  int64_t ldq = 0;                 // ≥ nh·(nope + rope)
  uint16_t* q_nope = nullptr;      // [nh, T, nope] bf16 hi
  uint16_t* q_nope_lo = nullptr;   // [nh, T, nope] bf16 residue
  float* q_att = nullptr;          // [nh, T, r_kv + rope] fp32: this op writes cols [r_kv, r_kv + rope)
  int nh = 0, nope = 0, rope = 0, r_kv = 0;
  bool rope_interleave = true;
  const float* cos = nullptr;      // [max_len, rope/2]
  const float* sin = nullptr;
  const int32_t* tok_pos = nullptr;  // [T]
  int64_t max_len = 0;
  int64_t T = 0;
};

struct MlaAttentionArgs {
  const float* q = nullptr;        // [nh, T, r_kv + rope] fp32 (W_UKᵀ·q_nope | rotated q_pe)
  MlaCacheArgs kv;                 // read only
  const int32_t* tok_slot = nullptr;  // [T]
  const int32_t* tok_pos = nullptr;   // [T] attends to keys [0, pos]
  uint16_t* out = nullptr;         // [nh, T, r_kv] bf16 Σ p·ĉ (hi)
  uint16_t* out_lo = nullptr;      // [nh, T, r_kv] bf16 residue
  int nh = 0, r_kv = 0, rope = 0;
  float scale = 1.0f;              // softmax scale (d_qk^-½ × YaRN mscale²)
  int64_t T = 0;
  // Split-KV path (decode: parallel over key ranges, then a merge kernel), or nullptr: the sequential
  // path. Both give every output the same bits. partial: mla_attention_partial_floats(T, nh, r_kv,
  // partial_ranges) floats; partial_ranges ≥ mla_attention_ranges(max_len).
  float* partial = nullptr;
  int64_t partial_ranges = 0;
};

struct MlaHeadsToRowsArgs {
  const float* x = nullptr;        // [nh, T, v] fp32
  uint16_t* y = nullptr;           // [T, nh·v] bf16 hi
  uint16_t* y_lo = nullptr;        // [T, nh·v] bf16 residue
  int nh = 0, v = 0;
  int64_t T = 0;
};

// Errors (launchers and twins alike): dims outside the built ones (naming them), missing pointers,
// positions outside [0, max_len) (twins), KV blocks outside the cache (twins).
void mla_prep(const MlaPrepArgs& args, cudaStream_t stream);
void mla_q(const MlaQArgs& args, cudaStream_t stream);
void mla_attention(const MlaAttentionArgs& args, cudaStream_t stream);
void mla_heads_to_rows(const MlaHeadsToRowsArgs& args, cudaStream_t stream);

void mla_prep_ref(const MlaPrepArgs& args);  // host pointers
void mla_q_ref(const MlaQArgs& args);
void mla_attention_ref(const MlaAttentionArgs& args);
void mla_heads_to_rows_ref(const MlaHeadsToRowsArgs& args);

void mla_prep_check(const MlaPrepArgs& args);
void mla_q_check(const MlaQArgs& args);
void mla_attention_check(const MlaAttentionArgs& args);
void mla_heads_to_rows_check(const MlaHeadsToRowsArgs& args);

// Key ranges of max_len positions: ⌈max_len / (64 · kMlaRangeChunks)⌉ (the split grid's depth).
int64_t mla_attention_ranges(int64_t max_len);
// Floats of the split-KV workspace: T · nh · ranges · (r_kv + 2).
size_t mla_attention_partial_floats(int64_t T, int nh, int r_kv, int64_t ranges);

// Dynamic shared memory of mla_attention for r_kv + rope = D: 4 score rows and 4 (max, Σ exp) pairs in
// fp32, one 64-key chunk of cache rows in bf16.
size_t mla_attention_smem_bytes(int r_kv, int rope);

}  // namespace moesq::ops
