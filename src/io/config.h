// HF config.json → ModelSpec for the qwen3_moe family.
// Accepts both key spellings found in the wild (DESIGN.md §7): `num_experts` (hub) or
// `num_local_experts` (newer transformers), `rope_theta` or `rope_parameters.rope_theta`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moesq::io {

struct ModelSpec {
  std::string model_type;  // "qwen3_moe"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;            // H
  int64_t intermediate_size = 0;      // dense MLP width (mlp_only_layers)
  int64_t moe_intermediate_size = 0;  // I, expert width
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_experts = 0;  // E
  int64_t top_k = 0;        // k
  bool norm_topk_prob = true;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 0;  // longest trained context; 0 = not given (no check)
  bool tie_word_embeddings = false;   // true: lm_head IS embed_tokens (an lm_head.weight is ignored)
  bool attention_bias = false;        // true: q/k/v/o_proj carry a .bias [N]: y = x Wᵀ + b
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  bool is_moe_layer(int64_t layer) const;
  // Error naming `flag` when a sequence of `len` tokens exceeds max_position_embeddings (RoPE
  // positions the model never saw: the numbers would be meaningless).
  void check_seq_len(int64_t len, const char* flag) const;
};

// Throws Error naming `source` and the key for unknown architectures or missing/invalid keys.
ModelSpec parse_config(const nlohmann::json& j, const std::string& source);
ModelSpec load_config(const std::string& config_json_path);

}  // namespace moesq::io
