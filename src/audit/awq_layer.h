// One packed-AWQ MoE layer on the explicit-schedule path, with its four captured surfaces:
//   W13 out    [M·k, 2I] fp16  = A·W13ᵀ per route (gate | up concatenated along N, vLLM's w13)
//   activation [M·k, I]  fp16  = SiLU(gate)·up, computed in fp32, rounded once
//   W2 out     [M·k, H]  fp16  = activation·W2ᵀ per route (routed, not yet weighted)
//   final      [M, H]    fp16  = Σ_slot w[t, slot] · W2out[t·k + slot], fp32 in slot order, rounded once
// Both GEMMs share the alignment plan and use schedules of the same kind and grid.
// The one non-obvious decision: the layer takes the GEMM as a function (CPU `_ref` or the CUDA kernel)
// so the audit runs the same layer code on both backends and only the GEMM arithmetic differs.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/route_align/route_align.h"
#include "format/awq_int4.h"
#include "ops/awq_gemm/awq_gemm.h"
#include "ops/awq_gemm/awq_schedule.h"

namespace moesq::audit {

struct AwqMoeWeights {
  int num_experts = 0;
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  std::vector<format::AwqLinear> w13;  // [E] each [2I, H]; an empty entry = expert not loaded
  std::vector<format::AwqLinear> w2;   // [E] each [H, I]
};

// Synthetic weights from a fixed seed, generated for the experts in `experts` only (the others stay
// empty; an expert's weights depend only on (seed, expert), never on which others are loaded).
// Scales are chosen so W13/W2 outputs are O(1) in fp16 at the Qwen3 shapes.
AwqMoeWeights make_synthetic_awq_moe(int num_experts, int64_t hidden, int64_t intermediate, uint64_t seed,
                                     const std::vector<int32_t>& experts);
// Quantizes float experts (gate [E][I, H], up [E][I, H], down [E][H, I], PyTorch layout) to AWQ.
AwqMoeWeights quantize_awq_moe(const std::vector<std::vector<float>>& gate, const std::vector<std::vector<float>>& up,
                               const std::vector<std::vector<float>>& down, int64_t hidden, int64_t intermediate);

// Random fp16 activations in [-1, 1) from a seed. [M, H]
std::vector<uint16_t> make_random_f16(int64_t rows, int64_t cols, uint64_t seed);

struct Surface {
  std::string name;             // "w13_out" | "activation" | "w2_out" | "final"
  std::vector<int64_t> shape;
  std::vector<uint16_t> data;   // fp16 bits, row-major
  std::string sha256() const;   // of the raw little-endian bytes
};
struct LayerSurfaces {
  std::vector<Surface> surfaces;  // in the order above
  const Surface& get(const std::string& name) const;  // Error names the surface
};

using AwqGemmFn = std::function<void(const ops::AwqMoeGemmDesc&)>;

struct LayerRunSpec {
  ops::ScheduleKind schedule = ops::ScheduleKind::Native;
  int64_t grid = 246;
  ops::ThreadConfigOverrides overrides;
  int default_blocks_per_sm = 3;
};

// The two schedules the layer will use (W13 then W2).
std::pair<ops::TileSchedule, ops::TileSchedule> layer_schedules(const AwqMoeWeights& w, const ops::RouteAlignment& a,
                                                      const LayerRunSpec& spec);

// x [M, H] fp16, topk_weights [M, k]; `gemm` defaults to awq_moe_gemm_ref.
LayerSurfaces run_awq_moe_layer(const std::vector<uint16_t>& x, const std::vector<float>& topk_weights,
                                const ops::RouteAlignment& a, const AwqMoeWeights& w, const LayerRunSpec& spec,
                                const AwqGemmFn& gemm = ops::awq_moe_gemm_ref);

}  // namespace moesq::audit
