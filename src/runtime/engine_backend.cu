// EngineDecodeBackend::prefill_batch (engine_backend.h): prompts packed, in the order given, into
// Engine::forward calls of at most max_tokens tokens (a longer prompt goes alone and meets forward's
// error, as prefill() would).
#include "runtime/engine_backend.h"

#include "core/error.h"

namespace moesq::runtime {

std::vector<float> EngineDecodeBackend::prefill_batch(const std::vector<int32_t>& slots,
                                                      const std::vector<std::vector<int32_t>>& prompts) {
  MOESQ_CHECK(slots.size() == prompts.size(), "decode backend: ", slots.size(), " slots for ", prompts.size(),
              " prompts");
  const int64_t cap = eng_.max_tokens();
  std::vector<float> out;
  out.reserve(slots.size() * static_cast<size_t>(vocab_size()));
  for (size_t i = 0; i < slots.size();) {
    std::vector<SeqChunk> group;
    int64_t tokens = 0;
    while (i < slots.size() && (group.empty() || tokens + static_cast<int64_t>(prompts[i].size()) <= cap)) {
      MOESQ_CHECK(!prompts[i].empty(), "decode backend: empty prompt for slot ", slots[i]);
      eng_.reset(slots[i]);
      group.push_back({slots[i], prompts[i]});
      tokens += static_cast<int64_t>(prompts[i].size());
      ++i;
    }
    const std::vector<float> z = eng_.forward(group, false);
    out.insert(out.end(), z.begin(), z.end());
  }
  return out;
}

}  // namespace moesq::runtime
