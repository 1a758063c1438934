// One layer's feed-forward on the device (moe_block.h): router, routed experts and shared expert of a
// MoE layer, or a dense layer's MLP alone (no router, no experts): the engine's per-layer MoE
// weights and runtime::MoeLayerGpu's, uploaded from a HostMoe or drawn synthetically, one type for both.
#pragma once
#include <memory>

#include "core/cuda/dev_buf.cuh"
#include "runtime/layers/moe_block.h"

namespace moesq::runtime {

struct DeviceMoeLayer {
  DevBuf<uint16_t> router;                 // [E, H] bf16
  DevBuf<float> correction_bias;           // [E] fp32 (sigmoid routers with a correction bias), else empty
  DevBuf<float> router_logit_bias;         // [E] fp32 (gpt-oss), else empty
  DevBuf<float> expert_gate_up_bias;       // [E, 2I] fp32 (gpt-oss: HostMoe's order), else empty
  DevBuf<float> expert_down_bias;          // [E, H] fp32 (gpt-oss), else empty
  // The layer's dense MLP (shared expert, or a dense layer's whole MLP; mlp_I 0: none): HostDenseMlp's.
  DevBuf<uint16_t> mlp_gate_up, mlp_down;
  int64_t mlp_I = 0;
  bool mlp_gated = false;
  std::unique_ptr<DeviceExperts> experts;  // of the backend that uploaded them
  // [1] int32, 0 between forwards: the router GEMM's ticket when it runs the top-k itself
  // (GemmBf16Args::fused_topk); one forward of the layer at a time.
  DevBuf<int32_t> topk_ticket;

  // Uploads `host` (loaded for `backend`) synchronously to the current device: its routed experts
  // [d.expert_begin, d.expert_end) (the whole layer, or an expert-parallel shard), everything else whole.
  void upload(const HostMoe& host, ExpertBackend backend, const MoeBlockDims& d);
  // The router (bf16 noise of std ≈ scale) and `backend`'s experts of d's shapes drawn on the current
  // device on `stream`, one seed per tensor from next_seed (router first).
  void synthesize(const MoeBlockDims& d, ExpertBackend backend, const SeedFn& next_seed, float scale,
                  cudaStream_t stream);
  // The dense MLP alone, I wide (a shared expert beside synthesize's experts, or a dense layer's MLP):
  // gate|up [2I (+1 gated), H] then down [H, I], bf16 noise of std ≈ scale, one seed each.
  void synthesize_mlp(int64_t H, int64_t I, bool gated, const SeedFn& next_seed, float scale, cudaStream_t stream);
  size_t bytes() const {
    return router.bytes() + correction_bias.bytes() + router_logit_bias.bytes() + expert_gate_up_bias.bytes() +
           expert_down_bias.bytes() + mlp_gate_up.bytes() + mlp_down.bytes() + topk_ticket.bytes() +
           (experts ? experts->bytes() : 0);
  }
};

}  // namespace moesq::runtime
