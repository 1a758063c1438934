// The token mixer of one decoder layer: what turns the normalised hidden states of one causal sequence
// into the layer's attention-side output (GQA attention, multi-head latent attention, Gated DeltaNet…).
// A family whose mixer is not the built-in GQA attention (model/mixers/attention.h) implements this
// interface in one file under src/model/mixers/ and registers its factory in model/families.cpp.
// The decoder owns the residual and the input RMSNorm: a mixer sees x = input_layernorm(h) only.
// Besides the full-sequence forward a mixer may offer a plain-loop twin (forward_ref) and an
// incremental decode (new_decode_state + decode: KV cache, latent cache or recurrent state), which
// model::KvDecoder runs one token per step; a mixer without them says so by name, never silently.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "model/forward_options.h"

namespace moesq::model {

// What a mixer carries from one decode step of one sequence to the next (the mixer's own subclass:
// a KV cache, MLA's latent cache, Gated DeltaNet's conv + recurrent state). `pos` = tokens consumed.
class MixerState {
 public:
  virtual ~MixerState() = default;
  int64_t pos = 0;
};

class Mixer {
 public:
  virtual ~Mixer() = default;
  // Short name for messages, e.g. "mla", "gated_deltanet".
  virtual std::string name() const = 0;
  // x [T, H] = input_layernorm(h) of ONE causal sequence of T tokens (positions 0..T-1) → the mixer
  // output [T, H] (o_proj applied; the caller adds it to h). fo.threads bounds the threads used.
  virtual std::vector<float> forward(const float* x, int64_t T, const ForwardOptions& fo) const = 0;

  // Plain-loop twin of forward (no BLAS), the oracle of the fast path; has_forward_ref() says whether
  // the mixer has one (the default forward_ref is an Error naming the mixer).
  virtual bool has_forward_ref() const { return false; }
  virtual std::vector<float> forward_ref(const float* /*x*/, int64_t /*T*/, const ForwardOptions& /*fo*/) const {
    MOESQ_FAIL("the ", name(), " mixer has no plain-loop twin");
  }

  // A fresh decode state for one sequence of at most max_len tokens (fo: the options the steps will
  // use, e.g. rope_bf16_inv_freq for RoPE tables made once here); nullptr = no decode path.
  virtual std::unique_ptr<MixerState> new_decode_state(int64_t /*max_len*/, const ForwardOptions& /*fo*/) const {
    return nullptr;
  }
  // Bytes the state new_decode_state(max_len, ·) holds at its largest over max_len one-token decode
  // steps (every buffer of the state: caches, recurrent state, RoPE tables), for checking memory
  // before allocating; saturated at INT64_MAX (state_bytes). Error: no decode path.
  virtual int64_t decode_state_bytes(int64_t /*max_len*/) const {
    MOESQ_FAIL("the ", name(), " mixer has no incremental decode");
  }
  // x [T, H] = input_layernorm(h) of the sequence's next T positions (state.pos .. state.pos + T − 1)
  // → [T, H], the rows forward() of the whole prefix gives at those positions; advances `state`
  // (made by this mixer's new_decode_state). Errors: no decode path, a foreign state, max_len passed.
  virtual std::vector<float> decode(const float* /*x*/, int64_t /*T*/, MixerState& /*state*/,
                                    const ForwardOptions& /*fo*/) const {
    MOESQ_FAIL("the ", name(), " mixer has no incremental decode");
  }
};

// n floats as bytes, computed wide and saturated at INT64_MAX: a length no machine holds (generate
// --max-new-tokens 10^18) must still compare as too large, never wrap.
inline int64_t state_bytes(__int128 floats) {
  const __int128 b = floats * static_cast<__int128>(sizeof(float));
  return b > static_cast<__int128>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(b);
}

// The mixer's own state type behind a MixerState&, or an Error naming the mixer.
template <class S>
S& mixer_state_as(MixerState& st, const std::string& mixer) {
  S* s = dynamic_cast<S*>(&st);
  MOESQ_CHECK(s, "the ", mixer, " mixer was given a decode state made by another mixer");
  return *s;
}

// Reads layer `layer`'s mixer weights from the checkpoint (shapes checked against the spec; errors
// name the tensor and the directory).
using MixerFactory = std::unique_ptr<Mixer> (*)(const io::Checkpoint& ckpt, const io::ModelSpec& spec,
                                                int64_t layer);

}  // namespace moesq::model
