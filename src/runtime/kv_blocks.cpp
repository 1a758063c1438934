// KvBlockPool (kv_blocks.h).
#include "runtime/kv_blocks.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>

namespace moesq::runtime {

KvBlockPool::KvBlockPool(int num_slots, int64_t max_len, int64_t num_blocks)
    : num_slots_(num_slots), max_len_(max_len), num_blocks_(num_blocks), per_slot_(kv_blocks_for(max_len)) {
  MOESQ_CHECK(num_slots >= 1, "KV cache: ", num_slots, " sequence slots; at least 1");
  MOESQ_CHECK(max_len >= 1, "KV cache: max_len ", max_len, " must be >= 1");
  MOESQ_CHECK(num_blocks >= per_slot_, "KV cache: ", num_blocks, " blocks of ", kKvBlockTokens, " tokens (",
              num_blocks * kKvBlockTokens, " tokens) cannot hold one sequence of max_len ", max_len, " (",
              per_slot_, " blocks)");
  MOESQ_CHECK(num_blocks <= std::numeric_limits<int32_t>::max(), "KV cache: ", num_blocks, " blocks; at most 2^31 - 1");
  table_.assign(static_cast<size_t>(num_slots) * per_slot_, -1);
  held_.assign(static_cast<size_t>(num_slots), 0);
  for (int64_t b = 0; b < num_blocks; ++b) free_.insert(free_.end(), static_cast<int32_t>(b));
}

void KvBlockPool::check_slot(int slot) const {
  MOESQ_CHECK(slot >= 0 && slot < num_slots_, "KV cache: slot ", slot, " outside [0, ", num_slots_, ")");
}

int64_t KvBlockPool::held(int slot) const {
  check_slot(slot);
  return held_[slot];
}

int64_t KvBlockPool::need(int slot, int64_t len) const {
  check_slot(slot);
  MOESQ_CHECK(len >= 0 && len <= max_len_, "KV cache: slot ", slot, " cannot hold ", len, " tokens (max_len ", max_len_,
              ")");
  return std::max<int64_t>(0, kv_blocks_for(len) - held_[slot]);
}

void KvBlockPool::grow(const std::vector<std::pair<int, int64_t>>& want) {
  std::map<int, int64_t> len;  // slot → largest len asked
  for (const auto& [slot, n] : want) {
    need(slot, n);  // checks
    len[slot] = std::max(len[slot], n);
  }
  int64_t total = 0;
  for (const auto& [slot, n] : len) total += need(slot, n);
  if (total > free_blocks())
    throw KvCacheFull("KV cache full: the step needs " + std::to_string(total) + " more blocks of " +
                      std::to_string(kKvBlockTokens) + " tokens, " + std::to_string(free_blocks()) + " of " +
                      std::to_string(num_blocks_) + " are free");
  if (total == 0) return;
  for (const auto& [slot, n] : len)
    for (int64_t b = held_[slot]; b < kv_blocks_for(n); ++b) {
      table_[static_cast<size_t>(slot) * per_slot_ + b] = *free_.begin();
      free_.erase(free_.begin());
      held_[slot] = b + 1;
    }
  ++version_;
}

void KvBlockPool::release(int slot) {
  check_slot(slot);
  if (held_[slot] == 0) return;
  for (int64_t b = 0; b < held_[slot]; ++b) {
    int32_t& e = table_[static_cast<size_t>(slot) * per_slot_ + b];
    free_.insert(e);
    e = -1;
  }
  held_[slot] = 0;
  ++version_;
}

void KvBlockPool::release_all() {
  for (int s = 0; s < num_slots_; ++s) release(s);
}

}  // namespace moesq::runtime
