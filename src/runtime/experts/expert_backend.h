// The seam of the GPU engine's expert backends: which kernels run the routed experts of a MoE layer.
// A backend has two halves because the loader is CPU code (built and tested without CUDA) and the
// kernels are not:
//   ExpertBackendHost (experts/<name>.cpp): which stored experts it runs (accepts), and how it reads one
//     layer's experts from a checkpoint into the host layout its kernels read (load);
//   ExpertBackendDevice (experts/<name>.cu): upload of that layout (or synthetic weights of the same
//     shapes), giving DeviceExperts, whose run() is the expert stage of one MoE layer on a stream:
//     dispatch (+ act quant) → gate|up → SwiGLU (+ requant) → down, into MoeBlockBuffers::ybuf.
// The built backends are the rows of experts/registry.h; a new backend is one file pair + one row.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/cuda/stream.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "runtime/layers/moe_workspace.h"

namespace moesq::runtime {

// One layer's routed experts in host memory, in the layout of one backend's kernels (experts/<name>.h):
// the experts [begin, end) of the layer (all of them, or an expert-parallel rank's shard).
struct HostExperts {
  virtual ~HostExperts() = default;
  int64_t begin = 0, end = 0;
};

// The expert stage of one MoE block call: x [T, H] bf16 (+ x_lo residues or nullptr) routed by
// b.topk_ids / b.topk_w → b.ybuf [E, T, H] bf16 and b.slot_of_route (capacity T). `stages`: the
// MoeStage bits of layers/moe_block.h to launch (kMoeDispatch, kMoeGateUp, kMoeSwiglu, kMoeDown).
struct ExpertStage {
  const MoeBlockDims* dims = nullptr;
  const MoeBlockBuffers* buffers = nullptr;
  const uint16_t* x = nullptr;     // [T, H] bf16
  const uint16_t* x_lo = nullptr;  // [T, H] bf16 residues, or nullptr
  int64_t T = 0;
  unsigned stages = ~0u;
  bool counts_zeroed = false;  // b.counts are already 0 on the stream (the routing zeroed them): no memset
  // gpt-oss: [E, 2I] fp32 gate|up biases of the layer's experts (HostMoe::expert_gate_up_bias), added
  // before the (clamped, MoeBlockDims::clamped_swiglu) SwiGLU; nullptr: none.
  const float* gate_up_bias = nullptr;
};

// One layer's routed experts on the device (freed on destruction), run by the backend that made them:
// the experts [dims.expert_begin, dims.expert_end), whose outputs run() writes into ybuf's slots of
// those experts (the dispatch still fills every expert's slots; other experts' rows are left as they
// were).
class DeviceExperts {
 public:
  virtual ~DeviceExperts() = default;
  virtual size_t bytes() const = 0;  // device bytes of the expert weights
  // Errors: the launchers' checks.
  virtual void run(const ExpertStage& s, cudaStream_t stream) const = 0;
};

class ExpertBackendHost {
 public:
  virtual ~ExpertBackendHost() = default;
  // "" when the backend runs a checkpoint whose experts are stored as `storage`, else why not (a
  // sentence naming the storage and what to use instead).
  virtual std::string refuses(io::ExpertStorage storage) const = 0;
  // What the backend's own weights are (what a synthetic engine of it reports as the checkpoint's).
  virtual io::ExpertStorage native_storage() const = 0;
  // NVFP4 expert activations (W4A4) and their quantization block; false / 0 otherwise.
  virtual bool act_quant() const { return false; }
  virtual int act_block() const { return 0; }
  // MoE layer `layer`'s routed experts [begin, end) (HostExperts::begin / end), read through io (any
  // layout io reads; only those experts' tensors where the layout stores experts apart). Errors name the
  // tensor and the directory. The caller (load_host_moe) checks the range.
  virtual std::unique_ptr<HostExperts> load(const io::Checkpoint& ckpt, const io::QuantizationConfig& q,
                                            int64_t layer, int64_t begin, int64_t end) const = 0;
};

// A source of 64-bit seeds, one per synthetic tensor (runtime::Engine's synthetic model, bench_moe_layer).
using SeedFn = std::function<uint64_t()>;

class ExpertBackendDevice {
 public:
  virtual ~ExpertBackendDevice() = default;
  // Uploads `host` (made by the same backend's host half; Error otherwise) synchronously to the
  // current device: the experts [d.expert_begin, d.expert_end) of the layer (MoeBlockDims: the whole
  // layer, or an expert-parallel rank's shard; run() then computes those experts' outputs only), which
  // host must hold (Error otherwise).
  virtual std::unique_ptr<DeviceExperts> upload(const HostExperts& host, const MoeBlockDims& d) const = 0;
  // Experts of d's shapes drawn on the current device on `stream` (ops/synth_pack, weight std ≈ scale),
  // taking one seed per tensor from next_seed in a fixed order; a shard draws its experts' slice of
  // each tensor (the bits of the same experts of the whole layer).
  virtual std::unique_ptr<DeviceExperts> synthesize(const MoeBlockDims& d, const SeedFn& next_seed, float scale,
                                                    cudaStream_t stream) const = 0;
};

}  // namespace moesq::runtime
