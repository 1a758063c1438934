#include "model/families.h"

#include "model/mixers/mla_mixer.h"
#include "model/mixers/hybrid_mixer.h"
#include "model/mixers/sink_attention.h"

namespace moesq::model {

namespace {

// One row per family. qwen3_moe, qwen2_moe, mixtral and olmoe all use the built-in GQA attention; they
// differ only in data (io::ModelSpec: qk_norm, biases, router, shared expert) and tensor names.
constexpr ModelFamily kFamilies[] = {
    {"qwen3_moe", nullptr},
    {"qwen2_moe", nullptr},
    {"mixtral", nullptr},
    {"olmoe", nullptr},
    {"deepseek_v3", make_mla_mixer},  // multi-head latent attention (model/mixers/mla_mixer.h)
    {"kimi_k2", make_mla_mixer},
    // Gated DeltaNet / gated attention per layer_types (model/mixers/hybrid_mixer.h).
    {"qwen3_next", make_hybrid_mixer},
    {"qwen3_5_moe_text", make_hybrid_mixer},
    // Sink attention with a sliding window per layer_types and YaRN (model/mixers/sink_attention.h); its
    // biased top-k-softmax router and clamped, biased experts are data (io::ModelSpec).
    {"gpt_oss", make_sink_attention_mixer},
};

}  // namespace

const ModelFamily* find_model_family(const std::string& model_type) {
  for (const ModelFamily& f : kFamilies)
    if (model_type == f.model_type) return &f;
  return nullptr;
}

}  // namespace moesq::model
