// The non-obvious decision: the MLA dims come from io::ModelSpec::mla (mla_dims), and the loader reads
// the rest of this family's config (biases, RoPE) from config.json through io/config_deepseek_v3.h —
// the same parser that filled the ModelSpec, so the two views cannot disagree.
#include "model/mixers/mla_mixer.h"

#include "core/error.h"
#include "core/half.h"
#include "io/config_deepseek_v3.h"
#include "io/tensor_names.h"
#include "io/tensor_names_deepseek_v3.h"

namespace moesq::model {

namespace names = io::deepseek_v3;

MlaMixer::MlaMixer(MlaDims dims, MlaWeights weights, RopeFrequencies rope)
    : dims_(dims), weights_(std::move(weights)), rope_(std::move(rope)) {
  MOESQ_CHECK(static_cast<int64_t>(rope_.inv_freq.size()) * 2 == dims_.qk_rope_head_dim, "mla: ",
              rope_.inv_freq.size(), " RoPE frequencies for ", dims_.qk_rope_head_dim, " rotated dims");
}

RopeTables MlaMixer::tables(int64_t T, bool bf16_inv_freq) const {
  RopeTables t;
  if (!bf16_inv_freq) {
    rope_tables(T, rope_, t.cos, t.sin);
    return t;
  }
  RopeFrequencies f = rope_;
  for (float& v : f.inv_freq) v = round_bf16(v);
  rope_tables(T, f, t.cos, t.sin);
  return t;
}

std::vector<float> MlaMixer::forward(const float* x, int64_t T, const ForwardOptions& fo) const {
  std::vector<float> out(T * dims_.hidden);  // [T, H]
  mla_forward(dims_, weights_, tables(T, fo.rope_bf16_inv_freq), x, T, out.data(), fo.threads);
  return out;
}

std::vector<float> MlaMixer::forward_ref(const float* x, int64_t T, const ForwardOptions& fo) const {
  std::vector<float> out(T * dims_.hidden);
  mla_forward_ref(dims_, weights_, tables(T, fo.rope_bf16_inv_freq), x, T, out.data());
  return out;
}

namespace {
struct MlaDecodeState final : MixerState {
  MlaLatentCache cache;
  RopeTables rope;  // [max_len, rope/2]
};
}  // namespace

std::unique_ptr<MixerState> MlaMixer::new_decode_state(int64_t max_len, const ForwardOptions& fo) const {
  auto st = std::make_unique<MlaDecodeState>();
  st->cache = mla_latent_cache(dims_, max_len);
  st->rope = tables(max_len, fo.rope_bf16_inv_freq);
  return st;
}

int64_t MlaMixer::decode_state_bytes(int64_t max_len) const {
  const int64_t half = dims_.qk_rope_head_dim / 2;  // RoPE table columns (rope_ frequencies)
  return state_bytes(static_cast<__int128>(max_len) * (dims_.kv_lora_rank + dims_.qk_rope_head_dim + 2 * half));
}

std::vector<float> MlaMixer::decode(const float* x, int64_t T, MixerState& state, const ForwardOptions& /*fo*/) const {
  MlaDecodeState& st = mixer_state_as<MlaDecodeState>(state, name());
  std::vector<float> out(T * dims_.hidden);  // [T, H]
  mla_decode(dims_, weights_, st.rope, x, T, st.cache, out.data());
  st.pos = st.cache.len;
  return out;
}

std::unique_ptr<MlaMixer> load_mla_mixer(const io::Checkpoint& ckpt, int64_t layer) {
  const io::DeepseekV3Spec s = io::parse_deepseek_v3_config(ckpt.config(), ckpt.dir() + "/config.json");
  const MlaDims d = mla_dims(ckpt.spec());  // ModelSpec::mla: filled from s by the same parser
  const int64_t H = s.hidden_size, nh = s.num_heads, dqk = d.qk_head_dim();
  auto read = [&](const char* module, const char* suffix, std::vector<float>& dst, const std::vector<int64_t>& shape) {
    const std::string name = io::layer_tensor(layer, std::string(module) + suffix);
    const io::TensorView& t = ckpt.get(name);
    MOESQ_CHECK(t.dtype != io::DType::F8_E4M3, t.file, ": tensor ", name,
                " is F8_E4M3 (an FP8 block-quantized checkpoint): moesq reads bf16/f16/f32 weights; dequantize it "
                "with its weight_scale_inv first");
    dst = ckpt.get_f32(name, shape);
  };
  MlaWeights w;
  if (s.q_lora_rank > 0) {
    read(names::kQAProj, io::kWeight, w.q_a_proj, {s.q_lora_rank, H});
    read(names::kQANorm, io::kWeight, w.q_a_norm, {s.q_lora_rank});
    read(names::kQBProj, io::kWeight, w.q_b_proj, {nh * dqk, s.q_lora_rank});
    if (s.attention_bias) read(names::kQAProj, names::kBias, w.q_a_bias, {s.q_lora_rank});
  } else {
    read(names::kQProj, io::kWeight, w.q_proj, {nh * dqk, H});
  }
  read(names::kKvAProj, io::kWeight, w.kv_a_proj, {s.kv_lora_rank + s.qk_rope_head_dim, H});
  read(names::kKvANorm, io::kWeight, w.kv_a_norm, {s.kv_lora_rank});
  read(names::kKvBProj, io::kWeight, w.kv_b_proj, {nh * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank});
  read(names::kOProj, io::kWeight, w.o_proj, {H, nh * s.v_head_dim});
  if (s.attention_bias) {
    read(names::kKvAProj, names::kBias, w.kv_a_bias, {s.kv_lora_rank + s.qk_rope_head_dim});
    read(names::kOProj, names::kBias, w.o_bias, {H});
  }
  return std::make_unique<MlaMixer>(d, std::move(w),
                                    rope_frequencies(s.rope, s.qk_rope_head_dim, s.max_position_embeddings));
}

MlaDims mla_dims(const io::ModelSpec& spec) {
  const io::MlaSpec& m = spec.mla;
  MOESQ_CHECK(m.kv_lora_rank > 0, "model_type \"", spec.model_type, "\" has no multi-head latent attention");
  MlaDims d;
  d.hidden = spec.hidden_size;
  d.num_heads = spec.num_heads;
  d.q_lora_rank = m.q_lora_rank;
  d.kv_lora_rank = m.kv_lora_rank;
  d.qk_nope_head_dim = m.qk_nope_head_dim;
  d.qk_rope_head_dim = m.qk_rope_head_dim;
  d.v_head_dim = m.v_head_dim;
  d.rope_interleave = m.rope_interleave;
  d.softmax_scale = static_cast<float>(m.softmax_scale);
  return d;
}

std::unique_ptr<MlaMixer> zero_mla_mixer(const io::ModelSpec& spec) {
  const MlaDims d = mla_dims(spec);
  return std::make_unique<MlaMixer>(d, mla_zero_weights(d, spec.attention_bias),
                                    rope_frequencies(spec.mla.rope, d.qk_rope_head_dim, spec.max_position_embeddings));
}

std::unique_ptr<Mixer> make_mla_mixer(const io::Checkpoint& ckpt, const io::ModelSpec& spec, int64_t layer) {
  MOESQ_CHECK(io::is_deepseek_v3_model_type(spec.model_type), ckpt.dir(), ": model_type \"", spec.model_type,
              "\" has no multi-head latent attention");
  try {
    return load_mla_mixer(ckpt, layer);
  } catch (const Error& e) {
    MOESQ_FAIL("layer ", layer, " attention (mla): ", e.what());
  }
}

}  // namespace moesq::model
