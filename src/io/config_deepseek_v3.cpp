// config.json → DeepseekV3Spec. The non-obvious decisions: the MLA head dims must be consistent
// with the optional `head_dim` / `qk_head_dim` keys (transformers sets head_dim = qk_rope_head_dim
// and derives qk_head_dim; a config that says otherwise is ambiguous, so it is an error rather than
// a silent pick); and settings that change the arithmetic but that the forward does not implement
// (another scoring function, a non-grouped top-k method, MoE every n-th layer) are refused by name
// instead of being read and ignored.
#include "io/config_deepseek_v3.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace moesq::io {

namespace {

using nlohmann::json;

// A key that is absent or null reads as absent.
const json* lookup(const json& j, const char* key) {
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

// Typed readers: `what` is the key path used in error messages.
int64_t as_int(const json& v, const std::string& what, const std::string& src) {
  MOESQ_CHECK(v.is_number_integer(), src, ": key \"", what, "\" must be an integer, got ", v.dump());
  return v.get<int64_t>();
}
double as_number(const json& v, const std::string& what, const std::string& src) {
  MOESQ_CHECK(v.is_number(), src, ": key \"", what, "\" must be a number, got ", v.dump());
  return v.get<double>();
}
bool as_bool(const json& v, const std::string& what, const std::string& src) {
  MOESQ_CHECK(v.is_boolean(), src, ": key \"", what, "\" must be true or false, got ", v.dump());
  return v.get<bool>();
}
std::string as_string(const json& v, const std::string& what, const std::string& src) {
  MOESQ_CHECK(v.is_string(), src, ": key \"", what, "\" must be a string, got ", v.dump());
  return v.get<std::string>();
}

int64_t required_int(const json& j, const char* key, const std::string& src, int64_t min_value) {
  const json* v = lookup(j, key);
  MOESQ_CHECK(v, src, ": missing key \"", key, "\"");
  const int64_t x = as_int(*v, key, src);
  MOESQ_CHECK(x >= min_value, src, ": key \"", key, "\" must be >= ", min_value, ", got ", x);
  return x;
}

template <class T, class Read>
T optional_key(const json& j, const char* key, T fallback, Read read, const std::string& src) {
  const json* v = lookup(j, key);
  return v ? read(*v, key, src) : fallback;
}

// Where the RoPE settings live: rope_parameters (transformers >= 5, holds rope_theta too) and/or
// rope_scaling (hub configs). Both may be present (transformers 5 merges them); their types must agree.
RopeSpec parse_rope(const json& j, const std::string& src) {
  RopeSpec r;
  const json* params = lookup(j, "rope_parameters");
  const json* scaling = lookup(j, "rope_scaling");
  for (const json* o : {params, scaling})
    MOESQ_CHECK(!o || o->is_object(), src, ": key \"", o == params ? "rope_parameters" : "rope_scaling",
                "\" must be an object, got ", o->dump());
  auto type_of = [&](const json* o, const char* name) -> std::string {
    if (!o) return "";
    for (const char* k : {"rope_type", "type"})
      if (const json* t = lookup(*o, k)) return as_string(*t, std::string(name) + "." + k, src);
    return "";
  };
  const std::string tp = type_of(params, "rope_parameters"), ts = type_of(scaling, "rope_scaling");
  MOESQ_CHECK(tp.empty() || ts.empty() || tp == ts || tp == "default", src, ": rope_parameters type \"", tp,
              "\" and rope_scaling type \"", ts, "\" disagree");
  r.type = !ts.empty() ? ts : (!tp.empty() ? tp : "default");
  MOESQ_CHECK(r.type == "default" || r.type == "yarn", src, ": RoPE type \"", r.type,
              "\" is not supported for deepseek_v3 (default or yarn)");

  const json* theta_top = lookup(j, "rope_theta");
  const json* theta_par = params ? lookup(*params, "rope_theta") : nullptr;
  MOESQ_CHECK(theta_top || theta_par, src, ": missing key \"rope_theta\" (or \"rope_parameters.rope_theta\")");
  if (theta_top) r.theta = as_number(*theta_top, "rope_theta", src);
  if (theta_par) {
    const double v = as_number(*theta_par, "rope_parameters.rope_theta", src);
    MOESQ_CHECK(!theta_top || v == r.theta, src, ": rope_theta = ", r.theta, " and rope_parameters.rope_theta = ", v,
                " disagree");
    r.theta = v;
  }
  MOESQ_CHECK(std::isfinite(r.theta) && r.theta > 0, src, ": rope_theta must be positive");
  if (r.type != "yarn") return r;

  const json& y = (ts == "yarn") ? *scaling : *params;
  const std::string yn = (ts == "yarn") ? "rope_scaling." : "rope_parameters.";
  const json* factor = lookup(y, "factor");
  MOESQ_CHECK(factor, src, ": missing key \"", yn, "factor\" (YaRN)");
  r.factor = as_number(*factor, yn + "factor", src);
  MOESQ_CHECK(r.factor > 0, src, ": ", yn, "factor must be positive, got ", r.factor);
  auto num = [&](const char* k, double fallback) {
    const json* v = lookup(y, k);
    return v ? as_number(*v, yn + k, src) : fallback;
  };
  r.beta_fast = num("beta_fast", 32.0);
  r.beta_slow = num("beta_slow", 1.0);
  // transformers: `beta_fast or 32` — an explicit 0 means the default too.
  if (r.beta_fast == 0) r.beta_fast = 32.0;
  if (r.beta_slow == 0) r.beta_slow = 1.0;
  r.mscale = num("mscale", 0.0);
  r.mscale_all_dim = num("mscale_all_dim", 0.0);
  r.attention_factor = num("attention_factor", -1.0);
  if (const json* v = lookup(y, "original_max_position_embeddings")) {
    r.original_max_position_embeddings = as_int(*v, yn + "original_max_position_embeddings", src);
    MOESQ_CHECK(r.original_max_position_embeddings > 0, src, ": ", yn, "original_max_position_embeddings must be positive");
  }
  if (const json* v = lookup(y, "truncate")) r.truncate = as_bool(*v, yn + "truncate", src);
  return r;
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

bool is_deepseek_v3_model_type(const std::string& t) { return t == "deepseek_v3" || t == "kimi_k2"; }

double DeepseekV3Spec::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.type != "default" && rope.mscale_all_dim != 0) {
    const double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

DeepseekV3Spec parse_deepseek_v3_config(const json& j, const std::string& src) {
  MOESQ_CHECK(j.is_object(), src, ": config is not a JSON object");
  DeepseekV3Spec s;
  const json* mt = lookup(j, "model_type");
  MOESQ_CHECK(mt, src, ": missing key \"model_type\"");
  s.model_type = as_string(*mt, "model_type", src);
  MOESQ_CHECK(is_deepseek_v3_model_type(s.model_type), src, ": model_type \"", s.model_type,
              "\" is not deepseek_v3 / kimi_k2");

  s.vocab_size = required_int(j, "vocab_size", src, 1);
  s.hidden_size = required_int(j, "hidden_size", src, 1);
  s.intermediate_size = required_int(j, "intermediate_size", src, 1);
  s.moe_intermediate_size = required_int(j, "moe_intermediate_size", src, 1);
  s.num_layers = required_int(j, "num_hidden_layers", src, 1);
  s.num_heads = required_int(j, "num_attention_heads", src, 1);
  const int64_t nkv = optional_key<int64_t>(j, "num_key_value_heads", s.num_heads, as_int, src);
  MOESQ_CHECK(nkv == s.num_heads, src, ": num_key_value_heads = ", nkv, " differs from num_attention_heads = ",
              s.num_heads, " (multi-head latent attention expands k and v to every head)");

  // MLA ranks and head dims. q_lora_rank must be present; null means no q LoRA (q_proj).
  MOESQ_CHECK(j.contains("q_lora_rank"), src, ": missing key \"q_lora_rank\" (null for a plain q_proj)");
  if (const json* q = lookup(j, "q_lora_rank")) {
    s.q_lora_rank = as_int(*q, "q_lora_rank", src);
    MOESQ_CHECK(s.q_lora_rank > 0, src, ": q_lora_rank must be positive or null, got ", s.q_lora_rank);
  }
  s.kv_lora_rank = required_int(j, "kv_lora_rank", src, 1);
  s.qk_nope_head_dim = required_int(j, "qk_nope_head_dim", src, 0);
  s.qk_rope_head_dim = required_int(j, "qk_rope_head_dim", src, 2);
  s.v_head_dim = required_int(j, "v_head_dim", src, 1);
  MOESQ_CHECK(s.qk_rope_head_dim % 2 == 0, src, ": qk_rope_head_dim ", s.qk_rope_head_dim, " must be even (RoPE)");
  if (const json* v = lookup(j, "head_dim")) {
    const int64_t hd = as_int(*v, "head_dim", src);
    MOESQ_CHECK(hd == s.qk_rope_head_dim, src, ": head_dim = ", hd, " differs from qk_rope_head_dim = ",
                s.qk_rope_head_dim, " (deepseek_v3 rotates qk_rope_head_dim dims)");
  }
  if (const json* v = lookup(j, "qk_head_dim")) {
    const int64_t qk = as_int(*v, "qk_head_dim", src);
    MOESQ_CHECK(qk == s.qk_head_dim(), src, ": qk_head_dim = ", qk, " is not qk_nope_head_dim + qk_rope_head_dim = ",
                s.qk_head_dim());
  }
  s.rope = parse_rope(j, src);
  s.rope_interleave = optional_key<bool>(j, "rope_interleave", true, as_bool, src);
  s.max_position_embeddings = optional_key<int64_t>(j, "max_position_embeddings", 0, as_int, src);
  if (s.rope.type == "yarn" && s.rope.original_max_position_embeddings > 0)
    MOESQ_CHECK(s.max_position_embeddings > 0, src,
                ": YaRN with original_max_position_embeddings needs max_position_embeddings");

  // Routing.
  s.n_routed_experts = required_int(j, "n_routed_experts", src, 1);
  s.n_shared_experts = required_int(j, "n_shared_experts", src, 0);
  s.top_k = required_int(j, "num_experts_per_tok", src, 1);
  s.n_group = required_int(j, "n_group", src, 1);
  s.topk_group = required_int(j, "topk_group", src, 1);
  MOESQ_CHECK(s.n_routed_experts % s.n_group == 0, src, ": n_routed_experts = ", s.n_routed_experts,
              " is not a multiple of n_group = ", s.n_group);
  MOESQ_CHECK(s.n_routed_experts / s.n_group >= 2, src, ": groups of ", s.n_routed_experts / s.n_group,
              " expert(s): the group score is the sum of the top 2, so a group needs >= 2 experts");
  MOESQ_CHECK(s.topk_group <= s.n_group, src, ": topk_group = ", s.topk_group, " exceeds n_group = ", s.n_group);
  MOESQ_CHECK(s.top_k <= s.topk_group * (s.n_routed_experts / s.n_group), src, ": num_experts_per_tok = ", s.top_k,
              " exceeds the experts of topk_group = ", s.topk_group, " groups");
  const json* rsf = lookup(j, "routed_scaling_factor");
  MOESQ_CHECK(rsf, src, ": missing key \"routed_scaling_factor\"");
  s.routed_scaling_factor = as_number(*rsf, "routed_scaling_factor", src);
  MOESQ_CHECK(std::isfinite(s.routed_scaling_factor), src, ": routed_scaling_factor must be finite");
  s.first_k_dense_replace = required_int(j, "first_k_dense_replace", src, 0);
  s.norm_topk_prob = optional_key<bool>(j, "norm_topk_prob", true, as_bool, src);
  for (auto [key, want] : {std::pair{"scoring_func", "sigmoid"}, std::pair{"topk_method", "noaux_tc"},
                           std::pair{"hidden_act", "silu"}}) {
    if (const json* v = lookup(j, key))
      MOESQ_CHECK(as_string(*v, key, src) == want, src, ": ", key, " = ", v->dump(),
                  " is not supported (deepseek_v3 forward: ", want, ")");
  }
  if (const json* v = lookup(j, "moe_layer_freq"))
    MOESQ_CHECK(as_int(*v, "moe_layer_freq", src) == 1, src, ": moe_layer_freq = ", v->dump(),
                " is not supported (transformers' DeepseekV3 makes every layer >= first_k_dense_replace MoE)");

  s.rms_norm_eps = optional_key<double>(j, "rms_norm_eps", 1e-6, as_number, src);
  MOESQ_CHECK(s.rms_norm_eps > 0, src, ": rms_norm_eps must be positive");
  s.attention_bias = optional_key<bool>(j, "attention_bias", false, as_bool, src);
  s.tie_word_embeddings = optional_key<bool>(j, "tie_word_embeddings", false, as_bool, src);
  return s;
}

ModelSpec to_model_spec(const DeepseekV3Spec& d) {
  ModelSpec s;
  s.model_type = d.model_type;
  s.vocab_size = d.vocab_size;
  s.hidden_size = d.hidden_size;
  s.intermediate_size = d.intermediate_size;
  s.moe_intermediate_size = d.moe_intermediate_size;
  s.num_layers = d.num_layers;
  s.num_heads = d.num_heads;
  s.num_kv_heads = d.num_heads;
  s.head_dim = d.qk_head_dim();
  s.num_experts = d.n_routed_experts;
  s.top_k = d.top_k;
  s.norm_topk_prob = d.norm_topk_prob;
  s.rms_norm_eps = d.rms_norm_eps;
  s.rope_theta = d.rope.theta;
  s.max_position_embeddings = d.max_position_embeddings;
  s.tie_word_embeddings = d.tie_word_embeddings;
  s.attention_bias = d.attention_bias;
  for (int64_t l = 0; l < std::min(d.first_k_dense_replace, d.num_layers); ++l) s.mlp_only_layers.push_back(l);
  return s;
}

}  // namespace moesq::io
