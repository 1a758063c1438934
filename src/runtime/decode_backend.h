// The decode seam the Generator (runtime/generator.h) drives: sequences live in numbered KV slots; a
// prompt is prefilled into a given slot, and one decode step takes one token for each of ANY set of
// live slots. Implemented by the CPU model::KvDecoder (CpuDecodeBackend, below: one decoder per slot)
// and the GPU engine (runtime/engine_backend.h, CUDA builds: slots of runtime::Engine's KV cache).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "model/decoder.h"
#include "model/kv_decoder.h"
#include "runtime/kv_blocks.h"

namespace moesq::runtime {

// One piece of a prompt for DecodeBackend::prefill_chunks: `tokens` (non-empty) appended to `slot`;
// start: the prompt's first piece (what the slot held is dropped first).
struct PrefillChunk {
  int slot = 0;
  std::vector<int32_t> tokens;
  bool start = true;
};

class DecodeBackend {
 public:
  virtual ~DecodeBackend() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int num_slots() const = 0;
  // Starts a new sequence in `slot` (what the slot held is dropped) with the non-empty `prompt`;
  // returns fp32 logits [V] for the token after its last one. Errors: slot out of range, too long.
  virtual std::vector<float> prefill(int slot, const std::vector<int32_t>& prompt) = 0;
  // Appends tokens[b] to slots[b] (distinct live slots, any order); returns logits [B, V], row b for
  // slots[b]. Errors: a slot out of range, repeated or full.
  virtual std::vector<float> decode(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) = 0;

  // Starts prompts[i] in slots[i] (distinct slots, non-empty prompts) and returns logits [n, V], row i
  // for slots[i], each row bitwise what prefill(slots[i], prompts[i]) alone returns (the scheduler's
  // determinism rests on it). The GPU engine packs the prompts into forwards of at most
  // max_prefill_tokens() tokens; this default runs prefill() once per prompt. Errors: prefill's; on an
  // error no slot is left half-started in a way a later prefill of it would notice.
  virtual std::vector<float> prefill_batch(const std::vector<int32_t>& slots,
                                           const std::vector<std::vector<int32_t>>& prompts);
  // Chunked prefill: appends chunks[i].tokens to chunks[i].slot (distinct slots; a start chunk empties
  // its slot first) and returns logits [n, V], row i for chunk i's last token. A prompt prefilled in
  // pieces gives the bits prefill() of the whole prompt gives: the CPU decoder steps token by token, and
  // the GPU engine's deterministic mode depends neither on the batch nor on how a sequence's tokens are
  // split into forwards (engine.h). The GPU engine packs the chunks into forwards of at most
  // max_prefill_tokens() tokens; this default runs prefill() for a start chunk and decode() token by
  // token for a continuation. Errors: prefill's and decode's (an empty chunk, repeated slots); after an
  // error a slot it named holds an undefined prefix until its next start chunk.
  virtual std::vector<float> prefill_chunks(const std::vector<PrefillChunk>& chunks);
  // decode(), returning only each row's greedy next token: argmax of the row's logits, lowest id on
  // ties — the token runtime::Sampler picks at temperature 0 — so no [B, V] logits cross to the host
  // (the GPU engine takes the argmax on the device). Default: decode() then the argmax here.
  virtual std::vector<int32_t> decode_greedy(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens);
  // Tokens one prefill forward may carry (0: no limit): prompts longer than this are still prefilled,
  // alone; prefill_batch groups shorter ones up to it.
  virtual int64_t max_prefill_tokens() const { return 0; }

  // Paged KV (runtime/kv_blocks.h): the slots share kv_blocks() blocks of kv_block_tokens() tokens,
  // taken as a sequence grows; a prefill or decode the free blocks do not cover throws KvCacheFull
  // and changes nothing. 0 / 0 / 0: not paged (every slot holds its max_len whatever the others
  // hold). The server's scheduler admits and preempts by these counts (serve/scheduler.h).
  virtual int64_t kv_block_tokens() const { return 0; }
  virtual int64_t kv_blocks() const { return 0; }
  virtual int64_t kv_free_blocks() const { return 0; }
  // The sequence in `slot` is over: its KV blocks go back to the pool; the slot takes a new prompt
  // by prefill. Default: nothing (an unpaged slot is simply overwritten). Errors: slot out of range.
  virtual void release(int slot) { (void)slot; }

 protected:
  // prefill_chunks' argument checks (shared by the implementations): slots in range, distinct, chunks
  // non-empty. Errors name the slot.
  void check_chunks(const std::vector<PrefillChunk>& chunks) const;
};

// The argmax of each [V] row of `logits` ([rows, V]), lowest id on ties: ops::argmax_ref, the host twin
// of the engine's GPU argmax (runtime::Sampler's greedy choice on finite logits).
std::vector<int32_t> greedy_rows(const std::vector<float>& logits, int64_t V);

// The CPU backend: one model::KvDecoder of max_len tokens per slot that holds a sequence (made at its
// first prefill, freed by release(), so a std::bad_alloc comes from a prefill, sized by
// KvDecoder::cache_bytes). Decode steps run the slots one after another; a slot's tokens are exactly
// those of a KvDecoder alone. kv_tokens > 0 adds the GPU engine's paged accounting: the slots may
// hold ⌈kv_tokens / 64⌉ blocks of 64 tokens in all (a runtime::KvBlockPool, at least one sequence
// of max_len; KvCacheFull beyond), so the scheduler's admission and preemption by KV blocks run, and
// are tested, on the CPU too (each decoder still allocates max_len: the CPU serves small models).
class CpuDecodeBackend final : public DecodeBackend {
 public:
  CpuDecodeBackend(const model::DecoderModel& m, int64_t max_len, int num_slots, const model::ForwardOptions& fo,
                   int64_t kv_tokens = 0);
  int64_t vocab_size() const override { return m_.spec().vocab_size; }
  int num_slots() const override { return static_cast<int>(slots_.size()); }
  std::vector<float> prefill(int slot, const std::vector<int32_t>& prompt) override;
  std::vector<float> decode(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) override;
  int64_t kv_block_tokens() const override { return kv_ ? kKvBlockTokens : 0; }
  int64_t kv_blocks() const override { return kv_ ? kv_->num_blocks() : 0; }
  int64_t kv_free_blocks() const override { return kv_ ? kv_->free_blocks() : 0; }
  void release(int slot) override;

 private:
  model::KvDecoder& at(int slot);

  const model::DecoderModel& m_;
  int64_t max_len_;
  model::ForwardOptions fo_;
  std::vector<std::optional<model::KvDecoder>> slots_;  // [num_slots]
  std::optional<KvBlockPool> kv_;                       // paged (kv_tokens > 0)
};

}  // namespace moesq::runtime
