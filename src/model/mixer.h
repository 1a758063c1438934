// The token mixer of one decoder layer: what turns the normalised hidden states of one causal sequence
// into the layer's attention-side output (GQA attention, multi-head latent attention, Gated DeltaNet…).
// A family whose mixer is not the built-in GQA attention (model/mixers/attention.h) implements this
// interface in one file under src/model/mixers/ and registers its factory in model/families.cpp.
// The decoder owns the residual and the input RMSNorm: a mixer sees x = input_layernorm(h) only.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/forward_options.h"

namespace moesq::model {

class Mixer {
 public:
  virtual ~Mixer() = default;
  // Short name for messages, e.g. "mla", "gated_deltanet".
  virtual std::string name() const = 0;
  // x [T, H] = input_layernorm(h) of ONE causal sequence of T tokens (positions 0..T-1) → the mixer
  // output [T, H] (o_proj applied; the caller adds it to h). fo.threads bounds the threads used.
  virtual std::vector<float> forward(const float* x, int64_t T, const ForwardOptions& fo) const = 0;
};

// Reads layer `layer`'s mixer weights from the checkpoint (shapes checked against the spec; errors
// name the tensor and the directory).
using MixerFactory = std::unique_ptr<Mixer> (*)(const io::Checkpoint& ckpt, const io::ModelSpec& spec,
                                                int64_t layer);

}  // namespace moesq::model
