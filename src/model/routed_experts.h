// The routed-expert stage of an MoE layer on explicit weights, any family: y[t] = Σ_j w[t,j] ·
// E_{e_j}(x_t), each expert a SwiGLU (model::swiglu_forward, with ForwardOptions' W4A4 activation
// quantization). Same contract as Qwen3Moe::moe_block: experts run in parallel on gathered rows,
// then ONE serial pass adds their weighted outputs per token in ascending expert id order starting
// from zero (transformers' index_add_ loop), so the bits do not depend on the thread count.
#pragma once
#include <cstdint>
#include <vector>

#include "model/qwen3_moe.h"  // ExpertWeights, Routes, ForwardOptions

namespace moesq::model {

// experts [E] (gate/up [I, H], down [H, I]); x [n, H]; r: n = x rows, expert ids in [0, E).
// Returns y [n, H]. `layer` only names the layer in errors.
std::vector<float> routed_experts_forward(const std::vector<ExpertWeights>& experts, int64_t H, int64_t I,
                                          const std::vector<float>& x, const Routes& r, const ForwardOptions& fo,
                                          int64_t layer);
// Plain twin: every route computed on its own row with plain loops (no gathering, no BLAS, serial).
std::vector<float> routed_experts_forward_ref(const std::vector<ExpertWeights>& experts, int64_t H, int64_t I,
                                              const std::vector<float>& x, const Routes& r, const ForwardOptions& fo,
                                              int64_t layer);

}  // namespace moesq::model
