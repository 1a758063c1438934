// Where the K/V row of a token (sequence slot, position) lives in the engine's bf16 KV cache: the
// one address rule of ops::qk_rope (writes), ops::attention (reads) and their CPU twins.
//  - contiguous (block_table == nullptr): the cache is [slots, max_len, nkv, hd]; row slot·max_len + pos;
//  - paged (block_table given): the cache is [kv_blocks, kKvBlockTokens, nkv, hd], blocks of 64 tokens
//    handed to sequences as they grow (runtime/kv_blocks.h); block_table [slots, kv_blocks_per_slot(max_len)]
//    int32 holds the physical block of each slot's logical block b (positions [64b, 64b + 64)), so the
//    row is block_table[slot · bps + pos / 64] · 64 + pos % 64.
// Non-obvious decision: a block is exactly the attention's key chunk (kAttnChunk), so every chunk a
// kernel loads is one block, contiguous in both layouts; a row's arithmetic is the same whatever blocks
// its sequence got (paging changes addresses, never bits).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MOESQ_KV_HD __host__ __device__
#else
#define MOESQ_KV_HD
#endif

namespace moesq::ops {

constexpr int kKvBlockTokens = 64;  // tokens per KV block (= kAttnChunk, attention.h)

// Logical blocks of one slot: ⌈max_len / 64⌉ (the block table's row length).
MOESQ_KV_HD inline int64_t kv_blocks_per_slot(int64_t max_len) {
  return (max_len + kKvBlockTokens - 1) / kKvBlockTokens;
}

// The physical block holding position `pos` of `slot` in the paged layout (block_table given).
MOESQ_KV_HD inline int64_t kv_block_of(const int32_t* block_table, int64_t max_len, int64_t slot, int64_t pos) {
  return block_table[slot * kv_blocks_per_slot(max_len) + pos / kKvBlockTokens];
}

// The cache row (token index into [rows, nkv, hd]) of position `pos` of `slot`.
MOESQ_KV_HD inline int64_t kv_row(const int32_t* block_table, int64_t max_len, int64_t slot, int64_t pos) {
  if (!block_table) return slot * max_len + pos;
  return static_cast<int64_t>(block_table[slot * kv_blocks_per_slot(max_len) + pos / kKvBlockTokens]) * kKvBlockTokens +
         pos % kKvBlockTokens;
}

}  // namespace moesq::ops
