// The DeepSeek-V3 router ("noaux_tc", DeepSeek-V3 §2.1.2 Eq. 15–16; transformers'
// DeepseekV3TopkRouter), on router logits z = x · W_gᵀ [n, E]:
//
//   s_e      = sigmoid(z_e)                                  affinity, used for the weights
//   b_e      = s_e + e_score_correction_bias_e                used for the CHOICE only
//   group g  = experts [g·E/G, (g+1)·E/G); score_g = sum of the 2 largest b_e in g
//   keep the topk_group groups of largest score_g; top-k of b_e over the kept experts
//   w_e      = s_e / (Σ_selected s + 1e-20) if norm_topk_prob, else s_e;  w_e *= routed_scaling_factor
//
// Experts outside the kept groups can never be chosen (masked to -inf, as DeepSeek's reference
// code does; transformers' native port masks to 0.0, which differs only when a kept expert's
// biased score is negative — then transformers may pick an expert of a dropped group).
#pragma once
#include <cstdint>
#include <vector>

#include "model/qwen3_moe.h"  // model::Routes

namespace moesq::model {

struct GroupedTopkParams {
  int64_t num_experts = 0;  // E
  int64_t top_k = 0;        // k
  int64_t n_group = 1;      // G (E % G == 0, E / G >= 2)
  int64_t topk_group = 1;   // groups kept
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// logits [n, E], correction_bias [E] (empty = zeros) → Routes: expert [n, k] in descending biased
// score (ties: lower id first), weight [n, k] as above, logits copied. Errors name the bad parameter.
Routes sigmoid_grouped_topk(const GroupedTopkParams& p, const float* logits, int64_t n,
                            const std::vector<float>& correction_bias);
// Plain twin: a literal transcription of the reference steps (full sorts, explicit group mask).
Routes sigmoid_grouped_topk_ref(const GroupedTopkParams& p, const float* logits, int64_t n,
                                const std::vector<float>& correction_bias);

}  // namespace moesq::model
