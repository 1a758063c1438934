// Expert pieces of the hybrid and gpt-oss families:
//  - routed_combine: gather the rows of each expert, run it, and combine y[t] = Σ_j w[t,j]·y_e(x_t)
//    in ascending expert id order from zero (transformers' index_add_ loop), so the sum is bitwise
//    independent of the thread count;
//  - gpt-oss's fused expert tensors unpacked into per-expert Linear layout (the expert itself is
//    model::swiglu_forward with an ExpertVariant: biases, clamped SwiGLU);
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

// Expert e of the fused gpt-oss tensors (transformers GptOssExperts) → Linear layout in w.
// gate_up [E, H, 2I] with gate in the even and up in the odd columns (null: leave w.gate / w.up),
// gate_up_bias [E, 2I] interleaved likewise → w.gate [I, H], w.up [I, H], w.gate_bias, w.up_bias [I];
// down [E, I, H] (null: leave w.down) → w.down [H, I], down_bias [E, H] → w.down_bias [H].
void unpack_fused_gate_up(const float* gate_up, const float* gate_up_bias, int64_t E, int64_t H, int64_t I, int64_t e,
                          ExpertWeights& w);
void unpack_fused_down(const float* down, const float* down_bias, int64_t E, int64_t H, int64_t I, int64_t e,
                       ExpertWeights& w);

// Shared expert: y = σ(x · gate_w) · SwiGLU(x), gate_w [H]; x [n, H] → y [n, H].
std::vector<float> gated_shared_expert(const ExpertWeights& w, const std::vector<float>& gate_w, int64_t H, int64_t I,
                                       const float* x, int64_t n);

}  // namespace moesq::model
