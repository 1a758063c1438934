// The shapes and the device scratch of one MoE block call (router → top-k → experts → combine) over T
// tokens with expert capacity T, and the ONE function that sizes and carves that scratch: the engine
// carves it once for max_tokens, runtime::MoeLayerGpu per forward, bench_moe_layer for its largest T.
// No CUDA here (pointer arithmetic only), so the CPU build and its tests see it too.
#pragma once
#include <cstddef>
#include <cstdint>

#include "io/config.h"

namespace moesq::runtime {

struct MoeBlockDims {
  int64_t H = 0, I = 0;          // hidden size (K of gate|up), expert width (K of down)
  int64_t E = 0, top_k = 0;      // routed experts, routes per token
  int64_t H_pad = 0, I_pad = 0;  // format::padded_k(H), format::padded_k(I)
  bool norm_topk_prob = true;
  // The router (ops::router_topk): softmax, or sigmoid with an optional correction bias, grouped top-k
  // and a routed scaling factor (DeepSeek-V3, Kimi-K2.5).
  bool sigmoid_router = false, correction_bias = false;
  int n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  // gpt-oss (transformers GptOssTopKRouter / GptOssExperts): a router logit bias, top-k then softmax over
  // the k; expert gate/up/down biases and the clamped SwiGLU (alpha, limit).
  bool topk_softmax = false, router_logit_bias = false;
  bool expert_bias = false, clamped_swiglu = false;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
  // The widest dense SwiGLU MLP of the model's layers (0: none): a shared expert
  // (shared_expert_intermediate_size, with a sigmoid gate when shared_gated) or a dense layer's MLP
  // (intermediate_size, layers outside ModelSpec::is_moe_layer).
  int64_t mlp_I = 0;
  bool shared_gated = false;
  // Expert parallelism (docs/PARALLEL.md "The expert-parallel engine"): the routed experts this rank
  // holds and runs, [expert_begin, expert_end) of E (dist::engine_expert_range); moe_block_dims sets the
  // whole layer. Every other expert's outputs arrive through the exchange (moe_block's ExpertExchange).
  int64_t expert_begin = 0, expert_end = 0;
  int64_t shard_size() const { return expert_end - expert_begin; }
  bool sharded() const { return expert_begin != 0 || expert_end != E; }
};
MoeBlockDims moe_block_dims(const io::ModelSpec& spec);

// Device scratch of one call over T tokens (capacity T), and the routes it produces.
struct MoeBlockBuffers {
  float* router_logits = nullptr;    // [T, E] fp32
  float* gemm_split = nullptr;       // ≥ gemm_bf16_split_floats(T, E, H): the router GEMM's fixed split-K, or nullptr
  int32_t* topk_ids = nullptr;       // [T, k] expert ids, descending probability
  float* topk_w = nullptr;           // [T, k] combine weights
  int32_t* slot_of_route = nullptr;  // [T, k] slot of each route in its expert (dispatch → SwiGLU, combine)
  uint16_t* xd = nullptr;            // [E, T, H_pad] bf16 dispatched rows
  float* hbuf = nullptr;             // [E, T, 2I] fp32 gate|up output
  uint16_t* ad = nullptr;            // [E, T, I_pad] bf16 SwiGLU output (down GEMM input)
  uint16_t* ybuf = nullptr;          // [E, T, H] bf16 expert outputs
  float* xs = nullptr;               // [E, T] 1/γ_a of xd
  float* as = nullptr;               // [E, T] 1/γ_a of ad
  int32_t* counts = nullptr;         // [E]
  int32_t* route_of_slot = nullptr;  // [E, T]
  float* mlp_gu = nullptr;           // [T, 2·mlp_I + 1] fp32 gate|up(|gate logit) of the dense MLP (mlp_I > 0)
  uint16_t* mlp_a = nullptr;         // [T, mlp_I] bf16 SwiGLU output (down GEMM input)
  uint16_t* mlp_a_lo = nullptr;      // [T, mlp_I] bf16 its rounding residue
  uint16_t* routes = nullptr;        // [T·k, H] bf16 route-major rows of the exchange (sharded dims only)
};

// Bytes of the scratch for up to T tokens: every buffer above, each 256-byte aligned.
size_t moe_workspace_bytes(const MoeBlockDims& d, int64_t T);
// The buffers for T tokens carved out of `base` (≥ moe_workspace_bytes(d, T) bytes, 256-byte aligned).
MoeBlockBuffers carve_moe_workspace(void* base, const MoeBlockDims& d, int64_t T);

}  // namespace moesq::runtime
