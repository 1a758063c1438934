// CUDA side of the Python module's GPU ops (gpu_ops.h): each launch_* makes the tensors' device
// current, checks that every pointer claimed as CUDA memory really is device memory of that device,
// allocates the outputs, enqueues the existing launchers (ops/act_dispatch, ops/sparse_gemm,
// runtime/layers/moe_block) on the caller's stream, and records the event the outputs' __dlpack__ makes a
// consumer stream wait on. No kernels here.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/cuda/device_scope.h"
#include "core/error.h"
#include "gpu_ops.h"
#include "runtime/layers/moe_block.h"

namespace pyb = pybind11;

namespace moesq::py {

struct MoeLayerDevice {
  MoeLayerDevice(const runtime::HostMoeLayer& host, int device) : gpu(host, device) {}
  runtime::MoeLayerGpu gpu;
};

namespace {

// A stream handle of the API (0 = the legacy default stream, 1 / 2 the DLPack spec's legacy and
// per-thread default streams, which CUDA takes as cudaStreamLegacy / cudaStreamPerThread).
cudaStream_t as_stream(intptr_t s) { return s == 0 ? cudaStreamLegacy : reinterpret_cast<cudaStream_t>(s); }

void require_device(const std::string& fn, int device) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    MOESQ_FAIL(fn, ": no CUDA device is visible (", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e),
               "); moesq.cuda_available() is False");
  }
  MOESQ_CHECK(device >= 0 && device < n, fn, ": the tensors are on cuda:", device, " but ", n,
              " CUDA device(s) are visible");
}

// A capsule may claim kDLCUDA for host memory: refuse it by name before a kernel dereferences it. When
// the runtime cannot tell (an error), trust the producer.
void check_pointers(const GpuCall& c) {
  for (const DeviceArg& a : c.args) {
    cudaPointerAttributes at{};
    if (cudaPointerGetAttributes(&at, a.ptr) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    // Pageable host memory reads as unregistered with no device address; pinned host memory as host.
    const bool host = at.type == cudaMemoryTypeHost || (at.type == cudaMemoryTypeUnregistered && !at.devicePointer);
    if (host)
      throw pyb::value_error(c.fn + ": argument '" + a.name + "' claims CUDA memory (kDLCUDA) on cuda:" +
                             std::to_string(c.device) + " but its pointer is host memory");
    if (at.type == cudaMemoryTypeDevice && at.device != c.device)
      throw pyb::value_error(c.fn + ": argument '" + a.name + "' claims cuda:" + std::to_string(c.device) +
                             " but its memory is on cuda:" + std::to_string(at.device));
  }
}

// The device, current for the call, after the checks above.
struct CallScope {
  explicit CallScope(const GpuCall& c) : stream(as_stream(c.stream)), device(c.device) {
    require_device(c.fn, c.device);
    scope = std::make_unique<DeviceScope>(c.device);
    check_pointers(c);
  }
  cudaStream_t stream;
  int device;
  std::unique_ptr<DeviceScope> scope;
};

// A fresh output buffer (a DevBuf, core/cuda/dev_buf.cuh) shared by every DLPack view of it: tensors
// are reference-counted Python objects, so ownership must be shared, and the last view frees it. The
// deleter makes the buffer's device current around the free (a view may die while another device is
// current) and clears the error a free at interpreter exit may leave (the runtime may be gone: nothing to
// report to). cudaFree waits for the device, so no stream still using the buffer races the free.
std::shared_ptr<void> device_alloc(size_t bytes, int device) {
  std::shared_ptr<DevBuf<uint8_t>> buf(new DevBuf<uint8_t>(bytes), [device](DevBuf<uint8_t>* b) {
    int prev = -1;
    const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device && cudaSetDevice(device) == cudaSuccess;
    delete b;
    (void)cudaGetLastError();
    if (switched) cudaSetDevice(prev);
  });
  return std::shared_ptr<void>(buf, buf->p);
}

// The op's completion on its stream: recorded after the launches, waited on by each consumer stream.
struct Ready {
  cudaEvent_t ev = nullptr;
  int device = 0;
  Ready(cudaStream_t s, int dev) : device(dev) {
    MOESQ_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    const cudaError_t e = cudaEventRecord(ev, s);
    if (e != cudaSuccess) {
      cudaEventDestroy(ev);
      MOESQ_CUDA_CHECK(e);
    }
  }
  ~Ready() { cudaEventDestroy(ev); }  // released by the runtime once completed, even if still pending here
  Ready(const Ready&) = delete;
  Ready& operator=(const Ready&) = delete;
};

// The outputs of one call: buffers allocated before the launches, turned into moesq.Tensor objects
// sharing one Ready event after them.
class Outputs {
 public:
  explicit Outputs(int device) : device_(device) {}
  void* add(DType dt, std::vector<int64_t> shape) {
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<int64_t>());
    mem_.push_back(device_alloc(static_cast<size_t>(n) * dtype_bytes(dt), device_));
    specs_.push_back({dt, std::move(shape)});
    return mem_.back().get();
  }
  std::vector<Tensor> finish(cudaStream_t stream) {
    auto ready = std::make_shared<Ready>(stream, device_);
    auto wait = [ready](intptr_t consumer) {
      if (consumer == -1) return;  // the consumer asked for no synchronization (DLPack stream = -1)
      MOESQ_CHECK(consumer >= 0, "moesq.Tensor.__dlpack__: stream ", consumer, " is not a stream handle (>= 0 or -1)");
      const DeviceScope scope(ready->device);  // 1 / 2 name the default streams of the CURRENT device
      MOESQ_CUDA_CHECK(cudaStreamWaitEvent(as_stream(consumer), ready->ev, 0));
    };
    std::vector<Tensor> out;
    for (size_t i = 0; i < mem_.size(); ++i)
      out.push_back(Tensor::device(specs_[i].dt, specs_[i].shape, mem_[i].get(), device_, mem_[i], wait));
    return out;
  }

 private:
  struct Spec {
    DType dt;
    std::vector<int64_t> shape;
  };
  int device_;
  std::vector<std::shared_ptr<void>> mem_;
  std::vector<Spec> specs_;
};

