// Launcher: after the fused q|k|v projection, the projection biases (Qwen2-MoE's q/k/v biases) when
// given, then RMSNorm of q and k — per head (Qwen3's q_norm/k_norm), over the whole projection
// (whole_qk_norm: OLMoE's q_norm [nh·hd], k_norm [nkv·hd]) or none (q_norm = k_norm = nullptr:
// Mixtral, Qwen2-MoE) — RoPE with the CPU forward's tables (model::rope_tables, uploaded once), and the
// append of k and v to the bf16 KV cache at each token's (sequence slot, position) — or into fp32 k/v
// rows (k_out, v_out). q stays fp32 for the attention. The CPU forward's order (model/mixers/attention,
// model/mixers/gated_attention for partial RoPE and the q gate layout).
// CPU twin: qk_rope_ref, bitwise equal: the head norm's fp64 sum is a warp butterfly that the twin
// replays, and every fp32 product/sum is rounded as written (no fma), as in model::apply_rope.
#pragma once
#include <cstdint>

#include "ops/attention/kv_layout.h"

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace moesq::ops {

struct QkRopeArgs {
  const float* qkv = nullptr;      // [T, (nh + 2·nkv)·hd] fp32: q heads, then k heads, then v heads
  const float* q_norm = nullptr;   // [hd] fp32 ([nh·hd] with whole_qk_norm), or nullptr with k_norm: no norm
  const float* k_norm = nullptr;   // [hd] fp32 ([nkv·hd] with whole_qk_norm)
  bool whole_qk_norm = false;      // one RMSNorm over each token's whole q (and k) projection
  const float* qkv_bias = nullptr; // [(nh + 2·nkv)·hd] fp32 added to each qkv row first, or nullptr
  const float* cos = nullptr;      // [max_len, hd/2] fp32 RoPE table
  const float* sin = nullptr;      // [max_len, hd/2] fp32
  const int32_t* tok_slot = nullptr;  // [T] KV-cache slot (sequence) of each token: any slots, any order
  const int32_t* tok_pos = nullptr;   // [T] position of each token in its sequence, < max_len
  float* q_out = nullptr;          // [T, nh·hd] fp32 normalized + rotated queries
  uint16_t* k_cache = nullptr;     // [slots, max_len, nkv, hd] bf16, or [kv_blocks, 64, nkv, hd] when paged
  uint16_t* v_cache = nullptr;     // the same layout as k_cache
  // Paged KV (ops/attention/kv_layout.h): [slots, ⌈max_len/64⌉] physical block of each slot's blocks,
  // or nullptr (contiguous). kv_blocks: blocks in the cache (the twin checks the table against it).
  const int32_t* block_table = nullptr;
  int64_t kv_blocks = 0;
  // Instead of the cache (compression's fp32 layer forward, compress/attention_cuda): k and v as fp32
  // rows [T, nkv·hd]; then k_cache, v_cache and tok_slot are unused (may be null). Both or neither.
  float* k_out = nullptr;
  float* v_out = nullptr;
  int64_t T = 0;
  int nh = 0, nkv = 0, hd = 0;     // hd % 32 == 0, hd ≤ 256
  int64_t max_len = 0;
  double eps = 1e-6;
  // Partial RoPE (Qwen3-Next / Qwen3.5: partial_rotary_factor): the leading `rot` dims of each q and k
  // head rotate (pairs i, i + rot/2, the tables [max_len, rot/2]), the rest pass unchanged; 0: all hd.
  int rot = 0;
  // Gated attention (Qwen3-Next / Qwen3.5): each q head of the projection is [query hd | gate hd], so a
  // row is [(2·nh + 2·nkv)·hd]; the gates stay in qkv for the attention (AttentionArgs::gate). Not
  // with qkv_bias or whole_qk_norm.
  bool q_gate = false;
  MOESQ_KV_HD int rotary_dims() const { return rot > 0 ? rot : hd; }
  MOESQ_KV_HD int64_t row_width() const { return static_cast<int64_t>((q_gate ? 2 * nh : nh) + 2 * nkv) * hd; }
};

void qk_rope(const QkRopeArgs& args, cudaStream_t stream);
void qk_rope_ref(const QkRopeArgs& args);  // host pointers
void qk_rope_check(const QkRopeArgs& args);

}  // namespace moesq::ops
