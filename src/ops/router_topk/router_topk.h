// Launcher: routing from fp32 router logits, the two scorings of model::select_routes (model/router.h):
//  - softmax (Qwen, Mixtral, OLMoE): p = softmax(z) in fp32, top-k of p;
//  - sigmoid (DeepSeek-V3, Kimi-K2.5: transformers DeepseekV3MoE.route_tokens_to_experts): p = σ(z),
//    choice c = p + correction_bias (or p), grouped top-k: groups of E / n_group experts scored by the
//    sum of their two best c, experts outside the topk_group best groups (ties → lower group) get
//    c = 0, then top-k of c; the weights are the chosen experts' p, the sum taken + 1e-20;
//  - top-k then softmax (gpt-oss: transformers GptOssTopKRouter): top-k of z, weights = softmax over
//    the k chosen logits (exp(z_j − z_first), summed in top-k order; model/router.cpp topk_softmax_row).
// logit_bias (gpt-oss's router bias) is added to z first, in any scoring.
// Top-k in descending score, equal scores → lower expert id; weights / Σ weights (in top-k order)
// when norm_topk_prob; × routed_scaling_factor when ≠ 1. CPU twin: router_topk_ref (its ids equal
// model::select_routes's, its weights bitwise: tests/ops/test_router_topk.cpp).
// One warp per token: a token's routes never depend on the batch.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace moesq::ops {

struct RouterTopkArgs {
  const float* logits = nullptr;  // [T, E] fp32
  int32_t* topk_ids = nullptr;    // [T, k] expert ids, descending probability
  float* topk_w = nullptr;        // [T, k] combine weights
  int64_t T = 0;
  int num_experts = 0, topk = 0;  // E ≤ 512, 1 ≤ k ≤ min(E, 32)
  bool norm_topk_prob = true;
  bool sigmoid = false;                   // false: softmax scoring
  bool topk_softmax = false;              // top-k of the logits, then softmax over the k (not with sigmoid)
  const float* logit_bias = nullptr;      // [E] fp32 added to each token's logits first, or nullptr
  const float* correction_bias = nullptr; // [E] fp32 (sigmoid only), or nullptr
  int n_group = 1, topk_group = 1;        // sigmoid only: n_group ≤ 32 divides E, 1 ≤ topk_group ≤ n_group
  float routed_scaling_factor = 1.0f;
  // [E] int32 per-expert route counts, set to 0 by the routing (the act_dispatch that follows fills
  // them with counts_zeroed: one memset node fewer between two kernels of a decode graph), or nullptr.
  int32_t* counts = nullptr;
};

void router_topk(const RouterTopkArgs& args, cudaStream_t stream);
void router_topk_ref(const RouterTopkArgs& args);  // host pointers
void router_topk_check(const RouterTopkArgs& args);

}  // namespace moesq::ops
