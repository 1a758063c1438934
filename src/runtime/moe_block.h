// The routed-expert block of one MoE layer on the GPU: router GEMM (fp32 logits) → softmax / top-k /
// renorm → dispatch (+ NVFP4 act quant) → gate|up grouped GEMM → SwiGLU (+ requant) → down grouped
// GEMM → combine in ascending expert order into the fp32 residual h. `moe_block` is the sequence of
// launches runtime::Engine runs per layer; `MoeLayerGpu` runs it alone for one layer of a checkpoint
// (the Python moesq.MoeLayer). Plain C++ interface, every launch on the caller's stream.
//
// Non-obvious decision: capacity = T (top-k ids of a token are distinct, so an expert receives at most
// one route per token): no route is ever dropped and the host never reads the device-side counts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/cuda/stream.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "runtime/backend.h"
#include "runtime/weights.h"

namespace moesq::runtime {

struct MoeBlockDims {
  int64_t H = 0, I = 0;          // hidden size (K of gate|up), expert width (K of down)
  int64_t E = 0, top_k = 0;      // routed experts, routes per token
  int64_t H_pad = 0, I_pad = 0;  // format::padded_k(H), format::padded_k(I)
  bool norm_topk_prob = true;
};
MoeBlockDims moe_block_dims(const io::ModelSpec& spec);

// Device pointers of one layer's router and experts (which are read depends on `backend`).
struct MoeBlockWeights {
  ExpertBackend backend = ExpertBackend::kBf16;  // kBf16 | kSparseW4A4 | kSparseW4A16
  const uint16_t* router = nullptr;              // [E, H] bf16
  const uint16_t* gu_dense = nullptr;            // kBf16: [E, 2I, H_pad] bf16, K in kKMajor order
  const uint16_t* down_dense = nullptr;          // kBf16: [E, H, I_pad] bf16, K in kKMajor order
  const uint8_t* gu_sparse = nullptr;            // sparse: [E, gu_M_pad/16, H_pad/256, 1408] kernel layout, M = 2I
  const uint8_t* down_sparse = nullptr;          // sparse: [E, down_M_pad/16, I_pad/256, 1408], M = H
  const float* gu_inv_gamma = nullptr;           // sparse: [E] 1/γ_w of gate|up
  const float* down_inv_gamma = nullptr;         // sparse: [E] 1/γ_w of down
  int64_t gu_M_pad = 0, down_M_pad = 0;
};

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
};

// The stages of moe_block in launch order, one bit each (bench_moe_layer times them one by one).
enum MoeStage : unsigned {
  kMoeRouterGemm = 1u << 0, kMoeTopk = 1u << 1, kMoeDispatch = 1u << 2, kMoeGateUp = 1u << 3,
  kMoeSwiglu = 1u << 4, kMoeDown = 1u << 5, kMoeCombine = 1u << 6,
};
constexpr int kMoeStageCount = 7;
constexpr unsigned kMoeAllStages = (1u << kMoeStageCount) - 1;
inline constexpr const char* kMoeStageNames[kMoeStageCount] = {
    "router GEMM", "top-k", "dispatch + act quant", "gate|up GEMM", "SwiGLU + requant", "down GEMM", "combine"};

// The router GEMM's runner (runtime::Engine: cuBLAS when not deterministic); empty: ops::gemm_bf16.
using LinearFn = std::function<void(const ops::GemmBf16Args&)>;

// h [T, H] fp32 += Σ_j topk_w[t, j] · expert_{topk_ids[t, j]}(x[t]) for x = x + x_lo ([T, H] bf16 each;
// x_lo may be nullptr). x_lo feeds the router GEMM (hi + lo) and, with W4A4, the activation quantizer
// (the fp32 row), as the engine's rmsnorm output does. T == 0: nothing. `stages` (MoeStage bits): only
// those launches — a stage alone re-runs on what the buffers hold from an earlier full block (for
// timing; the result is the full block's only when every stage runs). Errors: the launchers' checks.
void moe_block(const MoeBlockDims& d, const MoeBlockWeights& w, const MoeBlockBuffers& b, const uint16_t* x,
               const uint16_t* x_lo, float* h, int64_t T, cudaStream_t stream, const LinearFn& router_linear = {},
               unsigned stages = kMoeAllStages);

// One MoE layer of a checkpoint on one GPU: weights uploaded once (synchronously) to `device`, each
// forward allocates its scratch stream-ordered (cudaMallocAsync / cudaFreeAsync on the caller's stream),
// so forwards on different streams may overlap. The router GEMM uses the engine's fixed split-K, so
// results are the engine's bits for the same layer input.
class MoeLayerGpu {
 public:
  MoeLayerGpu(const HostMoeLayer& host, int device);
  ~MoeLayerGpu();
  MoeLayerGpu(const MoeLayerGpu&) = delete;
  MoeLayerGpu& operator=(const MoeLayerGpu&) = delete;

  // h [T, H] fp32 device memory: h = MoE(x) (accumulate false: zeroed first) or h += MoE(x). topk_ids
  // [T, k] int32 and topk_w [T, k] fp32 device outputs, or nullptr. All on `stream` of `device()`.
  void forward(const uint16_t* x, const uint16_t* x_lo, int64_t T, float* h, bool accumulate, int32_t* topk_ids,
               float* topk_w, cudaStream_t stream) const;
  const MoeBlockDims& dims() const;
  int device() const;
  size_t weight_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesq::runtime
