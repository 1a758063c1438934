// Host side of the attention block (attention_block.h).
#include "runtime/layers/attention_block.h"

#include "core/error.h"
#include "core/half.h"
#include "io/tensor_names.h"
#include "io/tensor_names_families.h"
#include "io/config_hybrid.h"
#include "model/families.h"
#include "model/mixers/family_load.h"

namespace moesq::runtime {

std::string attention_block_refusal(const io::ModelSpec& s) {
  const model::ModelFamily* f = model::find_model_family(s.model_type);
  if (!f) return "moesq has no forward for it";
  const bool hybrid = is_hybrid_family(s.model_type);
  if (f->make_mixer && !is_sink_attention_family(s.model_type) && !hybrid)
    return "its token mixer is not the built-in GQA attention";
  std::string why;
  auto no = [&](bool bad, const char* what) {
    if (bad) why += (why.empty() ? "" : ", ") + std::string(what);
  };
  no(!f->make_mixer && s.attention_bias, "its o_proj has a bias (attention_bias)");
  no(s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256,
     "its head_dim is not 32, 64, 128 or 256");
  const int64_t G = s.num_kv_heads > 0 ? s.num_heads / s.num_kv_heads : 0;
  no(G != 1 && G != 2 && G != 4 && G != 8 && G != 16, "its query heads per kv head are not 1, 2, 4, 8 or 16");
  no(s.rms_norm_unit_offset && !hybrid, "its RMSNorm weights are zero-centred");
  return why;
}

bool is_sink_attention_family(const std::string& model_type) { return model_type == "gpt_oss"; }

bool is_hybrid_family(const std::string& model_type) {
  return model_type == "qwen3_next" || model_type == "qwen3_5_moe_text";
}

namespace {

void append_bf16(std::vector<uint16_t>& dst, const std::vector<float>& v) {
  for (float f : v) dst.push_back(f32_to_bf16(f));
}

// gpt-oss's layer `l` (model/mixers/sink_attention.cpp reads the same tensors): q/k/v/o projections and
// biases, the sink logits, the layer's window. Errors name what the block does not run.
HostAttention load_sink_attention(const io::Checkpoint& ckpt, int64_t l) {
  const io::FamilySpec f = io::parse_family_config(ckpt.config(), ckpt.dir() + "/config.json");
  const io::ModelSpec& s = ckpt.spec();
  MOESQ_CHECK(!f.attn_output_gate && !f.qk_norm && !f.zero_centered_norms, ckpt.dir(),
              ": the GPU attention block runs gpt-oss's sink attention without an output gate, q/k norms or "
              "zero-centred norms");
  MOESQ_CHECK(f.rope.rotary_dim == s.head_dim, ckpt.dir(), ": the GPU attention block rotates the whole head (",
              s.head_dim, " dims), the config rotates ", f.rope.rotary_dim);
  const io::MixerKind kind = f.layer_mixer.at(l);
  MOESQ_CHECK(kind == io::MixerKind::FullAttention || kind == io::MixerKind::SlidingAttention, ckpt.dir(), ": layer ",
              l, " is not an attention layer");
  model::AttentionWeights w;
  model::family_load::load_attention_projections(ckpt, f, l, w);
  HostAttention a;
  const int64_t H = s.hidden_size;
  a.input_norm = ckpt.get_f32(io::layer_tensor(l, io::kInputNorm), {H});
  append_bf16(a.qkv, w.q_proj);
  append_bf16(a.qkv, w.k_proj);
  append_bf16(a.qkv, w.v_proj);
  append_bf16(a.o, w.o_proj);
  if (!w.q_bias.empty()) {
    a.qkv_bias = w.q_bias;
    a.qkv_bias.insert(a.qkv_bias.end(), w.k_bias.begin(), w.k_bias.end());
    a.qkv_bias.insert(a.qkv_bias.end(), w.v_bias.begin(), w.v_bias.end());
  }
  a.o_bias = w.o_bias;
  if (f.attn_sinks) a.sinks = model::family_load::layer_f32(ckpt, l, io::family_names::kSinks, {s.num_heads});
  a.window = kind == io::MixerKind::SlidingAttention ? f.sliding_window : 0;
  return a;
}

// A Qwen3-Next / Qwen3.5 full_attention layer `l` (model/mixers/gated_attention.cpp reads the same
// tensors): q (query | gate per head), k, v, o; the per-head q/k norms and the input norm as 1 + w.
HostAttention load_hybrid_attention(const io::Checkpoint& ckpt, int64_t l) {
  const io::FamilySpec f = io::parse_family_config(ckpt.config(), ckpt.dir() + "/config.json");
  const io::ModelSpec& s = ckpt.spec();
  MOESQ_CHECK(f.layer_mixer.at(l) == io::MixerKind::FullAttention, ckpt.dir(), ": layer ", l,
              " is not a full_attention layer");
  MOESQ_CHECK(!s.attention_bias && !f.attn_sinks && f.qk_norm, ckpt.dir(),
              ": the GPU attention block runs the hybrid families' gated attention with per-head q/k norms and "
              "without projection biases or sinks");
  MOESQ_CHECK(f.rope.type == io::HybridRopeType::Default, ckpt.dir(),
              ": the GPU attention block runs the hybrid families' default RoPE (YaRN is not built for them)");
  model::AttentionWeights w;
  model::family_load::load_hybrid_attention(ckpt, f, l, w);
  HostAttention a;
  a.input_norm = model::family_load::norm_multiplier(ckpt, l, io::kInputNorm, s.hidden_size, f.zero_centered_norms);
  a.q_norm = std::move(w.q_norm);
  a.k_norm = std::move(w.k_norm);
  append_bf16(a.qkv, w.q_proj);
  append_bf16(a.qkv, w.k_proj);
  append_bf16(a.qkv, w.v_proj);
  append_bf16(a.o, w.o_proj);
  a.output_gate = f.attn_output_gate;
  a.rotary_dim = static_cast<int>(f.rope.rotary_dim);
  return a;
}

}  // namespace

HostAttention load_host_attention(const io::Checkpoint& ckpt, int64_t l) {
  namespace names = io::family_names;
  const io::ModelSpec& s = ckpt.spec();
  if (is_sink_attention_family(s.model_type)) return load_sink_attention(ckpt, l);
  if (is_hybrid_family(s.model_type)) return load_hybrid_attention(ckpt, l);
  const int64_t H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  auto get = [&](const std::string& rest, const std::vector<int64_t>& shape) {
    return ckpt.get_f32(io::layer_tensor(l, rest), shape);
  };
  auto proj = [&](const char* p) { return std::string(names::kAttn) + p + io::kWeight; };
  HostAttention a;
  a.input_norm = get(io::kInputNorm, {H});
  if (s.qk_norm == io::QkNorm::PerHead) {
    a.q_norm = get(names::kQNorm, {hd});
    a.k_norm = get(names::kKNorm, {hd});
  } else if (s.qk_norm == io::QkNorm::Whole) {
    a.q_norm = get(names::kQNorm, {nh * hd});
    a.k_norm = get(names::kKNorm, {nkv * hd});
  }
  if (s.qkv_bias) {
    for (const auto& [p, rows] : {std::pair{"self_attn.q_proj.bias", nh * hd}, {"self_attn.k_proj.bias", nkv * hd},
                                  {"self_attn.v_proj.bias", nkv * hd}}) {
      const std::vector<float> b = get(p, {rows});
      a.qkv_bias.insert(a.qkv_bias.end(), b.begin(), b.end());
    }
  }
  append_bf16(a.qkv, get(proj(names::kQProj), {nh * hd, H}));
  append_bf16(a.qkv, get(proj(names::kKProj), {nkv * hd, H}));
  append_bf16(a.qkv, get(proj(names::kVProj), {nkv * hd, H}));
  append_bf16(a.o, get(proj(names::kOProj), {H, nh * hd}));
  a.window = s.window_of(l);
  return a;
}

}  // namespace moesq::runtime
