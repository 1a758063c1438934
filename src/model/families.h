// The model side of the family registry: model_type → how its layers are built. Config keys are
// parsed in io/config_families.cpp and tensor names come from io/tensor_names.cpp; this table says
// only what the generic decoder (model/decoder.h) cannot know from that data: the layer's token
// mixer. A layer of every family is (mixer, then a routed-expert block with its router and optional
// gated shared expert, or a dense SwiGLU MLP).
#pragma once
#include <string>

#include "model/mixer.h"

namespace moesq::model {

struct ModelFamily {
  const char* model_type;
  // Builds each layer's mixer; nullptr = the built-in GQA attention (model/mixers/attention.h) over
  // LayerWeights' q/k/v/o fields, with the spec's qk_norm and biases.
  MixerFactory make_mixer = nullptr;
};

// nullptr when moesq has no forward for model_type.
const ModelFamily* find_model_family(const std::string& model_type);

}  // namespace moesq::model
