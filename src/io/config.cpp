// HF config.json → ModelSpec: the keys every supported decoder shares (the per-family ones are in
// io/config_families.cpp).
// Non-obvious decision: keys that define tensor shapes or arithmetic (sizes, heads, experts, top-k,
// RoPE θ) are REQUIRED — a missing one is an error naming it — while keys that transformers'
// Qwen3MoeConfig documents with a harmless default (norm_topk_prob=false, rms_norm_eps=1e-6,
// tie_word_embeddings=false, attention_bias=false, decoder_sparse_step=1, mlp_only_layers=[]) take
// that default, as transformers itself would; every one of them that changes the forward is
// implemented (attention_bias, tie_word_embeddings) — none is read and then ignored. Where both spellings of a key are present they must agree.
#include "io/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/config_families.h"
#include "io/config_keys.h"

namespace moesq::io {

namespace {

using nlohmann::json;
using namespace config_keys;

// A rope_scaling / rope_parameters object must describe plain RoPE: the forward implements no other.
void check_rope_type(const json& rope, const char* key, const std::string& source) {
  MOESQ_CHECK(rope.is_object(), source, ": key \"", key, "\" must be an object, got ", rope.dump());
  for (const char* type_key : {"rope_type", "type"}) {
    const json* t = find(rope, type_key);
    if (!t) continue;
    MOESQ_CHECK(t->is_string() && t->get<std::string>() == "default", source, ": ", key, ".",
                type_key, " = ", t->dump(), " is not supported (only default RoPE)");
  }
}

}  // namespace

int64_t ModelSpec::window_of(int64_t layer) const {
  return layer >= 0 && layer < static_cast<int64_t>(attention_window.size()) ? attention_window[layer] : 0;
}

bool ModelSpec::has_sliding_window() const {
  return std::any_of(attention_window.begin(), attention_window.end(), [](int64_t w) { return w > 0; });
}

bool ModelSpec::is_moe_layer(int64_t layer) const {
  // transformers Qwen3MoeDecoderLayer: sparse unless listed in mlp_only_layers, every
  // decoder_sparse_step-th layer (1-based).
  // DeepSeek-V3: the first first_k_dense_replace layers are dense.
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end() ||
      layer < first_k_dense_replace) {
    return false;
  }
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

ModelSpec parse_config(const json& j, const std::string& source) {
  MOESQ_CHECK(j.is_object(), source, ": config is not a JSON object");
  ModelSpec s;
  const json* model_type = find(j, "model_type");
  MOESQ_CHECK(model_type, source, ": missing key \"model_type\"");
  MOESQ_CHECK(model_type->is_string(), source, ": key \"model_type\" must be a string");
  s.model_type = model_type->get<std::string>();
  const ConfigFamily* family = find_config_family(s.model_type);
  MOESQ_CHECK(family, source, ": unsupported architecture model_type \"", s.model_type, "\" (moesq supports ",
              supported_model_types(), ")");
  family->parse(j, source, s);
  MOESQ_CHECK(s.num_layers <= kMaxConfigLayers, source, ": num_hidden_layers = ", s.num_layers, " is more than moesq reads (",
              kMaxConfigLayers, ")");
  MOESQ_CHECK(s.num_experts <= kMaxConfigExperts, source, ": the number of routed experts (", s.num_experts,
              ") is more than moesq reads (", kMaxConfigExperts, ")");
  return s;
}

void parse_common_config(const json& j, const std::string& source, const CommonConfigKeys& keys, ModelSpec& s) {
  s.vocab_size = require_positive(j, "vocab_size", source);
  s.hidden_size = require_positive(j, "hidden_size", source);
  s.intermediate_size = require_positive(j, "intermediate_size", source);
  s.moe_intermediate_size = require_positive(j, keys.expert_width, source);
  s.num_layers = require_positive(j, "num_hidden_layers", source);
  MOESQ_CHECK(s.num_layers <= kMaxConfigLayers, source, ": num_hidden_layers = ", s.num_layers, " is more than moesq reads (",
              kMaxConfigLayers, ")");
  s.num_heads = require_positive(j, "num_attention_heads", source);
  s.num_kv_heads = require_positive(j, "num_key_value_heads", source);
  if (keys.head_dim_required || find(j, "head_dim")) {
    s.head_dim = require_positive(j, "head_dim", source);
  } else {  // transformers: hidden_size // num_attention_heads
    MOESQ_CHECK(s.hidden_size % s.num_heads == 0, source, ": no head_dim and hidden_size = ", s.hidden_size,
                " is not a multiple of num_attention_heads = ", s.num_heads);
    s.head_dim = s.hidden_size / s.num_heads;
  }
  s.top_k = require_positive(j, "num_experts_per_tok", source);

  // Experts: hub spelling num_experts, newer transformers num_local_experts.
  const json* e_hub = find(j, "num_experts");
  const json* e_new = find(j, "num_local_experts");
  MOESQ_CHECK(e_hub || e_new, source, ": missing key \"num_experts\" (or \"num_local_experts\")");
  if (e_hub) s.num_experts = get_int(*e_hub, "num_experts", source);
  if (e_new) {
    const int64_t v = get_int(*e_new, "num_local_experts", source);
    MOESQ_CHECK(!e_hub || v == s.num_experts, source, ": num_experts = ", s.num_experts,
                " and num_local_experts = ", v, " disagree");
    s.num_experts = v;
  }
  MOESQ_CHECK(s.num_experts > 0, source, ": num_experts must be positive, got ", s.num_experts);
  MOESQ_CHECK(s.top_k <= s.num_experts, source, ": num_experts_per_tok = ", s.top_k,
              " exceeds the number of experts ", s.num_experts);
  MOESQ_CHECK(s.num_heads % s.num_kv_heads == 0, source, ": num_attention_heads = ", s.num_heads,
              " is not a multiple of num_key_value_heads = ", s.num_kv_heads);

  // RoPE θ: hub spelling rope_theta, newer transformers rope_parameters.rope_theta.
  const json* theta_hub = find(j, "rope_theta");
  const json* rope_params = find(j, "rope_parameters");
  const json* theta_new = nullptr;
  if (rope_params) {
    check_rope_type(*rope_params, "rope_parameters", source);
    theta_new = find(*rope_params, "rope_theta");
  }
  MOESQ_CHECK(theta_hub || theta_new, source,
              ": missing key \"rope_theta\" (or \"rope_parameters.rope_theta\")");
  if (theta_hub) s.rope_theta = get_double(*theta_hub, "rope_theta", source);
  if (theta_new) {
    const double v = get_double(*theta_new, "rope_parameters.rope_theta", source);
    MOESQ_CHECK(!theta_hub || v == s.rope_theta, source, ": rope_theta = ", s.rope_theta,
                " and rope_parameters.rope_theta = ", v, " disagree");
    s.rope_theta = v;
  }
  MOESQ_CHECK(std::isfinite(s.rope_theta) && s.rope_theta > 0, source, ": rope_theta must be positive");
  if (const json* scaling = find(j, "rope_scaling")) check_rope_type(*scaling, "rope_scaling", source);

  if (const json* act = find(j, "hidden_act")) {
    MOESQ_CHECK(act->is_string() && act->get<std::string>() == "silu", source, ": hidden_act = ",
                act->dump(), " is not supported (moesq's experts are SwiGLU: silu)");
  }

  // Keys with transformers defaults.
  s.norm_topk_prob = bool_or(j, "norm_topk_prob", keys.norm_topk_prob_default, source);
  if (const json* v = find(j, "rms_norm_eps")) s.rms_norm_eps = get_double(*v, "rms_norm_eps", source);
  if (const json* v = find(j, "max_position_embeddings"))
    s.max_position_embeddings = get_int(*v, "max_position_embeddings", source);
  MOESQ_CHECK(s.rms_norm_eps > 0, source, ": rms_norm_eps must be positive");
  if (const json* v = find(j, "tie_word_embeddings")) {
    s.tie_word_embeddings = get_bool(*v, "tie_word_embeddings", source);
  }
  if (const json* v = find(j, "attention_bias")) s.attention_bias = get_bool(*v, "attention_bias", source);
  if (const json* v = find(j, "decoder_sparse_step")) {
    s.decoder_sparse_step = get_int(*v, "decoder_sparse_step", source);
  }
  MOESQ_CHECK(s.decoder_sparse_step >= 1, source, ": decoder_sparse_step must be >= 1, got ",
              s.decoder_sparse_step);
  if (const json* v = find(j, "mlp_only_layers")) {
    MOESQ_CHECK(v->is_array(), source, ": key \"mlp_only_layers\" must be a list");
    for (const json& l : *v) {
      const int64_t layer = get_int(l, "mlp_only_layers", source);
      MOESQ_CHECK(layer >= 0 && layer < s.num_layers, source, ": mlp_only_layers entry ", layer,
                  " is outside [0, ", s.num_layers, ")");
      s.mlp_only_layers.push_back(layer);
    }
  }
}

ModelSpec load_config(const std::string& config_json_path) {
  std::ifstream in(config_json_path, std::ios::binary);
  MOESQ_CHECK(in, "cannot read config file ", config_json_path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    MOESQ_FAIL(config_json_path, ": malformed JSON: ", e.what());
  }
  return parse_config(j, config_json_path);
}

void ModelSpec::check_seq_len(int64_t len, const char* flag) const {
  MOESQ_CHECK(max_position_embeddings <= 0 || len <= max_position_embeddings, flag, " ", len,
              " exceeds the model's max_position_embeddings (", max_position_embeddings, ")");
}

}  // namespace moesq::io
