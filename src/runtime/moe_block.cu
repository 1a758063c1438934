// The routed-expert block of one MoE layer on the GPU (moe_block.h): the launch sequence the engine
// runs per layer, and one layer of a checkpoint run alone (MoeLayerGpu).
#include "runtime/moe_block.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/device_scope.h"
#include "core/error.h"
#include "ops/act_dispatch/act_dispatch.h"
#include "ops/moe_combine/moe_combine.h"
#include "ops/router_topk/router_topk.h"
#include "ops/sparse_gemm/sparse_gemm.h"
#include "ops/swiglu_quant/swiglu_quant.h"

namespace moesq::runtime {

MoeBlockDims moe_block_dims(const io::ModelSpec& s) {
  MoeBlockDims d;
  d.H = s.hidden_size, d.I = s.moe_intermediate_size, d.E = s.num_experts, d.top_k = s.top_k;
  d.H_pad = format::padded_k(d.H), d.I_pad = format::padded_k(d.I);
  d.norm_topk_prob = s.norm_topk_prob;
  return d;
}

namespace {

// dispatch → gate|up GEMM → SwiGLU (+ requant) → down GEMM, capacity T (moe_block.h).
void run_experts(const MoeBlockDims& dm, const MoeBlockWeights& L, const MoeBlockBuffers& b, const uint16_t* x,
                 const uint16_t* x_lo, int64_t T, cudaStream_t stream, unsigned stages) {
  const int E = static_cast<int>(dm.E), cap = static_cast<int>(T), max_tok = static_cast<int>(T);
  const int64_t H = dm.H, I = dm.I, H_pad = dm.H_pad, I_pad = dm.I_pad;
  ops::DispatchArgs d;
  d.x = x, d.topk_ids = b.topk_ids, d.T = T, d.topk = static_cast<int>(dm.top_k), d.K = H, d.K_pad = H_pad;
  d.num_experts = E, d.capacity = cap, d.out = b.xd, d.inv_scale = b.xs, d.counts = b.counts;
  d.route_of_slot = b.route_of_slot, d.slot_of_route = b.slot_of_route;
  ops::SwigluQuantArgs sw;  // route grid: T·k CTAs, not E × capacity
  sw.h_f32 = b.hbuf, sw.counts = b.counts, sw.num_experts = E, sw.capacity = cap, sw.I = I;
  sw.I_pad = I_pad, sw.out = b.ad, sw.inv_scale = b.as;
  sw.topk_ids = b.topk_ids, sw.slot_of_route = b.slot_of_route, sw.routes = T * dm.top_k;
  if (L.backend == ExpertBackend::kBf16) {
    d.quantize = false, d.layout = format::ActLayout::kKMajor;
    if (stages & kMoeDispatch) ops::act_dispatch(d, stream);
    ops::GemmBf16Args g;
    g.x = b.xd, g.w = L.gu_dense, g.y_f32 = b.hbuf, g.counts = b.counts, g.groups = E;
    g.M = cap, g.N = 2 * I, g.K = H_pad, g.ldy = 2 * I;
    if (stages & kMoeGateUp) ops::gemm_bf16(g, stream);
    sw.quantize = false, sw.layout = format::ActLayout::kKMajor;
    if (stages & kMoeSwiglu) ops::swiglu_quant(sw, stream);
    g.x = b.ad, g.w = L.down_dense, g.y_f32 = nullptr, g.y_bf16 = b.ybuf, g.N = H, g.K = I_pad, g.ldy = H;
    if (stages & kMoeDown) ops::gemm_bf16(g, stream);
    return;
  }
  MOESQ_CHECK(L.backend == ExpertBackend::kSparseW4A4 || L.backend == ExpertBackend::kSparseW4A16,
              "moe_block: expert backend ", expert_backend_name(L.backend), " is not built; built: ",
              built_expert_backends());
  const bool quant = L.backend == ExpertBackend::kSparseW4A4;
  const ops::GemmConfig c1 = ops::sparse_gemm_heuristic(E, 2 * I, H_pad, max_tok);
  d.quantize = quant, d.layout = ops::sparse_gemm_act_layout(c1);
  d.x_lo = quant ? x_lo : nullptr;  // W4A4: quantize the near-fp32 row (hi + lo), as the CPU forward
  if (stages & kMoeDispatch) ops::act_dispatch(d, stream);
  ops::SparseGemmArgs g;
  g.w = L.gu_sparse, g.w_inv_gamma = L.gu_inv_gamma, g.x = b.xd, g.x_layout = d.layout;
  g.x_inv_scale = quant ? b.xs : nullptr, g.counts = b.counts, g.y = nullptr, g.y_f32 = b.hbuf, g.num_experts = E;
  g.capacity = cap, g.M = 2 * I, g.M_pad = L.gu_M_pad, g.K_pad = H_pad, g.ldy = 2 * I;
  if (stages & kMoeGateUp) ops::sparse_gemm(g, max_tok, stream, &c1);
  const ops::GemmConfig c2 = ops::sparse_gemm_heuristic(E, H, I_pad, max_tok);
  sw.quantize = quant, sw.layout = ops::sparse_gemm_act_layout(c2);
  if (stages & kMoeSwiglu) ops::swiglu_quant(sw, stream);
  g.w = L.down_sparse, g.w_inv_gamma = L.down_inv_gamma, g.x = b.ad, g.x_layout = sw.layout;
  g.x_inv_scale = quant ? b.as : nullptr, g.y = b.ybuf, g.y_f32 = nullptr, g.M = H, g.M_pad = L.down_M_pad;
  g.K_pad = I_pad, g.ldy = H;
  if (stages & kMoeDown) ops::sparse_gemm(g, max_tok, stream, &c2);
}

}  // namespace

void moe_block(const MoeBlockDims& dm, const MoeBlockWeights& w, const MoeBlockBuffers& b, const uint16_t* x,
               const uint16_t* x_lo, float* h, int64_t T, cudaStream_t stream, const LinearFn& router_linear,
               unsigned stages) {
  if (T == 0) return;
  ops::GemmBf16Args g;
  g.x = x, g.x_lo = x_lo, g.w = w.router, g.y_f32 = b.router_logits, g.split_ws = b.gemm_split, g.M = T, g.N = dm.E;
  g.K = dm.H, g.ldy = dm.E;
  if (stages & kMoeRouterGemm) {
    if (router_linear)
      router_linear(g);
    else
      ops::gemm_bf16(g, stream);
  }
  ops::RouterTopkArgs rt;
  rt.logits = b.router_logits, rt.topk_ids = b.topk_ids, rt.topk_w = b.topk_w, rt.T = T;
  rt.num_experts = static_cast<int>(dm.E), rt.topk = static_cast<int>(dm.top_k), rt.norm_topk_prob = dm.norm_topk_prob;
  if (stages & kMoeTopk) ops::router_topk(rt, stream);
  run_experts(dm, w, b, x, x_lo, T, stream, stages);
  ops::MoeCombineArgs mc;
  mc.y = b.ybuf, mc.topk_ids = b.topk_ids, mc.topk_w = b.topk_w, mc.slot_of_route = b.slot_of_route;
  mc.h = h, mc.T = T, mc.H = dm.H, mc.ldy = dm.H;
  mc.topk = static_cast<int>(dm.top_k), mc.num_experts = static_cast<int>(dm.E), mc.capacity = static_cast<int>(T);
  if (stages & kMoeCombine) ops::moe_combine(mc, stream);
}

// ---- one layer alone ------------------------------------------------------------------------

namespace {

// A device copy of a host vector (cudaMalloc, freed on destruction).
struct Upload {
  void* p = nullptr;
  size_t bytes = 0;
  template <class T>
  explicit Upload(const std::vector<T>& v) : bytes(sizeof(T) * v.size()) {
    MOESQ_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    if (bytes) MOESQ_CUDA_CHECK(cudaMemcpy(p, v.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~Upload() { cudaFree(p); }
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;
};

std::vector<float> inverse(const std::vector<float>& gamma) {
  std::vector<float> r(gamma.size());
  for (size_t e = 0; e < gamma.size(); ++e) r[e] = 1.0f / gamma[e];
  return r;
}

// Carves 256-byte aligned pieces out of one block: a first pass over base nullptr measures the bytes.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<unsigned char*>(base)) {}
  template <class T>
  void take(T*& p, size_t count) {
    p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (sizeof(T) * std::max<size_t>(count, 1) + 255) / 256 * 256;
  }
  size_t used() const { return used_; }

 private:
  unsigned char* base_;
  size_t used_ = 0;
};

// The buffers of moe_block for T tokens, carved from c.
void carve_buffers(Carver& c, const MoeBlockDims& d, int64_t T, MoeBlockBuffers& b) {
  const size_t E = d.E, k = d.top_k, Tn = T;
  c.take(b.router_logits, Tn * E);
  c.take(b.gemm_split, ops::gemm_bf16_split_floats(T, d.E, d.H));
  c.take(b.topk_ids, Tn * k);
  c.take(b.topk_w, Tn * k);
  c.take(b.slot_of_route, Tn * k);
  c.take(b.xd, E * Tn * d.H_pad);
  c.take(b.hbuf, E * Tn * 2 * d.I);
  c.take(b.ad, E * Tn * d.I_pad);
  c.take(b.ybuf, E * Tn * d.H);
  c.take(b.xs, E * Tn);
  c.take(b.as, E * Tn);
  c.take(b.counts, E);
  c.take(b.route_of_slot, E * Tn);
}

}  // namespace

struct MoeLayerGpu::Impl {
  int device = 0;
  MoeBlockDims dims;
  std::vector<std::unique_ptr<Upload>> uploads;
  MoeBlockWeights w;
  size_t weight_bytes = 0;

