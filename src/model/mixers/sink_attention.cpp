// gpt-oss's sink / sliding-window attention (see the header). The non-obvious decision: the window
// and the sinks are data of one attention routine (mixers/gated_attention.cpp), whose softmax folds the
// sink logit into the max and the denominator as transformers' eager gpt-oss attention does.
#include "model/mixers/sink_attention.h"

#include "io/config_hybrid.h"
#include "io/tensor_names_families.h"
#include "model/mixers/family_load.h"
#include "model/mixers/hybrid_mixer.h"

namespace moesq::model {

std::unique_ptr<Mixer> make_sink_attention_mixer(const io::Checkpoint& ckpt, const io::ModelSpec& /*spec*/,
                                                 int64_t layer) {
  const io::FamilySpec f = io::parse_family_config(ckpt.config(), ckpt.dir() + "/config.json");
  AttentionWeights w;
  family_load::load_attention_projections(ckpt, f, layer, w);
  w.sinks = family_load::layer_f32(ckpt, layer, io::family_names::kSinks, {f.base.num_heads});
  const bool sliding = f.layer_mixer.at(layer) == io::MixerKind::SlidingAttention;
  return make_attention_mixer(family_attention_shape(f, layer), std::move(w),
                              sliding ? "sliding_sink_attention" : "sink_attention");
}

}  // namespace moesq::model
