// Launcher: causal GQA attention of query rows over the bf16 KV cache, prefill and decode alike:
// token t (sequence slot s_t, position p_t) attends to keys 0..p_t of slot s_t (p_t − window + 1 .. p_t
// on a sliding-window layer; with optional per-head attention sinks), query head h reads
// kv head h / (nh / nkv), scores · scale, fp32 softmax. Prefill appends all keys first (qk_rope),
// so a causal prefill and a decode step attend over the same cache. Tensor cores: mma.sync
// m16n8k16 bf16 → fp32; the fp32 q and the fp32 probabilities enter as bf16 hi + lo pairs (two MMAs),
// so scores and P·V keep ≈ 16 significant bits of their fp32 inputs. CPU twin: attention_ref.
//
// Non-obvious decision (batch invariance, decode = prefill bitwise): a row's keys are cut into
// fixed chunks of kAttnChunk keys by ABSOLUTE key index (never by batch, T or other sequences).
// Per chunk c the same device code computes the partial (m_c = max score, l_c = Σ exp(s − m_c),
// o_c = Σ exp(s − m_c)·v) on one warp's 16-row tile, and the partials are merged in ascending c by
// one merge function (attention.cu): the split-KV decode path writes the partials to `partial` and a
// combine kernel merges them; the prefill path (FlashAttention-2 style, 4 warps share K/V chunks)
// merges them in registers. Same operations in the same order, so a row's bits are the same in both
// paths and in any batch (deterministic mode, DESIGN.md §6).
#pragma once
#include <cstdint>
#include <vector>

#include "ops/attention/kv_layout.h"

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace moesq::ops {

constexpr int kAttnChunk = 64;  // keys per chunk (split-KV unit), fixed: the batch-invariance contract
constexpr int kAttnTileRows = 64;  // query rows per prefill CTA (4 warps × 16)
static_assert(kAttnChunk == kKvBlockTokens, "a KV block is one key chunk (kv_layout.h)");

struct AttentionArgs {
  const float* q = nullptr;          // [T, nh, hd] fp32 (normalized, rotated)
  const uint16_t* k_cache = nullptr; // [slots, max_len, nkv, hd] bf16, or [kv_blocks, 64, nkv, hd] when paged
  const uint16_t* v_cache = nullptr; // the same layout as k_cache
  // Paged KV (kv_layout.h): [slots, ⌈max_len/64⌉] physical block of each slot's blocks, or nullptr
  // (contiguous). kv_blocks: blocks in the cache (the twin checks the table against it).
  const int32_t* block_table = nullptr;
  int64_t kv_blocks = 0;
  const int32_t* tok_slot = nullptr; // [T] KV-cache slot of each row (any slots, any order: decode of live slots)
  const int32_t* tok_pos = nullptr;  // [T] attends to keys [0, pos]
  uint16_t* out = nullptr;           // [T, nh·hd] bf16 (o_proj input)
  uint16_t* out_lo = nullptr;        // [T, nh·hd] bf16 rounding residue of out, or nullptr
  int64_t T = 0;
  int nh = 0, nkv = 0, hd = 0;       // hd ∈ {32, 64, 128, 256}; nh / nkv ∈ {1, 2, 4, 8, 16}
  int64_t max_len = 0;
  float scale = 1.0f;                // 1/sqrt(hd)
  // Prefill path: tiles [n_tiles, 2] = (first token, token count) from attention_tiles (device copy).
  const int32_t* tiles = nullptr;
  int64_t n_tiles = 0;
  // Split-KV (decode) path: fp32 workspace of attention_partial_floats(T, nh, hd, max_len) values.
  float* partial = nullptr;
  // Sliding window (gpt-oss's sliding_attention layers, model/mixers/attention.cpp): > 0: a row at
  // position p sees keys j with p − j < window only; 0: all of 0..p. Chunks wholly before p − window + 1
  // are not read; the chunks that are keep their absolute 64-key cut, so the contract above holds.
  int64_t window = 0;
  // Attention sinks (gpt-oss): [nh] fp32 learned logits, one per query head, each joining its rows'
  // softmax denominator as exp(sink − m) without a value (HF's softmax over [scores | sink], sink column
  // dropped). Folded after the last chunk by one function in both paths. nullptr: none.
  const float* sinks = nullptr;
  // Gated attention (Qwen3-Next / Qwen3.5, model/mixers/gated_attention): each output is multiplied by
  // σ(gate) = 1 / (1 + exp(−gate)) before the bf16 split; the gate of (token t, head h, dim e) is
  // gate[t·gate_ld + h·gate_head_ld + e] fp32 — the q projection's gate half left in the q|k|v buffer
  // (QkRopeArgs::q_gate: qkv + hd, the row width, 2·hd). nullptr: no gate.
  const float* gate = nullptr;
  int64_t gate_ld = 0;
  int gate_head_ld = 0;
};

// Prefill (tiles given) or split-KV decode (partial given); exactly one of the two. Errors: shapes
// not built (naming the built ones), bad sizes, neither/both paths.
void attention(const AttentionArgs& args, cudaStream_t stream);
// Plain loops over host pointers, the same chunks and merge order in fp32 with std::exp.
void attention_ref(const AttentionArgs& args);
void attention_check(const AttentionArgs& args);
// The first key a row at `pos` sees: pos − window + 1 on a sliding-window layer (window > 0), else 0.
MOESQ_KV_HD inline int64_t attention_first_key(int64_t pos, int64_t window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}
// Floats of the split-KV workspace for T tokens: T · nh · ⌈max_len / kAttnChunk⌉ · (hd + 2).
size_t attention_partial_floats(int64_t T, int nh, int hd, int64_t max_len);
// Host: tiles of consecutive tokens of one slot with consecutive positions, at most
// kAttnTileRows / (nh / nkv) tokens each, as (first token, count) pairs. Errors: bad heads.
std::vector<int32_t> attention_tiles(const int32_t* tok_slot, const int32_t* tok_pos, int64_t T, int nh, int nkv);

}  // namespace moesq::ops
