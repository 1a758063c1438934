// RoPE settings of a config.json: default RoPE or YaRN (arXiv:2309.00071), read from
// `rope_parameters` (transformers >= 5, which also holds rope_theta) and/or `rope_scaling` (hub
// configs), with transformers' defaults for the optional YaRN keys. Families whose forward
// implements these (model/rope.h computes the tables) call parse_rope_config.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace moesq::io {

// RoPE frequencies: "default" (θ only) or "yarn" (transformers' _compute_yarn_parameters; paper
// arXiv:2309.00071). Read from rope_parameters (transformers ≥ 5) or rope_scaling (hub configs).
struct RopeSpec {
  std::string type = "default";  // "default" | "yarn"
  double theta = 10000.0;
  // yarn only:
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0 = not given (then max_position_embeddings)
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0 = not given
  double attention_factor = -1.0;             // < 0 = inferred (from factor, mscale, mscale_all_dim)
  bool truncate = true;
};

// Errors name `source` and the key: a RoPE type other than default/yarn, rope_parameters and
// rope_scaling of different types, disagreeing rope_theta spellings, a YaRN block without factor.
RopeSpec parse_rope_config(const nlohmann::json& j, const std::string& source);

// YaRN's magnitude correction (transformers' yarn_get_mscale): 1 for scale <= 1, else
// 0.1 · mscale · ln(scale) + 1.
double yarn_get_mscale(double scale, double mscale);

}  // namespace moesq::io
