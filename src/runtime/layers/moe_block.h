// The routed-expert block of one MoE layer on the GPU: router GEMM (fp32 logits) → softmax / top-k /
// renorm → the expert stage of the layer's backend (experts/expert_backend.h: dispatch (+ NVFP4 act
// quant) → gate|up → SwiGLU (+ requant) → down) → combine in ascending expert order into the fp32
// residual h. `moe_block` is the sequence of launches runtime::Engine runs per layer; `MoeLayerGpu` runs
// it alone for one layer of a checkpoint (the Python moesq.MoeLayer); both hold the layer as ONE
// DeviceMoeLayer (moe_block_device.cuh) and size their scratch with moe_workspace_bytes. Plain C++
// interface (no CUDA headers), every launch on the caller's stream.
//
// Non-obvious decision: capacity = T (top-k ids of a token are distinct, so an expert receives at most
// one route per token): no route is ever dropped and the host never reads the device-side counts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/stream.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "runtime/backend.h"
#include "runtime/experts/expert_backend.h"
#include "runtime/layers/moe_workspace.h"

namespace moesq::runtime {

// Why the MoE block cannot run layers of `spec`'s family ("" when it can): a softmax router, a
// sigmoid one with correction bias, grouped top-k and scaling (DeepSeek-V3 / Kimi-K2.5), or gpt-oss's
// top-k-then-softmax router with a logit bias; plain SwiGLU experts, or gpt-oss's with biases and the
// clamped SwiGLU; a shared expert with or without its sigmoid gate.
// A dense MLP layer runs as the block with its MLP alone (no router, no routed experts).
// Dense MLP layers are a per-layer question (ModelSpec::is_moe_layer), not the block's.
std::string moe_block_refusal(const io::ModelSpec& spec);

// One MoE layer's router and routed experts in host memory, in the layout of `backend`'s kernels.
// A dense SwiGLU MLP in bf16: a shared expert or a dense layer's MLP. Empty gate_up: none.
struct HostDenseMlp {
  int64_t I = 0;                   // intermediate size
  bool gated = false;              // a shared expert's sigmoid gate [1, H] (Qwen2-MoE, Qwen3-Next)
  std::vector<uint16_t> gate_up;   // [2I (+1 gated), H] bf16: the gate rows, the up rows, then the gate's row
  std::vector<uint16_t> down;      // [H, I] bf16
};

// One layer's feed-forward in host memory: the router and routed experts of a MoE layer, in the
// layout of `backend`'s kernels, and its shared expert; or a dense layer's MLP alone (router empty,
// experts null).
struct HostMoe {
  std::vector<uint16_t> router;         // [E, H] bf16
  std::vector<float> correction_bias;   // [E] fp32 e_score_correction_bias (sigmoid routers), or empty
  std::vector<float> router_logit_bias; // [E] fp32 router bias (gpt-oss), or empty
  // gpt-oss's expert biases (MoeBlockDims::expert_bias), or empty: [E, 2I] fp32 (expert e's gate bias
  // [I], then its up bias [I]: the gate|up GEMM's column order) and [E, H] fp32.
  std::vector<float> expert_gate_up_bias, expert_down_bias;
  std::unique_ptr<HostExperts> experts;  // experts/<backend>.h
  HostDenseMlp mlp;                      // the shared expert (MoE layer) or the dense MLP (dense layer)
};
// Reads MoE layer `layer` through io's tensor names (io/tensor_names.h) for a resolved backend: its
// routed experts [expert_begin, expert_end) (an expert-parallel rank's shard; (0, 0): all), everything
// else whole.
HostMoe load_host_moe(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, ExpertBackend backend,
                      int64_t layer, int64_t expert_begin = 0, int64_t expert_end = 0);
// Reads dense layer `layer`'s MLP ("mlp.{gate,up,down}_proj", intermediate_size). Errors name the tensor.
HostMoe load_host_dense_layer(const io::Checkpoint& ckpt, int64_t layer);

// The stages of moe_block in launch order, one bit each (bench_moe_layer times them one by one).
enum MoeStage : unsigned {
  kMoeRouterGemm = 1u << 0, kMoeTopk = 1u << 1, kMoeDispatch = 1u << 2, kMoeGateUp = 1u << 3,
  kMoeSwiglu = 1u << 4, kMoeDown = 1u << 5, kMoeCombine = 1u << 6, kMoeDenseMlp = 1u << 7,
};
constexpr int kMoeStageCount = 8;
constexpr unsigned kMoeAllStages = (1u << kMoeStageCount) - 1;
inline constexpr const char* kMoeStageNames[kMoeStageCount] = {
    "router GEMM", "top-k", "dispatch + act quant", "gate|up GEMM", "SwiGLU + requant", "down GEMM", "combine",
    "shared / dense MLP"};

// The router GEMM's runner (runtime::Engine: cuBLAS when not deterministic); empty: ops::gemm_bf16.
using LinearFn = std::function<void(const ops::GemmBf16Args&)>;

struct DeviceMoeLayer;  // moe_block_device.cuh

// Expert parallelism (docs/PARALLEL.md "The expert-parallel engine"): with d.sharded(), this rank's
// block runs the GEMMs of its experts [d.expert_begin, d.expert_end) only, packs their routes' outputs
// route-major (ops::route_rows), and all_reduce_sum(words, count, stream) must leave in `words` (count
// uint32 words, device memory) their integer sum over the ranks, which every rank calls in the same
// order on the same shapes; the block then unpacks the rows and combines as on one GPU, so h gets the
// one-GPU bits. capturable: whether the call may be captured in a CUDA graph (an NCCL all-reduce: yes;
// an exchange staged through host memory, host_staged_exchange: no, and the engine then decodes
// without graphs).
struct ExpertExchange {
  std::function<void(uint32_t* words, int64_t count, cudaStream_t stream)> all_reduce_sum;
  bool capturable = false;
};

// An exchange through host memory: copies the words to the host (synchronizing `stream`), calls
// host_sum(words, count) (which must sum them over the ranks in place, e.g. an MPI allgather summed in
// rank order), copies them back. Not capturable. For 2 ranks on one GPU (NCCL refuses two ranks on
// one device) and hosts without NCCL.
ExpertExchange host_staged_exchange(std::function<void(uint32_t* words, int64_t count)> host_sum);

// h [T, H] fp32 += Σ_j topk_w[t, j] · expert_{topk_ids[t, j]}(x[t]) (routes: ops::router_topk of d's router),
// then += the layer's dense MLP (a shared expert, × σ(x · gate) when gated: gate|up GEMM, ops::dense_swiglu,
// down GEMM accumulated into h); a dense layer has the MLP term alone. for x = x + x_lo ([T, H] bf16 each;
// x_lo may be nullptr). x_lo feeds the router GEMM (hi + lo) and, with W4A4, the activation quantizer
// (the fp32 row), as the engine's rmsnorm output does. T == 0: nothing. `stages` (MoeStage bits): only
// those launches — a stage alone re-runs on what the buffers hold from an earlier full block (for
// timing; the result is the full block's only when every stage runs). next_norm (host pointer, its x
// = h, n = T, D = H), or nullptr: the norm of h's rows that follows the block (the next layer's input
// norm), run by the combine kernel where the combine is the block's last write of h (experts, no
// dense MLP: MoeCombineArgs::fused_norm); returns whether it ran (else the caller runs it). Errors:
// the launchers' checks.
bool moe_block(const MoeBlockDims& d, const DeviceMoeLayer& w, const MoeBlockBuffers& b, const uint16_t* x,
               const uint16_t* x_lo, float* h, int64_t T, cudaStream_t stream, const LinearFn& router_linear = {},
               unsigned stages = kMoeAllStages, const ExpertExchange* exchange = nullptr,
               const ops::RmsNormArgs* next_norm = nullptr);

struct HostMoeLayer;  // runtime/weights.h

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
