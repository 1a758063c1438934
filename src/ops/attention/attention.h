// Launcher: causal GQA attention of query rows over the bf16 KV cache, prefill and decode alike:
// token t (sequence slot s_t, position p_t) attends to keys 0..p_t of slot s_t, query head h reads
// kv head h / (nh / nkv), scores · scale, fp32 softmax. Prefill appends all keys first (qk_rope),
// so a causal prefill and a decode step are the same call with different (slot, position) lists.
// CPU twin: attention_ref (same online-softmax order; expf differs by ulps, so a tolerance).
//
// Non-obvious decision: one CTA per (token, head); its 16 warps take contiguous key chunks whose
// bounds depend on the token's position alone, and merge in warp order: a row's arithmetic never
// depends on the batch (deterministic mode), and a decode step equals the prefill at that position.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace moesq::ops {

struct AttentionArgs {
  const float* q = nullptr;          // [T, nh, hd] fp32 (normalized, rotated)
  const uint16_t* k_cache = nullptr; // [slots, max_len, nkv, hd] bf16
  const uint16_t* v_cache = nullptr; // [slots, max_len, nkv, hd] bf16
  const int32_t* tok_slot = nullptr; // [T]
  const int32_t* tok_pos = nullptr;  // [T] attends to keys [0, pos]
  uint16_t* out = nullptr;           // [T, nh·hd] bf16 (o_proj input)
  uint16_t* out_lo = nullptr;        // [T, nh·hd] bf16 rounding residue of out, or nullptr
  int64_t T = 0;
  int nh = 0, nkv = 0, hd = 0;       // hd % 32 == 0, hd ≤ 256
  int64_t max_len = 0;
  float scale = 1.0f;                // 1/sqrt(hd)
};

void attention(const AttentionArgs& args, cudaStream_t stream);
void attention_ref(const AttentionArgs& args);  // host pointers
void attention_check(const AttentionArgs& args);

}  // namespace moesq::ops
