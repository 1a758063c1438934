// The GPU engine behind the decode seam (decode_backend.h): slot s is the engine's KV slot s; a
// prefill is Engine::forward of one chunk into the emptied slot, a decode step Engine::decode over
// the given slots (one CUDA graph per batch size, any slots). CUDA builds only (engine.h's engine).
#pragma once
#include "runtime/decode_backend.h"
#include "runtime/engine.h"

namespace moesq::runtime {

class EngineDecodeBackend final : public DecodeBackend {
 public:
  explicit EngineDecodeBackend(Engine& eng) : eng_(eng) {}
  int64_t vocab_size() const override { return eng_.spec().vocab_size; }
  int num_slots() const override { return eng_.max_seqs(); }
  std::vector<float> prefill(int slot, const std::vector<int32_t>& prompt) override {
    eng_.reset(slot);
    return eng_.forward({{slot, prompt}}, false);
  }
  std::vector<float> decode(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) override {
    return eng_.decode(slots, tokens);
  }

 private:
  Engine& eng_;
};

}  // namespace moesq::runtime
