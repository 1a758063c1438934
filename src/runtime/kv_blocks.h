// Paged KV accounting (issue 26): the KV cache is cut into blocks of ops::kKvBlockTokens (64) tokens,
// handed to sequence slots as they grow and returned when a slot is emptied, so sequences of any
// length share one pool instead of each reserving max_len tokens. The GPU engine keeps its block table
// here (uploaded to the device, read by ops::qk_rope and ops::attention through
// ops/attention/kv_layout.h); the CPU backend keeps the same accounting, so the server's scheduler
// sees one capacity rule on both devices.
// Non-obvious decisions: the lowest free block is taken first, so which blocks a sequence gets
// depends only on the order of calls (paging changes addresses, never bits: kv_layout.h); growth is
// all or nothing per call, so a refused step leaves every slot as it was. Not thread-safe.
#pragma once
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/attention/kv_layout.h"

namespace moesq::runtime {

constexpr int64_t kKvBlockTokens = ops::kKvBlockTokens;

// Blocks that hold `tokens` tokens: ⌈tokens / 64⌉.
inline int64_t kv_blocks_for(int64_t tokens) { return (tokens + kKvBlockTokens - 1) / kKvBlockTokens; }

// The pool has too few free blocks for a step: the scheduler preempts or waits (serve/scheduler.h).
class KvCacheFull : public Error {
 public:
  using Error::Error;
};

class KvBlockPool {
 public:
  // num_slots sequence slots of at most max_len tokens over num_blocks physical blocks. Errors:
  // num_slots < 1, max_len < 1, num_blocks below one sequence of max_len (kv_blocks_for(max_len)) or
  // above 2^31 − 1.
  KvBlockPool(int num_slots, int64_t max_len, int64_t num_blocks);

  int num_slots() const { return num_slots_; }
  int64_t max_len() const { return max_len_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t blocks_per_slot() const { return per_slot_; }
  int64_t held(int slot) const;  // blocks `slot` holds
  // Blocks that growing `slot` to hold `len` tokens would take (0 when it holds them already).
  int64_t need(int slot, int64_t len) const;
  // Grows each (slot, len) of `want` to hold len tokens (a slot named twice: the larger len), all or
  // nothing. Errors: a slot outside [0, num_slots) or len outside [0, max_len] (moesq::Error);
  // KvCacheFull when the free blocks do not cover them — then nothing changed.
  void grow(const std::vector<std::pair<int, int64_t>>& want);
  void release(int slot);  // every block of `slot` back to the pool
  void release_all();
  // [num_slots, blocks_per_slot] int32: physical block of each slot's logical block, −1 where none
  // (the ops' block_table).
  const std::vector<int32_t>& table() const { return table_; }
  // Bumped on every change of table(): a device copy is stale when its version differs.
  uint64_t version() const { return version_; }

 private:
  void check_slot(int slot) const;

  int num_slots_;
  int64_t max_len_, num_blocks_, per_slot_;
  std::vector<int32_t> table_;
  std::vector<int64_t> held_;  // [num_slots]
  std::set<int32_t> free_;     // lowest first
  uint64_t version_ = 0;
};

}  // namespace moesq::runtime
