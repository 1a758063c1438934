// GPU ops of the `moesq` Python module: the NVFP4 activation quantizer, the routed dispatch, the
// grouped sparse GEMM and one whole MoE layer, on CUDA tensors that cross as DLPack without copies,
// enqueued on the caller's CUDA stream.
//
// Split along the one seam that matters for testing: python/gpu_ops.cpp (compiled in EVERY build)
// parses and checks every argument — dtype, shape, device, alignment, stream — and fills a *Call
// struct of raw device pointers; only then does a launch_* function touch CUDA: python/gpu_ops_cuda.cpp
// in CUDA builds, python/module_nocuda.cpp (an Error saying the module has no CUDA) otherwise. So
// every refusal is the same code with or without a GPU, and CPU tests (tests/python) cover it.
//
// Non-obvious decision: outputs are fresh cudaMalloc buffers owned by moesq.Tensor (freed by cudaFree,
// which waits for the device, when the last DLPack view goes) and carry an event recorded after the
// op's launches: a consumer's __dlpack__(stream=S) makes S wait on it, so a result read on another
// stream never races the op. Scratch is stream-ordered (cudaMallocAsync / cudaFreeAsync on the
// caller's stream), so no op synchronizes the host.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlpack_bridge.h"
#include "ops/act_dispatch/act_dispatch.h"
#include "ops/sparse_gemm/sparse_gemm.h"
#include "runtime/weights.h"

namespace moesq::py {

// A CUDA tensor argument that passed the shared checks: the CUDA side verifies that `ptr` really is
// device memory of the call's device before anything is launched (a capsule can claim kDLCUDA for
// host memory).
struct DeviceArg {
  std::string name;
  const void* ptr = nullptr;
};

struct GpuCall {
  std::string fn;        // e.g. "moesq.act_quant", for errors
  int device = 0;        // the CUDA device of every tensor argument
  intptr_t stream = 0;   // the caller's stream handle: 0 legacy default, 1 cudaStreamLegacy, 2 per-thread
  std::vector<DeviceArg> args;
};

// act_quant: d.x, d.x_lo, d.T, d.K, d.K_pad, d.quantize, d.layout set; the launch runs act_dispatch with one
// expert per token (E = T, top-k 1, capacity 1, ids 0..T-1), so row t of the result is token t.
struct ActQuantCall : GpuCall {
  ops::DispatchArgs d;
};
// dispatch: every input field of d set; the outputs are allocated by the launch.
struct DispatchCall : GpuCall {
  ops::DispatchArgs d;
};
// sparse_gemm: every field of a set except y / y_f32 when out_new (then the launch allocates y, zeroed).
struct SparseGemmCall : GpuCall {
  ops::SparseGemmArgs a;
  int max_tokens = 0;
  bool out_new = true;
  bool out_bf16 = false;
};
// MoeLayer.forward: h nullptr → a new zeroed [T, H] fp32 output; routes → new [T, k] topk_ids / topk_w.
struct MoeForwardCall : GpuCall {
  const uint16_t* x = nullptr;     // [T, H] bf16
  const uint16_t* x_lo = nullptr;  // [T, H] bf16 residues, or nullptr
  int64_t T = 0, H = 0, top_k = 0;
  float* h = nullptr;              // [T, H] fp32 caller output, or nullptr
  bool accumulate = false;
  bool routes = false;
};

// ---- implemented by gpu_ops_cuda.cpp (CUDA builds) or module_nocuda.cpp ----------------------
std::vector<Tensor> launch_act_quant(const ActQuantCall& c);    // {rows [T, K_pad] bf16, inv_scale [T] f32}
std::vector<Tensor> launch_dispatch(const DispatchCall& c);     // {x, inv_scale, counts, route_of_slot}
std::vector<Tensor> launch_sparse_gemm(const SparseGemmCall& c);  // {y}, or {} when the caller gave out
// The heuristic's config for a problem on `device`: {layout name, printable config}.
std::pair<std::string, std::string> sparse_gemm_config(int device, int num_experts, int64_t M, int64_t K_pad,
                                                       int max_tokens);
struct MoeLayerDevice;  // runtime::MoeLayerGpu in CUDA builds
std::shared_ptr<MoeLayerDevice> upload_moe_layer(const runtime::HostMoeLayer& host, int device);
size_t moe_layer_weight_bytes(const MoeLayerDevice& d);
std::vector<Tensor> launch_moe_layer(const MoeLayerDevice& d, const MoeForwardCall& c);  // {y?, topk_ids?, topk_w?}

// ---- gpu_ops.cpp --------------------------------------------------------------------------------
void register_gpu_ops(pybind11::module_& m);
// "mma-fragment" | "k-major"; ValueError naming fn and the argument 'layout' otherwise.
format::ActLayout parse_act_layout(const std::string& s, const std::string& fn);

}  // namespace moesq::py
