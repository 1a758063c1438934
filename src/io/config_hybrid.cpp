// HF config.json → FamilySpec for qwen3_next, qwen3_5_moe_text and gpt_oss (see the header).
// Non-obvious decision: the defaults are those of transformers' own config classes
// (Qwen3NextConfig: norm_topk_prob true…; Qwen3_5MoeTextConfig always renormalises the top-k;
// GptOssConfig: swiglu_limit 7.0, alpha 1.702 fixed in GptOssExperts), so a hub config that omits a
// key runs as transformers would run it.
#include "io/config_hybrid.h"

#include <cmath>

#include "core/error.h"

namespace moesq::io {

namespace {

using nlohmann::json;

const json* key(const json& j, const char* k) {
  auto it = j.find(k);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

int64_t positive(const json& j, const char* k, const std::string& src) {
  const json* v = key(j, k);
  MOESQ_CHECK(v, src, ": missing key \"", k, "\"");
  MOESQ_CHECK(v->is_number_integer() && v->get<int64_t>() > 0, src, ": key \"", k,
              "\" must be a positive integer, got ", v->dump());
  return v->get<int64_t>();
}

int64_t int_or(const json& j, const char* k, int64_t dflt, const std::string& src) {
  const json* v = key(j, k);
  if (!v) return dflt;
  MOESQ_CHECK(v->is_number_integer(), src, ": key \"", k, "\" must be an integer, got ", v->dump());
  return v->get<int64_t>();
}

double num_or(const json& j, const char* k, double dflt, const std::string& src) {
  const json* v = key(j, k);
  if (!v) return dflt;
  MOESQ_CHECK(v->is_number() && std::isfinite(v->get<double>()), src, ": key \"", k,
              "\" must be a finite number, got ", v->dump());
  return v->get<double>();
}

bool bool_or(const json& j, const char* k, bool dflt, const std::string& src) {
  const json* v = key(j, k);
  if (!v) return dflt;
  MOESQ_CHECK(v->is_boolean(), src, ": key \"", k, "\" must be true or false, got ", v->dump());
  return v->get<bool>();
}

// rope_parameters (transformers 5) or rope_scaling + rope_theta (hub spelling).
HybridRopeSpec parse_rope(const json& j, int64_t head_dim, const std::string& src) {
  HybridRopeSpec r;
  const json* params = key(j, "rope_parameters");
  if (!params) params = key(j, "rope_scaling");
  static const json kEmpty = json::object();
  const json& p = params ? *params : kEmpty;
  MOESQ_CHECK(p.is_object(), src, ": key \"rope_parameters\" must be an object, got ", p.dump());
  r.theta = num_or(p, "rope_theta", num_or(j, "rope_theta", 0.0, src), src);
  MOESQ_CHECK(r.theta > 0, src, ": missing or non-positive \"rope_theta\" (or rope_parameters.rope_theta)");
  const double partial = num_or(p, "partial_rotary_factor", num_or(j, "partial_rotary_factor", 1.0, src), src);
  MOESQ_CHECK(partial > 0 && partial <= 1, src, ": partial_rotary_factor ", partial, " not in (0, 1]");
  r.rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * partial);
  MOESQ_CHECK(r.rotary_dim >= 2 && r.rotary_dim % 2 == 0, src, ": rotary dim int(head_dim · partial_rotary_factor) = ",
              r.rotary_dim, " must be even and >= 2");
  std::string type = "default";
  for (const char* tk : {"rope_type", "type"})
    if (const json* t = key(p, tk)) {
      MOESQ_CHECK(t->is_string(), src, ": rope_parameters.", tk, " must be a string");
      type = t->get<std::string>();
    }
  if (type == "default") return r;
  MOESQ_CHECK(type == "yarn", src, ": rope type \"", type, "\" is not supported (default, yarn)");
  r.type = HybridRopeType::Yarn;
  r.factor = num_or(p, "factor", 0.0, src);
  MOESQ_CHECK(r.factor >= 1.0, src, ": rope_parameters.factor must be >= 1 for yarn, got ", r.factor);
  r.beta_fast = num_or(p, "beta_fast", 32.0, src);
  r.beta_slow = num_or(p, "beta_slow", 1.0, src);
  r.original_max_position_embeddings = int_or(p, "original_max_position_embeddings", 0, src);
  MOESQ_CHECK(r.original_max_position_embeddings > 0, src,
              ": yarn needs a positive rope_parameters.original_max_position_embeddings");
  r.truncate = bool_or(p, "truncate", true, src);
  MOESQ_CHECK(!key(p, "mscale") && !key(p, "mscale_all_dim"), src,
              ": yarn mscale / mscale_all_dim are not supported");
  r.attention_factor = num_or(p, "attention_factor", 0.1 * std::log(r.factor) + 1.0, src);
  return r;
}

std::vector<MixerKind> parse_layer_types(const json& j, int64_t L, const std::string& src) {
  const json* lt = key(j, "layer_types");
  MOESQ_CHECK(lt && lt->is_array(), src, ": missing list \"layer_types\"");
  MOESQ_CHECK(static_cast<int64_t>(lt->size()) == L, src, ": layer_types has ", lt->size(),
              " entries, num_hidden_layers is ", L);
  std::vector<MixerKind> out;
  for (const json& t : *lt) {
    MOESQ_CHECK(t.is_string(), src, ": layer_types entries must be strings, got ", t.dump());
    const std::string s = t.get<std::string>();
    if (s == "full_attention") out.push_back(MixerKind::FullAttention);
    else if (s == "sliding_attention") out.push_back(MixerKind::SlidingAttention);
    else if (s == "linear_attention") out.push_back(MixerKind::GatedDeltaNet);
    else MOESQ_FAIL(src, ": layer type \"", s, "\" is not supported");
  }
  return out;
}

}  // namespace

const char* mixer_kind_name(MixerKind k) {
  switch (k) {
    case MixerKind::FullAttention: return "full_attention";
    case MixerKind::SlidingAttention: return "sliding_attention";
    case MixerKind::GatedDeltaNet: return "linear_attention";
  }
  return "?";
}

bool is_family_model_type(const std::string& t) {
  return t == "qwen3_next" || t == "qwen3_5_moe_text" || t == "gpt_oss";
}

FamilySpec parse_family_config(const json& j, const std::string& src) {
  MOESQ_CHECK(j.is_object(), src, ": config is not a JSON object");
  const json* mt = key(j, "model_type");
  MOESQ_CHECK(mt && mt->is_string(), src, ": missing string key \"model_type\"");
  FamilySpec f;
  ModelSpec& s = f.base;
  s.model_type = mt->get<std::string>();
  MOESQ_CHECK(is_family_model_type(s.model_type), src, ": model_type \"", s.model_type,
              "\" is not one of qwen3_next, qwen3_5_moe_text, gpt_oss");
  const bool gpt_oss = s.model_type == "gpt_oss";
  s.vocab_size = positive(j, "vocab_size", src);
  s.hidden_size = positive(j, "hidden_size", src);
  s.num_layers = positive(j, "num_hidden_layers", src);
  s.num_heads = positive(j, "num_attention_heads", src);
  s.num_kv_heads = positive(j, "num_key_value_heads", src);
  s.head_dim = int_or(j, "head_dim", s.hidden_size / s.num_heads, src);
  MOESQ_CHECK(s.head_dim > 0 && s.num_heads % s.num_kv_heads == 0, src, ": head_dim ", s.head_dim,
              " and heads ", s.num_heads, "/", s.num_kv_heads, " are inconsistent");
  s.top_k = positive(j, "num_experts_per_tok", src);
  s.num_experts = gpt_oss ? positive(j, "num_local_experts", src) : positive(j, "num_experts", src);
  MOESQ_CHECK(s.top_k <= s.num_experts, src, ": num_experts_per_tok ", s.top_k, " exceeds ", s.num_experts);
  // gpt_oss calls the expert width intermediate_size; the Qwen families moe_intermediate_size.
  s.moe_intermediate_size = positive(j, gpt_oss ? "intermediate_size" : "moe_intermediate_size", src);
  s.intermediate_size = gpt_oss ? s.moe_intermediate_size : int_or(j, "intermediate_size", 0, src);
  s.rms_norm_eps = num_or(j, "rms_norm_eps", 1e-6, src);
  MOESQ_CHECK(s.rms_norm_eps > 0, src, ": rms_norm_eps must be positive");
  s.max_position_embeddings = int_or(j, "max_position_embeddings", 0, src);
  s.tie_word_embeddings = bool_or(j, "tie_word_embeddings", false, src);
  s.attention_bias = bool_or(j, "attention_bias", false, src);
  if (const json* act = key(j, "hidden_act"))
    MOESQ_CHECK(act->is_string() && act->get<std::string>() == "silu", src, ": hidden_act ", act->dump(),
                " is not supported (silu)");

  f.layer_mixer = parse_layer_types(j, s.num_layers, src);
  f.rope = parse_rope(j, s.head_dim, src);
  s.rope_theta = f.rope.theta;
  if (gpt_oss) {
    f.attn_sinks = true;
    f.router_bias = true;
    f.clamped_swiglu = true;
    f.swiglu_limit = num_or(j, "swiglu_limit", 7.0, src);
    f.sliding_window = int_or(j, "sliding_window", 0, src);
    s.norm_topk_prob = true;  // softmax over the top-k logits: the weights sum to one
    for (MixerKind k : f.layer_mixer) {
      MOESQ_CHECK(k != MixerKind::GatedDeltaNet, src, ": gpt_oss has no linear_attention layers");
      MOESQ_CHECK(k != MixerKind::SlidingAttention || f.sliding_window > 0, src,
                  ": sliding_attention layers need a positive \"sliding_window\"");
    }
    return f;
  }
  // Qwen3-Next / Qwen3.5 text.
  f.attn_output_gate = true;
  f.qk_norm = true;
  f.zero_centered_norms = true;
  f.fused_qkvz = s.model_type == "qwen3_next";
  f.linear_conv_kernel = positive(j, "linear_conv_kernel_dim", src);
  f.linear_num_key_heads = positive(j, "linear_num_key_heads", src);
  f.linear_key_head_dim = positive(j, "linear_key_head_dim", src);
  f.linear_num_value_heads = positive(j, "linear_num_value_heads", src);
  f.linear_value_head_dim = positive(j, "linear_value_head_dim", src);
  MOESQ_CHECK(f.linear_num_value_heads % f.linear_num_key_heads == 0, src, ": linear_num_value_heads ",
              f.linear_num_value_heads, " is not a multiple of linear_num_key_heads ", f.linear_num_key_heads);
  f.shared_expert_intermediate_size = int_or(j, "shared_expert_intermediate_size", 0, src);
  s.norm_topk_prob = f.fused_qkvz ? bool_or(j, "norm_topk_prob", true, src) : true;
  if (f.fused_qkvz) {  // Qwen3-Next keeps Qwen3-MoE's dense-layer switches; Qwen3.5 is MoE everywhere
    s.decoder_sparse_step = int_or(j, "decoder_sparse_step", 1, src);
    MOESQ_CHECK(s.decoder_sparse_step >= 1, src, ": decoder_sparse_step must be >= 1");
    if (const json* v = key(j, "mlp_only_layers")) {
      MOESQ_CHECK(v->is_array(), src, ": key \"mlp_only_layers\" must be a list");
      for (const json& l : *v) {
        MOESQ_CHECK(l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < s.num_layers, src,
                    ": mlp_only_layers entry ", l.dump(), " is not a layer index");
        s.mlp_only_layers.push_back(l.get<int64_t>());
      }
    }
    for (int64_t l = 0; l < s.num_layers; ++l)
      MOESQ_CHECK(s.is_moe_layer(l) || s.intermediate_size > 0, src,
                  ": layer ", l, " is a dense MLP layer but \"intermediate_size\" is missing");
  }
  for (MixerKind k : f.layer_mixer)
    MOESQ_CHECK(k != MixerKind::SlidingAttention, src, ": ", s.model_type, " has no sliding_attention layers");
  return f;
}

}  // namespace moesq::io
