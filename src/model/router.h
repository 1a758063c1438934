// The routers of the supported families as DATA (RouterSpec, read from io::ModelSpec), one function
// that turns router logits into routes. Covers softmax routers (Qwen, Mixtral, OLMoE: softmax → top-k
// → optional renormalisation) and sigmoid routers with a selection bias and grouped top-k
// (DeepSeek-V3: transformers DeepseekV3TopkRouter / DeepseekV3MoE.route_tokens_to_experts), and
// top-k-then-softmax routers over biased logits (gpt-oss: GptOssTopKRouter; the logit bias is added by
// the caller, DecoderModel::route).
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"

namespace moesq::model {

// Top-k routing of n rows.
struct Routes {
  int64_t n = 0, k = 0;
  std::vector<int32_t> expert;  // [n, k] expert ids, descending selection score
  std::vector<float> weight;    // [n, k] combine weights
  std::vector<float> logits;    // [n, E] router logits
};

struct RouterSpec {
  int64_t num_experts = 0, top_k = 0;  // E, k
  io::RouterScoring scoring = io::RouterScoring::Softmax;
  bool correction_bias = false;   // selection on p + bias [E]; combine weights from p
  int64_t n_group = 1, topk_group = 1;  // keep experts of the topk_group best groups (score: top-2 sum)
  bool norm_topk_prob = true;     // weights / Σ weights (sigmoid: + 1e-20 in the denominator)
  double routed_scaling_factor = 1.0;
};
RouterSpec router_spec(const io::ModelSpec& s);

// logits [n, E] (moved into the result) → routes. Softmax: p = softmax(z) in fp32, top-k of p
// (equal scores → lower expert id), p_topk / Σ p_topk when norm_topk_prob. Sigmoid: p = σ(z),
// choice c = p + bias (bias [E] or nullptr), groups of E/n_group experts scored by the sum of their two
// best c, experts outside the topk_group best groups get c = 0, top-k of c, weights p of the chosen,
// renormalised when norm_topk_prob. TopkSoftmax: top-k of z itself, weights = softmax over those k
// logits (norm_topk_prob and routed_scaling_factor do not apply). Weights × routed_scaling_factor last. Errors: k ∉ [1, E], groups
// that do not divide E, a bias required but missing.
Routes select_routes(const RouterSpec& rs, std::vector<float> logits, int64_t n, const float* bias);

}  // namespace moesq::model