  template <class T>
  const T* up(const std::vector<T>& v) {
    uploads.push_back(std::make_unique<Upload>(v));
    weight_bytes += uploads.back()->bytes;
    return static_cast<const T*>(uploads.back()->p);
  }
};

MoeLayerGpu::MoeLayerGpu(const HostMoeLayer& host, int device) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.device = device;
  m.dims = moe_block_dims(host.spec);
  const DeviceScope scope(device);
  const HostLayer& L = host.weights;
  m.w.backend = host.backend;
  m.w.router = m.up(L.router);
  if (host.backend == ExpertBackend::kBf16) {
    m.w.gu_dense = m.up(L.gu_dense);
    m.w.down_dense = m.up(L.down_dense);
  } else {
    m.w.gu_sparse = m.up(L.gu_sparse.data);
    m.w.down_sparse = m.up(L.down_sparse.data);
    m.w.gu_inv_gamma = m.up(inverse(L.gu_sparse.gamma));
    m.w.down_inv_gamma = m.up(inverse(L.down_sparse.gamma));
    m.w.gu_M_pad = L.gu_sparse.M_pad;
    m.w.down_M_pad = L.down_sparse.M_pad;
  }
}

MoeLayerGpu::~MoeLayerGpu() {
  if (!impl_) return;
  int prev = -1;
  const bool switch_device = cudaGetDevice(&prev) == cudaSuccess && prev != impl_->device;
  if (switch_device) cudaSetDevice(impl_->device);
  impl_->uploads.clear();  // cudaFree: synchronizes, so no forward in flight still reads the weights
  if (switch_device) cudaSetDevice(prev);
}

const MoeBlockDims& MoeLayerGpu::dims() const { return impl_->dims; }
int MoeLayerGpu::device() const { return impl_->device; }
size_t MoeLayerGpu::weight_bytes() const { return impl_->weight_bytes; }

void MoeLayerGpu::forward(const uint16_t* x, const uint16_t* x_lo, int64_t T, float* h, bool accumulate,
                          int32_t* topk_ids, float* topk_w, cudaStream_t stream) const {
  const Impl& m = *impl_;
  const MoeBlockDims& d = m.dims;
  MOESQ_CHECK(T >= 0 && T <= (int64_t(1) << 20), "MoeLayerGpu: T=", T, " outside [0, 2^20]");
  if (T == 0) return;
  MOESQ_CHECK(x && h, "MoeLayerGpu: x and h are required");
  const DeviceScope scope(m.device);
  if (!accumulate) MOESQ_CUDA_CHECK(cudaMemsetAsync(h, 0, sizeof(float) * T * d.H, stream));
  MoeBlockBuffers b;
  Carver measure(nullptr);
  carve_buffers(measure, d, T, b);
  const StreamScratch s(measure.used(), stream);
  Carver carve(s.get());
  carve_buffers(carve, d, T, b);
  if (topk_ids) b.topk_ids = topk_ids;  // the routes land straight in the caller's tensors
  if (topk_w) b.topk_w = topk_w;
  moe_block(d, m.w, b, x, x_lo, h, T, stream);
}

}  // namespace moesq::runtime
