// The router of FamilyModel's hybrid families, on n rows x [n, H] → model::Routes (expert ids [n, k] by
// descending score, ties to the lower id; combine weights [n, k]; logits [n, E]):
//   softmax_topk (Qwen3-Next, Qwen3.5; also Qwen3-MoE): p = softmax(x Wᵀ) in fp32, top-k of p,
//     p_topk / Σ p_topk when renormalize.
// (gpt-oss's top-k-then-softmax router is model/router.h's RouterScoring::TopkSoftmax.)
// It has a plain-loop `_ref` twin (no BLAS) with the same selection rule.
#pragma once
#include <cstdint>
#include <vector>

#include "model/qwen3_moe.h"

namespace moesq::model {

// W [E, H]. Errors: k not in [1, E], size mismatches.
Routes softmax_topk_route(const std::vector<float>& W, int64_t E, int64_t H, const float* x, int64_t n, int64_t k,
                          bool renormalize);
Routes softmax_topk_route_ref(const std::vector<float>& W, int64_t E, int64_t H, const float* x, int64_t n,
                              int64_t k, bool renormalize);

}  // namespace moesq::model
