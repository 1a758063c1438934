// The GPU engine behind the decode seam (decode_backend.h): slot s is the engine's KV slot s; a
// prefill is Engine::forward of one chunk into the emptied slot (prefill_batch and prefill_chunks:
// several chunks per forward, up to the engine's max_tokens; a continuation chunk is appended at the
// slot's length), a decode step Engine::decode over the given slots (one CUDA
// graph per batch size, any slots; decode_greedy: the argmax on the GPU); the engine's KV is paged
// (release returns a slot's blocks). CUDA builds only.
// Batched prefill returns each prompt's bits alone only where the engine is batch-invariant: in its
// deterministic mode (engine.h); with --deterministic off the q|k|v / o_proj / router / lm_head GEMMs
// may pick another cuBLAS algorithm for another T.
#pragma once
#include "runtime/decode_backend.h"
#include "runtime/engine.h"

namespace moesq::runtime {

class EngineDecodeBackend final : public DecodeBackend {
 public:
  explicit EngineDecodeBackend(Engine& eng) : eng_(eng) {}
  int64_t vocab_size() const override { return eng_.spec().vocab_size; }
  int num_slots() const override { return eng_.max_seqs(); }
  int64_t max_prefill_tokens() const override { return eng_.max_tokens(); }
  std::vector<float> prefill(int slot, const std::vector<int32_t>& prompt) override {
    eng_.reset(slot);
    return eng_.forward({{slot, prompt}}, false);
  }
  std::vector<float> prefill_batch(const std::vector<int32_t>& slots,
                                   const std::vector<std::vector<int32_t>>& prompts) override;
  std::vector<float> prefill_chunks(const std::vector<PrefillChunk>& chunks) override;
  std::vector<float> decode(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) override {
    return eng_.decode(slots, tokens);
  }
  std::vector<int32_t> decode_greedy(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) override {
    return eng_.decode_greedy(slots, tokens);
  }
  int64_t kv_block_tokens() const override { return kKvBlockTokens; }
  int64_t kv_blocks() const override { return eng_.kv_blocks(); }
  int64_t kv_free_blocks() const override { return eng_.kv_free_blocks(); }
  void release(int slot) override { eng_.reset(slot); }

 private:
  Engine& eng_;
};

}  // namespace moesq::runtime
