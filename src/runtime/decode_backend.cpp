// CpuDecodeBackend (decode_backend.h): the seam over model::KvDecoder, one decoder per slot.
#include "runtime/decode_backend.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "ops/argmax/argmax.h"

namespace moesq::runtime {

std::vector<float> DecodeBackend::prefill_batch(const std::vector<int32_t>& slots,
                                                const std::vector<std::vector<int32_t>>& prompts) {
  MOESQ_CHECK(slots.size() == prompts.size(), "decode backend: ", slots.size(), " slots for ", prompts.size(),
              " prompts");
  std::vector<float> out;
  for (size_t i = 0; i < slots.size(); ++i) {
    const std::vector<float> z = prefill(slots[i], prompts[i]);
    out.insert(out.end(), z.begin(), z.end());
  }
  return out;
}

void DecodeBackend::check_chunks(const std::vector<PrefillChunk>& chunks) const {
  std::vector<char> seen(static_cast<size_t>(std::max(num_slots(), 0)), 0);
  for (const PrefillChunk& c : chunks) {
    MOESQ_CHECK(c.slot >= 0 && c.slot < num_slots(), "decode backend: slot ", c.slot, " outside [0, ", num_slots(), ")");
    MOESQ_CHECK(!c.tokens.empty(), "decode backend: empty prefill chunk for slot ", c.slot);
    MOESQ_CHECK(!seen[c.slot], "decode backend: slot ", c.slot, " given twice in one prefill_chunks call");
    seen[c.slot] = 1;
  }
}

std::vector<float> DecodeBackend::prefill_chunks(const std::vector<PrefillChunk>& chunks) {
  check_chunks(chunks);
  std::vector<float> out;
  for (const PrefillChunk& c : chunks) {
    std::vector<float> z;
    if (c.start) {
      z = prefill(c.slot, c.tokens);
    } else {
      for (int32_t t : c.tokens) z = decode({c.slot}, {t});
    }
    out.insert(out.end(), z.begin(), z.end());
  }
  return out;
}

std::vector<int32_t> DecodeBackend::decode_greedy(const std::vector<int32_t>& slots,
                                                  const std::vector<int32_t>& tokens) {
  return greedy_rows(decode(slots, tokens), vocab_size());
}

std::vector<int32_t> greedy_rows(const std::vector<float>& logits, int64_t V) {
  MOESQ_CHECK(V >= 1 && static_cast<int64_t>(logits.size()) % V == 0, "greedy_rows: ", logits.size(),
              " logits are not rows of ", V);
  std::vector<int32_t> ids(logits.size() / static_cast<size_t>(V));
  ops::argmax_ref({logits.data(), ids.data(), static_cast<int64_t>(ids.size()), V});  // the GPU argmax's twin
  return ids;
}

CpuDecodeBackend::CpuDecodeBackend(const model::DecoderModel& m, int64_t max_len, int num_slots,
                                   const model::ForwardOptions& fo, int64_t kv_tokens)
    : m_(m), max_len_(max_len), fo_(fo) {
  MOESQ_CHECK(num_slots >= 1, "decode backend: num_slots ", num_slots, " must be >= 1");
  MOESQ_CHECK(kv_tokens >= 0, "decode backend: kv_tokens ", kv_tokens, " must be >= 0");
  slots_.resize(static_cast<size_t>(num_slots));  // decoders made on first use, dropped by release()
  if (kv_tokens > 0) kv_.emplace(num_slots, max_len, kv_blocks_for(kv_tokens));
}

void CpuDecodeBackend::release(int slot) {
  MOESQ_CHECK(slot >= 0 && slot < num_slots(), "decode backend: slot ", slot, " outside [0, ", num_slots(), ")");
  if (kv_) kv_->release(slot);
  slots_[static_cast<size_t>(slot)].reset();  // its caches freed
}

model::KvDecoder& CpuDecodeBackend::at(int slot) {
  MOESQ_CHECK(slot >= 0 && slot < num_slots(), "decode backend: slot ", slot, " outside [0, ", num_slots(), ")");
  std::optional<model::KvDecoder>& d = slots_[static_cast<size_t>(slot)];
  if (!d) d.emplace(m_, max_len_, fo_);
  return *d;
}

std::vector<float> CpuDecodeBackend::prefill(int slot, const std::vector<int32_t>& prompt) {
  MOESQ_CHECK(!prompt.empty(), "decode backend: empty prompt for slot ", slot);
  model::KvDecoder* dec = &at(slot);
  if (kv_) {
    MOESQ_CHECK(static_cast<int64_t>(prompt.size()) <= max_len_, "decoder: sequence longer than its max length ",
                max_len_);
    // What the slot held is dropped, so its blocks count as free; refused before anything changes.
    const int64_t want = kv_blocks_for(static_cast<int64_t>(prompt.size())), have = kv_->free_blocks() + kv_->held(slot);
    if (want > have)
      throw KvCacheFull("KV cache full: a prompt of " + std::to_string(prompt.size()) + " tokens needs " +
                        std::to_string(want) + " blocks of " + std::to_string(kKvBlockTokens) + " tokens, " +
                        std::to_string(have) + " of " + std::to_string(kv_->num_blocks()) + " are free");
    kv_->release(slot);
    kv_->grow({{slot, static_cast<int64_t>(prompt.size())}});
  }
  if (dec->position() > 0) dec = &slots_[static_cast<size_t>(slot)].emplace(m_, max_len_, fo_);
  std::vector<float> z;
  for (int32_t t : prompt) z = dec->step(t);
  return z;
}

std::vector<float> CpuDecodeBackend::decode(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) {
  MOESQ_CHECK(slots.size() == tokens.size(), "decode backend: ", slots.size(), " slots for ", tokens.size(), " tokens");
  std::vector<char> seen(slots_.size(), 0);
  for (int32_t s : slots) {
    at(s);
    MOESQ_CHECK(!seen[s], "decode backend: slot ", s, " given twice in one decode step");
    seen[s] = 1;
  }
  if (kv_) {
    std::vector<std::pair<int, int64_t>> want;
    for (int32_t s : slots) want.emplace_back(s, at(s).position() + 1);
    kv_->grow(want);  // KvCacheFull (nothing changed) before any slot steps
  }
  const int64_t V = vocab_size();
  std::vector<float> out;
  out.reserve(slots.size() * static_cast<size_t>(V));
  for (size_t b = 0; b < slots.size(); ++b) {
    const std::vector<float> z = at(slots[b]).step(tokens[b]);
    out.insert(out.end(), z.begin(), z.end());
  }
  return out;
}

}  // namespace moesq::runtime
