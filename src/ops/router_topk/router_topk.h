// Launcher: Qwen3-MoE routing from fp32 router logits: p = softmax(z) in fp32, top-k of p
// (descending; equal probabilities → lower expert id, as model::DecoderModel::route), weights
// p_j / Σ_j p_j when norm_topk_prob (the sum in top-k order). CPU twin: router_topk_ref.
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
};

void router_topk(const RouterTopkArgs& args, cudaStream_t stream);
void router_topk_ref(const RouterTopkArgs& args);  // host pointers
void router_topk_check(const RouterTopkArgs& args);

}  // namespace moesq::ops
