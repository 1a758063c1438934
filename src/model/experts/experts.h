// Expert pieces of the hybrid and gpt-oss families:
//  - routed_combine: gather the rows of each expert, run it, and combine y[t] = Σ_j w[t,j]·y_e(x_t)
//    in ascending expert id order from zero (transformers' index_add_ loop), so the sum is bitwise
//    independent of the thread count;
//  - the gpt-oss expert (clamped SwiGLU with biases) and its fused-tensor unpacking;
//  - the sigmoid-gated shared expert of Qwen3-Next / Qwen3.5.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/qwen3_moe.h"

namespace moesq::model {

// expert(e, xe [ne, H], ne) → ye [ne, H]. Returns y [n, H].
using ExpertFn = std::function<std::vector<float>(int64_t e, const float* xe, int64_t ne)>;
std::vector<float> routed_combine(const Routes& r, int64_t E, int64_t H, const float* x, const ExpertFn& expert,
                                  int threads = 0);

// gpt-oss expert (transformers GptOssExperts), weights in PyTorch Linear layout:
//   g = x gateᵀ + b_g, u = x upᵀ + b_u;  g ← min(g, limit), u ← clamp(u, −limit, limit);
//   h = (u + 1) · g · σ(alpha · g);  y = h downᵀ + b_d.
struct BiasedExpertWeights {
  std::vector<float> gate, up;            // [I, H]
  std::vector<float> down;                // [H, I]
  std::vector<float> gate_bias, up_bias;  // [I]
  std::vector<float> down_bias;           // [H]
};
std::vector<float> clamped_swiglu_forward(const BiasedExpertWeights& w, int64_t H, int64_t I, const float* x,
                                          int64_t n, double alpha, double limit);
std::vector<float> clamped_swiglu_forward_ref(const BiasedExpertWeights& w, int64_t H, int64_t I, const float* x,
                                              int64_t n, double alpha, double limit);

// Expert e of gpt-oss's fused tensors → per-expert Linear layout. gate_up [E, H, 2I] with gate in
// the even and up in the odd columns, gate_up_bias [E, 2I] likewise, down [E, I, H], down_bias [E, H].
BiasedExpertWeights unpack_gpt_oss_expert(const std::vector<float>& gate_up, const std::vector<float>& gate_up_bias,
                                          const std::vector<float>& down, const std::vector<float>& down_bias,
                                          int64_t E, int64_t H, int64_t I, int64_t e);

// Shared expert: y = σ(x · gate_w) · SwiGLU(x), gate_w [H]; x [n, H] → y [n, H].
std::vector<float> gated_shared_expert(const ExpertWeights& w, const std::vector<float>& gate_w, int64_t H, int64_t I,
                                       const float* x, int64_t n);

}  // namespace moesq::model
