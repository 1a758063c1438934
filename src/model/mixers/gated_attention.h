// Causal multi-head attention mixer with the variants of the family checkpoints: GQA, optional
// q/k/v/o biases, per-head q/k RMSNorm before RoPE, partial RoPE (default or YaRN), an output gate
// (Qwen3-Next / Qwen3.5 "gated attention": q_proj emits (query | gate) per head and the attention
// output is multiplied by σ(gate) before o_proj), attention sinks (gpt-oss: a learned logit per head
// joins each softmax and its probability is dropped) and a sliding window.
//
// One token sequence per call; positions continue a KvCache when one is given, so the same code
// runs prefill (T tokens) and decode (T = 1). attention_forward_ref is the plain-loop oracle.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config_hybrid.h"

namespace moesq::model {

struct AttentionShape {
  int64_t hidden = 0;  // H
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool output_gate = false;  // q_proj has 2·nh·hd rows: per head [query hd | gate hd]
  int64_t window = 0;        // > 0: query at position t sees keys j with t − j < window; 0 = full causal
  double eps = 1e-6;         // q/k RMSNorm epsilon
  io::HybridRopeSpec rope;         // rope.rotary_dim <= head_dim leading dims rotate
  int64_t q_rows() const { return num_heads * head_dim * (output_gate ? 2 : 1); }
};

struct AttentionWeights {
  std::vector<float> q_proj;                          // [q_rows, H]
  std::vector<float> k_proj, v_proj;                  // [nkv·hd, H]
  std::vector<float> o_proj;                          // [H, nh·hd]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // [q_rows], [nkv·hd] ×2, [H]; empty = no bias
  std::vector<float> q_norm, k_norm;                  // [hd] RMSNorm multipliers (1 + w folded in where the
                                                      // family's norms are zero-centred); empty = no q/k norm
  std::vector<float> sinks;                           // [nh] sink logits; empty = no sinks
};

// Keys (after norm and RoPE) and values of positions first .. len−1: [len − first, nkv·hd] each.
// len counts every position seen; a sliding-window layer may drop the rows no later query can see
// (drop_invisible_keys), so its decode cache stays under 2·window rows however long the sequence.
struct KvCache {
  int64_t len = 0;
  int64_t first = 0;  // absolute position of the first stored row
  std::vector<float> k, v;
};

// Drops the cached rows before the first key that position `len` (the next query) can see under
// s.window, once at least s.window of them have accumulated (amortised: one move per window steps).
// No-op without a window (s.window = 0).
void drop_invisible_keys(const AttentionShape& s, KvCache& cache);

// x [T, H]: the input-normed rows of positions p0 .. p0+T−1 (p0 = cache->len, or 0 without cache)
// → y [T, H] = o_proj(attention) (+ o_bias), no residual. With a cache, the new keys/values are
// appended to it. Errors: shape mismatches (named); a cache missing a row a query can see.
void attention_forward(const AttentionShape& s, const AttentionWeights& w, const float* x, int64_t T, float* y,
                       KvCache* cache = nullptr, int threads = 0);

// Plain-loop twin for a fresh sequence (positions 0..T−1); no BLAS.
void attention_forward_ref(const AttentionShape& s, const AttentionWeights& w, const float* x, int64_t T, float* y);

}  // namespace moesq::model
