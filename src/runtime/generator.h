// Token generation over the decode seam (decode_backend.h), for `moesq generate` and anything that
// serves several sequences at once: add() prefills a prompt into a free slot, step() samples every
// running sequence's next token from its last logits (runtime::Sampler, its own seeded generator
// per sequence), applies the stop conditions and sends the sequences that go on through ONE batched
// decode over their slots. A finished sequence frees its slot for the next add().
//
// The order per sequence is the one a plain loop has (prefill; then sample, stop?, decode), so a
// sequence's tokens do not depend on the others sharing the steps (on the CPU backend exactly; on
// the GPU engine in its deterministic mode, engine.h).
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/decode_backend.h"
#include "runtime/sampler.h"

namespace moesq::runtime {

struct StopOptions {
  int64_t max_new_tokens = 32;      // >= 1: the sequence ends after this many generated tokens
  std::vector<int32_t> stop_ids;    // a sampled id in this list ends the sequence (it is kept in the output)
};

class Generator {
 public:
  explicit Generator(DecodeBackend& backend);
  // Prefills `prompt` into a free slot; returns the sequence's id (0, 1, … in order of add). Its
  // first token is sampled by the next step(). Errors: empty prompt, max_new_tokens < 1, bad sampler
  // options (Sampler's), no free slot, the backend's (token ids, length).
  int add(const std::vector<int32_t>& prompt, const SamplerOptions& sampling, const StopOptions& stop);
  // One token for every running sequence; returns how many still run.
  int step();
  int running() const;
  bool finished(int seq) const;
  const std::vector<int32_t>& output(int seq) const;  // generated ids so far (prompt excluded)
  // add(), then step() until it stops: the generated ids of one prompt.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SamplerOptions& sampling,
                                const StopOptions& stop);

 private:
  struct Sequence {
    int slot = -1;
    Sampler sampler;
    StopOptions stop;
    std::vector<int32_t> out;
    std::vector<float> logits;  // [V] for the next token
    bool done = false;
  };
  const Sequence& seq_at(int seq) const;

  DecodeBackend& backend_;
  std::vector<Sequence> seqs_;
  std::vector<char> slot_busy_;  // [num_slots]
};

}  // namespace moesq::runtime
