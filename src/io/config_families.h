// The registry of architecture families whose config.json moesq reads: model_type → a parser that
// fills the family-specific ModelSpec fields. A new family adds one entry in config_families.cpp
// (and its tensor names in io/tensor_names.cpp, its mixer in model/families.cpp).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"

namespace moesq::io {

// Which keys the shared decoder fields come from (they differ between families).
struct CommonConfigKeys {
  // Routed-expert width I: Qwen "moe_intermediate_size"; Mixtral/OLMoE "intermediate_size".
  const char* expert_width = "moe_intermediate_size";
  // Qwen3-MoE requires head_dim; older families default it to hidden_size / num_attention_heads.
  bool head_dim_required = true;
  // transformers' config default of norm_topk_prob when the key is absent.
  bool norm_topk_prob_default = false;
};

// Reads the keys every supported decoder shares (sizes, heads, experts, top-k, RoPE, eps, ties,
// biases, dense-layer lists) into s. Errors name `source` and the key.
void parse_common_config(const nlohmann::json& j, const std::string& source, const CommonConfigKeys& keys,
                         ModelSpec& s);

struct ConfigFamily {
  const char* model_type;
  // Fills s (model_type already set) from j, calling parse_common_config with its keys.
  void (*parse)(const nlohmann::json& j, const std::string& source, ModelSpec& s);
};

// nullptr for a model_type moesq does not support.
const ConfigFamily* find_config_family(const std::string& model_type);
// "qwen3_moe, qwen2_moe, ..." for error messages.
std::string supported_model_types();

}  // namespace moesq::io
