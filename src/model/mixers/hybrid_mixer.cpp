// Mixer adapters over the family mixers (see the header); the weights are read by
// mixers/family_load.h.
#include "model/mixers/hybrid_mixer.h"

#include <algorithm>

#include "io/config_hybrid.h"
#include "model/mixers/family_load.h"
#include "model/mixers/gated_attention.h"
#include "model/mixers/gated_deltanet.h"

namespace moesq::model {

namespace {

// Decode state of a linear_attention layer: the conv window and the recurrent S (GdnState).
struct GdnDecodeState final : MixerState {
  GdnState gdn;
  int64_t max_len = 0;
};

// Decode state of an attention layer: the keys (after norm and RoPE) and values so far — on a
// sliding-window layer (gpt-oss) only the last < 2·window of them (drop_invisible_keys).
struct AttentionDecodeState final : MixerState {
  KvCache kv;
  int64_t max_len = 0;
  bool rope_bf16 = false;  // fixed at creation: the cached keys were rotated with it
};

void check_room(const MixerState& st, int64_t T, int64_t max_len, const std::string& mixer) {
  MOESQ_CHECK(st.pos + T <= max_len, mixer, " decode: position ", st.pos + T, " passes the state's max length ",
              max_len);
}

class GdnMixer final : public Mixer {
 public:
  GdnMixer(GdnShape s, GdnWeights w) : s_(s), w_(std::move(w)) {}
  std::string name() const override { return "gated_deltanet"; }
  std::vector<float> forward(const float* x, int64_t T, const ForwardOptions& fo) const override {
    std::vector<float> y(T * s_.hidden);
    gated_deltanet_forward(s_, w_, x, T, y.data(), nullptr, fo.threads);
    return y;
  }
  bool has_forward_ref() const override { return true; }
  std::vector<float> forward_ref(const float* x, int64_t T, const ForwardOptions& /*fo*/) const override {
    std::vector<float> y(T * s_.hidden);
    gated_deltanet_forward_ref(s_, w_, x, T, y.data());
    return y;
  }
  std::unique_ptr<MixerState> new_decode_state(int64_t max_len, const ForwardOptions& /*fo*/) const override {
    auto st = std::make_unique<GdnDecodeState>();
    st->gdn = gdn_initial_state(s_);
    st->max_len = max_len;
    return st;
  }
  // The conv window and S: fixed, whatever the length.
  int64_t decode_state_bytes(int64_t /*max_len*/) const override {
    return state_bytes(static_cast<__int128>(s_.conv_dim()) * (s_.conv_kernel - 1) +
                       static_cast<__int128>(s_.num_v_heads) * s_.head_k_dim * s_.head_v_dim);
  }
  // The recurrent form is the forward's own: a step is gated_deltanet_forward continuing the state.
  std::vector<float> decode(const float* x, int64_t T, MixerState& state, const ForwardOptions& fo) const override {
    GdnDecodeState& st = mixer_state_as<GdnDecodeState>(state, name());
    check_room(st, T, st.max_len, name());
    std::vector<float> y(T * s_.hidden);
    gated_deltanet_forward(s_, w_, x, T, y.data(), &st.gdn, fo.threads);
    st.pos = st.gdn.tokens;
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
  bool has_forward_ref() const override { return true; }
  std::vector<float> forward_ref(const float* x, int64_t T, const ForwardOptions& fo) const override {
    std::vector<float> y(T * s_.hidden);
    AttentionShape s = s_;
    s.rope.inv_freq_bf16 = fo.rope_bf16_inv_freq;
    attention_forward_ref(s, w_, x, T, y.data());
    return y;
  }
  std::unique_ptr<MixerState> new_decode_state(int64_t max_len, const ForwardOptions& fo) const override {
    auto st = std::make_unique<AttentionDecodeState>();
    st->max_len = max_len;
    st->rope_bf16 = fo.rope_bf16_inv_freq;
    // Allocated once at its largest (decode_state_bytes): steps never reallocate, and a too-long
    // request fails here, not mid-generation.
    const size_t n = static_cast<size_t>(cache_rows(max_len) * s_.num_kv_heads * s_.head_dim);
    st->kv.k.reserve(n);
    st->kv.v.reserve(n);
    return st;
  }
  int64_t decode_state_bytes(int64_t max_len) const override {
    return state_bytes(2 * static_cast<__int128>(cache_rows(max_len)) * s_.num_kv_heads * s_.head_dim);
  }
  std::vector<float> decode(const float* x, int64_t T, MixerState& state, const ForwardOptions& fo) const override {
    AttentionDecodeState& st = mixer_state_as<AttentionDecodeState>(state, name());
    check_room(st, T, st.max_len, name());
    std::vector<float> y(T * s_.hidden);
    AttentionShape s = s_;
    s.rope.inv_freq_bf16 = st.rope_bf16;
    attention_forward(s, w_, x, T, y.data(), &st.kv, fo.threads);
    drop_invisible_keys(s, st.kv);
    st.pos = st.kv.len;
    return y;
  }

 private:
  // Most K/V rows the cache holds over one-token steps: every position without a window; with one,
  // the window − 1 rows kept by drop_invisible_keys plus the window accumulated before the next drop.
  int64_t cache_rows(int64_t max_len) const {
    return s_.window > 0 ? std::min<int64_t>(max_len, 2 * s_.window - 1) : max_len;
  }

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