// Route ids 0, 1, 2, … on `device` for act_quant's one-expert-per-token dispatch: a table per device that
// only grows (old tables are kept: a kernel in flight on some stream may still read them).
const int32_t* iota_ids(int64_t n, int device) {
  static std::mutex mu;
  static std::map<int, std::vector<std::shared_ptr<void>>> tables;  // per device, the last one the largest
  static std::map<int, int64_t> sizes;
  const std::lock_guard<std::mutex> lock(mu);
  auto& t = tables[device];
  if (t.empty() || sizes[device] < n) {
    int64_t size = 1 << 16;
    while (size < n) size *= 2;
    std::vector<int32_t> host(static_cast<size_t>(size));
    std::iota(host.begin(), host.end(), 0);
    t.push_back(device_alloc(host.size() * sizeof(int32_t), device));
    MOESQ_CUDA_CHECK(cudaMemcpy(t.back().get(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    sizes[device] = size;
  }
  return static_cast<const int32_t*>(t.back().get());
}

ops::GemmConfig pick_config(const ops::SparseGemmArgs& a, int max_tokens) {
  const int mt = std::min(max_tokens, a.capacity);
  const ops::GemmConfig h = ops::sparse_gemm_heuristic(a.num_experts, a.M, a.K_pad, mt);
  if (ops::sparse_gemm_act_layout(h) == a.x_layout) return h;
  // The caller's activations are in the other layout: a built kernel that reads it.
  return a.x_layout == format::ActLayout::kKMajor ? ops::wgmma_config(128, 128) : ops::GemmConfig{};
}

}  // namespace

std::vector<Tensor> launch_act_quant(const ActQuantCall& c) {
  const CallScope cs(c);
  ops::DispatchArgs d = c.d;
  const int64_t T = d.T;
  Outputs out(c.device);
  d.out = static_cast<uint16_t*>(out.add(DType::BF16, {T, d.K_pad}));
  d.inv_scale = static_cast<float*>(out.add(DType::F32, {T}));
  if (T > 0) {
    // One expert per token (E = T, capacity 1, route t → expert t, slot 0): row t of out is token t.
    const StreamScratch scratch(2 * sizeof(int32_t) * static_cast<size_t>(T) + 256, cs.stream);
    d.topk_ids = iota_ids(T, c.device);
    d.topk = 1;
    d.num_experts = static_cast<int>(T);
    d.capacity = 1;
    d.counts = static_cast<int32_t*>(scratch.get());
    d.route_of_slot = d.counts + (T + 63) / 64 * 64;
    ops::act_dispatch(d, cs.stream);
  }
  return out.finish(cs.stream);
}

std::vector<Tensor> launch_dispatch(const DispatchCall& c) {
  const CallScope cs(c);
  ops::DispatchArgs d = c.d;
  const int64_t E = d.num_experts, cap = d.capacity;
  Outputs out(c.device);
  d.out = static_cast<uint16_t*>(out.add(DType::BF16, {E, cap, d.K_pad}));
  d.inv_scale = static_cast<float*>(out.add(DType::F32, {E, cap}));
  d.counts = static_cast<int32_t*>(out.add(DType::I32, {E}));
  d.route_of_slot = static_cast<int32_t*>(out.add(DType::I32, {E, cap}));
  // Empty slots: x 0, inv_scale 0, route −1 (the kernel writes filled slots only).
  MOESQ_CUDA_CHECK(cudaMemsetAsync(d.out, 0, sizeof(uint16_t) * E * cap * d.K_pad, cs.stream));
  MOESQ_CUDA_CHECK(cudaMemsetAsync(d.inv_scale, 0, sizeof(float) * E * cap, cs.stream));
  MOESQ_CUDA_CHECK(cudaMemsetAsync(d.route_of_slot, 0xFF, sizeof(int32_t) * E * cap, cs.stream));
  ops::act_dispatch(d, cs.stream);  // zeroes counts first, even for T = 0
  return out.finish(cs.stream);
}

std::vector<Tensor> launch_sparse_gemm(const SparseGemmCall& c) {
  const CallScope cs(c);
  ops::SparseGemmArgs a = c.a;
  Outputs out(c.device);
  if (c.out_new) {
    const std::vector<int64_t> shape = {a.num_experts, a.capacity, a.M};
    const size_t bytes = (c.out_bf16 ? sizeof(uint16_t) : sizeof(float)) * a.num_experts * a.capacity * a.M;
    void* y = out.add(c.out_bf16 ? DType::BF16 : DType::F32, shape);
    MOESQ_CUDA_CHECK(cudaMemsetAsync(y, 0, bytes, cs.stream));  // slots past the counts stay 0
    if (c.out_bf16) a.y = static_cast<uint16_t*>(y);
    else a.y_f32 = static_cast<float*>(y);
  }
  const ops::GemmConfig config = pick_config(a, c.max_tokens);
  ops::sparse_gemm(a, c.max_tokens, cs.stream, &config);
  return out.finish(cs.stream);
}

std::pair<std::string, std::string> sparse_gemm_config(int device, int num_experts, int64_t M, int64_t K_pad,
                                                       int max_tokens) {
  require_device("moesq.sparse_gemm_config", device);
  const DeviceScope scope(device);
  const ops::GemmConfig c = ops::sparse_gemm_heuristic(num_experts, M, K_pad, max_tokens);
  return {format::act_layout_name(ops::sparse_gemm_act_layout(c)), c.str()};
}

std::shared_ptr<MoeLayerDevice> upload_moe_layer(const runtime::HostMoeLayer& host, int device) {
  require_device("MoeLayer", device);
  return std::make_shared<MoeLayerDevice>(host, device);
}

size_t moe_layer_weight_bytes(const MoeLayerDevice& d) { return d.gpu.weight_bytes(); }

std::vector<Tensor> launch_moe_layer(const MoeLayerDevice& dev, const MoeForwardCall& c) {
  const CallScope cs(c);
  Outputs out(c.device);
  float* h = c.h ? c.h : static_cast<float*>(out.add(DType::F32, {c.T, c.H}));
  int32_t* ids = c.routes ? static_cast<int32_t*>(out.add(DType::I32, {c.T, c.top_k})) : nullptr;
  float* w = c.routes ? static_cast<float*>(out.add(DType::F32, {c.T, c.top_k})) : nullptr;
  dev.gpu.forward(c.x, c.x_lo, c.T, h, c.accumulate, ids, w, cs.stream);  // zeroes h first unless accumulate
  return out.finish(cs.stream);
}

}  // namespace moesq::py
