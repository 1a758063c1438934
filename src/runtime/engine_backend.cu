// EngineDecodeBackend::prefill_chunks / prefill_batch (engine_backend.h): chunks packed, in the order
// given, into Engine::forward calls of at most max_tokens tokens (a longer chunk goes alone and meets
// forward's error, as prefill() would); a start chunk empties its slot first.
#include "runtime/engine_backend.h"

#include "core/error.h"

namespace moesq::runtime {

std::vector<float> EngineDecodeBackend::prefill_batch(const std::vector<int32_t>& slots,
                                                      const std::vector<std::vector<int32_t>>& prompts) {
  MOESQ_CHECK(slots.size() == prompts.size(), "decode backend: ", slots.size(), " slots for ", prompts.size(),
              " prompts");
  std::vector<PrefillChunk> chunks(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) chunks[i] = {slots[i], prompts[i], true};
  return prefill_chunks(chunks);
}

std::vector<float> EngineDecodeBackend::prefill_chunks(const std::vector<PrefillChunk>& chunks) {
  const int64_t cap = eng_.max_tokens();
  std::vector<float> out;
  out.reserve(chunks.size() * static_cast<size_t>(vocab_size()));
  check_chunks(chunks);
  for (size_t i = 0; i < chunks.size();) {
    std::vector<SeqChunk> group;
    int64_t tokens = 0;
    while (i < chunks.size() && (group.empty() || tokens + static_cast<int64_t>(chunks[i].tokens.size()) <= cap)) {
      if (chunks[i].start) eng_.reset(chunks[i].slot);
      group.push_back({chunks[i].slot, chunks[i].tokens});
      tokens += static_cast<int64_t>(chunks[i].tokens.size());
      ++i;
    }
    const std::vector<float> z = eng_.forward(group, false);
    out.insert(out.end(), z.begin(), z.end());
  }
  return out;
}

}  // namespace moesq::runtime
