// Mixer adapters over the family mixers (see the header). The weights are read by the same
// loader code as model/families/ (families/load_common.h), so the standalone FamilyModel and the
// generic DecoderModel run identical mixers.
#include "model/mixers/hybrid_mixer.h"

#include "io/config_hybrid.h"
#include "model/families/family_model.h"
#include "model/families/load_common.h"
#include "model/mixers/gated_attention.h"
#include "model/mixers/gated_deltanet.h"

namespace moesq::model {

namespace {

class GdnMixer final : public Mixer {
 public:
  GdnMixer(GdnShape s, GdnWeights w) : s_(s), w_(std::move(w)) {}
  std::string name() const override { return "gated_deltanet"; }
  std::vector<float> forward(const float* x, int64_t T, const ForwardOptions& fo) const override {
    std::vector<float> y(T * s_.hidden);
    gated_deltanet_forward(s_, w_, x, T, y.data(), nullptr, fo.threads);
    return y;
  }

 private:
  GdnShape s_;
  GdnWeights w_;
};

class GatedAttentionMixer final : public Mixer {
 public:
  GatedAttentionMixer(AttentionShape s, AttentionWeights w, std::string name)
      : s_(std::move(s)), w_(std::move(w)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::vector<float> forward(const float* x, int64_t T, const ForwardOptions& fo) const override {
    std::vector<float> y(T * s_.hidden);
    AttentionShape s = s_;
    s.rope.inv_freq_bf16 = fo.rope_bf16_inv_freq;  // per call, as the built-in attention
    attention_forward(s, w_, x, T, y.data(), nullptr, fo.threads);
    return y;
  }

 private:
  AttentionShape s_;
  AttentionWeights w_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Mixer> make_attention_mixer(AttentionShape s, AttentionWeights w, std::string name) {
  return std::make_unique<GatedAttentionMixer>(std::move(s), std::move(w), std::move(name));
}

std::unique_ptr<Mixer> make_hybrid_mixer(const io::Checkpoint& ckpt, const io::ModelSpec& /*spec*/, int64_t layer) {
  const io::FamilySpec f = io::parse_family_config(ckpt.config(), ckpt.dir() + "/config.json");
  if (f.layer_mixer.at(layer) == io::MixerKind::GatedDeltaNet) {
    const GdnShape s = family_gdn_shape(f);
    GdnWeights w;
    family_load::load_gdn(ckpt, f, s, layer, w);
    return std::make_unique<GdnMixer>(s, std::move(w));
  }
  AttentionWeights w;
  family_load::load_hybrid_attention(ckpt, f, layer, w);
  return make_attention_mixer(family_attention_shape(f, layer), std::move(w), "gated_attention");
}

}  // namespace moesq::model
