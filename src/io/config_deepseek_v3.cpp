// config.json → DeepseekV3Spec. The non-obvious decisions: the MLA head dims must be consistent
// with the optional `head_dim` / `qk_head_dim` keys (transformers sets head_dim = qk_rope_head_dim
// and derives qk_head_dim; a config that says otherwise is ambiguous, so it is an error rather than
// a silent pick); and settings that change the arithmetic but that the forward does not implement
// (another scoring function, a non-grouped top-k method, MoE every n-th layer) are refused by name
// instead of being read and ignored.
#include "io/config_deepseek_v3.h"

#include <cmath>

#include "core/error.h"
#include "io/config_keys.h"

namespace moesq::io {

namespace {

using nlohmann::json;
using namespace config_keys;

int64_t require_at_least(const json& j, const char* key, const std::string& src, int64_t min_value) {
  const int64_t x = require_int(j, key, src);
  MOESQ_CHECK(x >= min_value, src, ": key \"", key, "\" must be >= ", min_value, ", got ", x);
  return x;
}

int64_t int_or(const json& j, const char* key, int64_t fallback, const std::string& src) {
  const json* v = find(j, key);
  return v ? get_int(*v, key, src) : fallback;
}

double double_or(const json& j, const char* key, double fallback, const std::string& src) {
  const json* v = find(j, key);
  return v ? get_double(*v, key, src) : fallback;
}

}  // namespace

bool is_deepseek_v3_model_type(const std::string& t) { return t == "deepseek_v3" || t == "kimi_k2"; }

double DeepseekV3Spec::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.type != "default" && rope.mscale_all_dim != 0) {
    const double m = yarn_get_mscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

DeepseekV3Spec parse_deepseek_v3_config(const json& j, const std::string& src) {
  MOESQ_CHECK(j.is_object(), src, ": config is not a JSON object");
  DeepseekV3Spec s;
  const json* mt = find(j, "model_type");
  MOESQ_CHECK(mt, src, ": missing key \"model_type\"");
  s.model_type = get_string(*mt, "model_type", src);
  MOESQ_CHECK(is_deepseek_v3_model_type(s.model_type), src, ": model_type \"", s.model_type,
              "\" is not deepseek_v3 / kimi_k2");

  s.vocab_size = require_at_least(j, "vocab_size", src, 1);
  s.hidden_size = require_at_least(j, "hidden_size", src, 1);
  s.intermediate_size = require_at_least(j, "intermediate_size", src, 1);
  s.moe_intermediate_size = require_at_least(j, "moe_intermediate_size", src, 1);
  s.num_layers = require_at_least(j, "num_hidden_layers", src, 1);
  s.num_heads = require_at_least(j, "num_attention_heads", src, 1);
  const int64_t nkv = int_or(j, "num_key_value_heads", s.num_heads, src);
  MOESQ_CHECK(nkv == s.num_heads, src, ": num_key_value_heads = ", nkv, " differs from num_attention_heads = ",
              s.num_heads, " (multi-head latent attention expands k and v to every head)");

  // MLA ranks and head dims. q_lora_rank must be present; null means no q LoRA (q_proj).
  MOESQ_CHECK(j.contains("q_lora_rank"), src, ": missing key \"q_lora_rank\" (null for a plain q_proj)");
  if (const json* q = find(j, "q_lora_rank")) {
    s.q_lora_rank = get_int(*q, "q_lora_rank", src);
    MOESQ_CHECK(s.q_lora_rank > 0, src, ": q_lora_rank must be positive or null, got ", s.q_lora_rank);
  }
  s.kv_lora_rank = require_at_least(j, "kv_lora_rank", src, 1);
  s.qk_nope_head_dim = require_at_least(j, "qk_nope_head_dim", src, 0);
  s.qk_rope_head_dim = require_at_least(j, "qk_rope_head_dim", src, 2);
  s.v_head_dim = require_at_least(j, "v_head_dim", src, 1);
  MOESQ_CHECK(s.qk_rope_head_dim % 2 == 0, src, ": qk_rope_head_dim ", s.qk_rope_head_dim, " must be even (RoPE)");
  if (const json* v = find(j, "head_dim")) {
    const int64_t hd = get_int(*v, "head_dim", src);
    MOESQ_CHECK(hd == s.qk_rope_head_dim, src, ": head_dim = ", hd, " differs from qk_rope_head_dim = ",
                s.qk_rope_head_dim, " (deepseek_v3 rotates qk_rope_head_dim dims)");
  }
  if (const json* v = find(j, "qk_head_dim")) {
    const int64_t qk = get_int(*v, "qk_head_dim", src);
    MOESQ_CHECK(qk == s.qk_head_dim(), src, ": qk_head_dim = ", qk, " is not qk_nope_head_dim + qk_rope_head_dim = ",
                s.qk_head_dim());
  }
  s.rope = parse_rope_config(j, src);
  s.rope_interleave = bool_or(j, "rope_interleave", true, src);
  s.max_position_embeddings = int_or(j, "max_position_embeddings", 0, src);
  if (s.rope.type == "yarn" && s.rope.original_max_position_embeddings > 0)
    MOESQ_CHECK(s.max_position_embeddings > 0, src,
                ": YaRN with original_max_position_embeddings needs max_position_embeddings");

  // Routing.
  s.n_routed_experts = require_at_least(j, "n_routed_experts", src, 1);
  s.n_shared_experts = require_at_least(j, "n_shared_experts", src, 0);
  s.top_k = require_at_least(j, "num_experts_per_tok", src, 1);
  s.n_group = require_at_least(j, "n_group", src, 1);
  s.topk_group = require_at_least(j, "topk_group", src, 1);
  MOESQ_CHECK(s.n_routed_experts % s.n_group == 0, src, ": n_routed_experts = ", s.n_routed_experts,
              " is not a multiple of n_group = ", s.n_group);
  MOESQ_CHECK(s.n_routed_experts / s.n_group >= 2, src, ": groups of ", s.n_routed_experts / s.n_group,
              " expert(s): the group score is the sum of the top 2, so a group needs >= 2 experts");
  MOESQ_CHECK(s.topk_group <= s.n_group, src, ": topk_group = ", s.topk_group, " exceeds n_group = ", s.n_group);
  MOESQ_CHECK(s.top_k <= s.topk_group * (s.n_routed_experts / s.n_group), src, ": num_experts_per_tok = ", s.top_k,
              " exceeds the experts of topk_group = ", s.topk_group, " groups");
  const json* rsf = find(j, "routed_scaling_factor");
  MOESQ_CHECK(rsf, src, ": missing key \"routed_scaling_factor\"");
  s.routed_scaling_factor = get_double(*rsf, "routed_scaling_factor", src);
  MOESQ_CHECK(std::isfinite(s.routed_scaling_factor), src, ": routed_scaling_factor must be finite");
  s.first_k_dense_replace = require_at_least(j, "first_k_dense_replace", src, 0);
  s.norm_topk_prob = bool_or(j, "norm_topk_prob", true, src);
  for (auto [key, want] : {std::pair{"scoring_func", "sigmoid"}, std::pair{"topk_method", "noaux_tc"},
                           std::pair{"hidden_act", "silu"}}) {
    if (const json* v = find(j, key))
      MOESQ_CHECK(get_string(*v, key, src) == want, src, ": ", key, " = ", v->dump(),
                  " is not supported (deepseek_v3 forward: ", want, ")");
  }
  if (const json* v = find(j, "moe_layer_freq"))
    MOESQ_CHECK(get_int(*v, "moe_layer_freq", src) == 1, src, ": moe_layer_freq = ", v->dump(),
                " is not supported (transformers' DeepseekV3 makes every layer >= first_k_dense_replace MoE)");

  s.rms_norm_eps = double_or(j, "rms_norm_eps", 1e-6, src);
  MOESQ_CHECK(s.rms_norm_eps > 0, src, ": rms_norm_eps must be positive");
  s.attention_bias = bool_or(j, "attention_bias", false, src);
  s.tie_word_embeddings = bool_or(j, "tie_word_embeddings", false, src);
  return s;
}

void fill_model_spec(const DeepseekV3Spec& d, ModelSpec& s) {
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
  s.attention_bias = d.attention_bias;  // the MLA projections' biases (the mixer reads them)
  s.first_k_dense_replace = d.first_k_dense_replace;
  s.qk_norm = QkNorm::None;  // MLA normalises the latents instead (the mixer owns that)
  s.router_scoring = RouterScoring::Sigmoid;
  s.router_correction_bias = true;
  s.n_group = d.n_group;
  s.topk_group = d.topk_group;
  s.routed_scaling_factor = d.routed_scaling_factor;
  s.num_shared_experts = d.n_shared_experts;
  s.shared_expert_intermediate_size = d.moe_intermediate_size * d.n_shared_experts;
  s.shared_expert_gate = false;
  s.mla.q_lora_rank = d.q_lora_rank;
  s.mla.kv_lora_rank = d.kv_lora_rank;
  s.mla.qk_nope_head_dim = d.qk_nope_head_dim;
  s.mla.qk_rope_head_dim = d.qk_rope_head_dim;
  s.mla.v_head_dim = d.v_head_dim;
  s.mla.rope_interleave = d.rope_interleave;
  s.mla.rope = d.rope;
  s.mla.softmax_scale = d.softmax_scale();
}

}  // namespace moesq::io
