// The routed-expert block of one MoE layer on the GPU (moe_block.h): the launch sequence the engine
// runs per layer, the device layer (moe_block_device.cuh), and one layer of a checkpoint run alone
// (MoeLayerGpu).
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/device_scope.h"
#include "core/cuda/pdl.cuh"
#include "core/env_switch.h"
#include "core/error.h"
#include "ops/dense_swiglu/dense_swiglu.h"
#include "ops/moe_combine/moe_combine.h"
#include "ops/route_rows/route_rows.h"
#include "ops/router_topk/router_topk.h"
#include "ops/synth_pack/synth_pack.h"
#include "runtime/experts/registry.h"
#include "runtime/layers/moe_block_device.cuh"
#include "runtime/weights.h"

namespace moesq::runtime {

void DeviceMoeLayer::upload(const HostMoe& host, ExpertBackend backend, const MoeBlockDims& d) {
  MOESQ_CHECK(host.experts || !host.mlp.gate_up.empty(), "moe layer: neither experts nor an MLP to upload");
  if (host.experts) {
    router.upload(host.router);
    if (!host.correction_bias.empty()) correction_bias.upload(host.correction_bias);
    if (!host.router_logit_bias.empty()) router_logit_bias.upload(host.router_logit_bias);
    if (!host.expert_gate_up_bias.empty()) expert_gate_up_bias.upload(host.expert_gate_up_bias);
    if (!host.expert_down_bias.empty()) expert_down_bias.upload(host.expert_down_bias);
    experts = expert_backend_device(backend).upload(*host.experts, d);
    topk_ticket.upload(std::vector<int32_t>{0});
  }
  if (!host.mlp.gate_up.empty()) {
    mlp_gate_up.upload(host.mlp.gate_up);
    mlp_down.upload(host.mlp.down);
    mlp_I = host.mlp.I, mlp_gated = host.mlp.gated;
  }
}

namespace {

// The router GEMM runs the top-k at decode sizes (GemmBf16Args::fused_topk) only with MOESQ_FUSED_TOPK=1:
// measured slower than the separate kernel under PDL (TPOT +2 % at batch 1, +14 % at 64: one CTA routes
// every token; bench/NOTES.md, session 29). Read once per process.
bool fused_topk_enabled() {
  static const bool on = env_switch("MOESQ_FUSED_TOPK", false);
  return on;
}

// The combine runs the next layer's input norm (MoeCombineArgs::fused_norm) unless MOESQ_FUSED_NORM=0
// (the same-run peer; bench/NOTES.md, session 29). Read once per process.
bool fused_norm_enabled() {
  static const bool on = env_switch_on("MOESQ_FUSED_NORM");
  return on;
}

// The layer's dense MLP (moe_block.h): h += down(dense_swiglu(x · gate_up)).
void dense_mlp(const MoeBlockDims& dm, const DeviceMoeLayer& w, const MoeBlockBuffers& b, const uint16_t* x,
               const uint16_t* x_lo, float* h, int64_t T, cudaStream_t stream, const LinearFn& linear) {
  MOESQ_CHECK(w.mlp_I <= dm.mlp_I && b.mlp_gu, "moe block: a dense MLP of ", w.mlp_I, " wider than the workspace's ",
              dm.mlp_I);
  const auto run = [&](const ops::GemmBf16Args& g) {
    if (linear)
      linear(g);
    else
      ops::gemm_bf16(g, stream);
  };
  const int64_t N = 2 * w.mlp_I + (w.mlp_gated ? 1 : 0);
  ops::GemmBf16Args gu;
  gu.x = x, gu.x_lo = x_lo, gu.w = w.mlp_gate_up.p, gu.y_f32 = b.mlp_gu, gu.M = T, gu.N = N, gu.K = dm.H, gu.ldy = N;
  run(gu);
  ops::DenseSwigluArgs sw;
  sw.gu = b.mlp_gu, sw.a = b.mlp_a, sw.a_lo = b.mlp_a_lo, sw.T = T, sw.I = w.mlp_I, sw.ld = N, sw.gated = w.mlp_gated;
  ops::dense_swiglu(sw, stream);
  ops::GemmBf16Args dn;
  dn.x = b.mlp_a, dn.x_lo = b.mlp_a_lo, dn.w = w.mlp_down.p, dn.y_f32 = h, dn.M = T, dn.N = dm.H, dn.K = w.mlp_I;
  dn.ldy = dm.H, dn.accumulate = true;
  run(dn);
}

}  // namespace

void DeviceMoeLayer::synthesize(const MoeBlockDims& d, ExpertBackend backend, const SeedFn& next_seed, float scale,
                                cudaStream_t stream) {
  router.alloc(d.E * d.H);
  topk_ticket.upload(std::vector<int32_t>{0});
  ops::SynthBf16Args a;
  a.out = router.p, a.n = d.E * d.H, a.seed = next_seed(), a.scale = scale;
  ops::synth_bf16(a, stream);
  if (d.correction_bias) correction_bias.upload(std::vector<float>(d.E, 0.0f));  // a neutral bias
  if (d.router_logit_bias) router_logit_bias.upload(std::vector<float>(d.E, 0.0f));
  if (d.expert_bias) {  // zero biases of the right shapes
    expert_gate_up_bias.upload(std::vector<float>(d.E * 2 * d.I, 0.0f));
    expert_down_bias.upload(std::vector<float>(d.E * d.H, 0.0f));
  }
  experts = expert_backend_device(backend).synthesize(d, next_seed, scale, stream);
}

void DeviceMoeLayer::synthesize_mlp(int64_t H, int64_t I, bool gated, const SeedFn& next_seed, float scale,
                                    cudaStream_t stream) {
  auto draw = [&](DevBuf<uint16_t>& buf, int64_t n) {
    buf.alloc(n);
    ops::SynthBf16Args a;
    a.out = buf.p, a.n = n, a.seed = next_seed(), a.scale = scale;
    ops::synth_bf16(a, stream);
  };
  draw(mlp_gate_up, (2 * I + (gated ? 1 : 0)) * H);
  draw(mlp_down, H * I);
  mlp_I = I, mlp_gated = gated;
}

namespace {

// Expert parallelism: this rank's routes packed route-major, summed over the ranks, unpacked into
// ybuf (ExpertExchange).
void exchange_routes(const MoeBlockDims& dm, const MoeBlockBuffers& b, int64_t T, cudaStream_t stream,
                     const ExpertExchange* exchange) {
  MOESQ_CHECK(exchange && exchange->all_reduce_sum && b.routes, "moe block: experts [", dm.expert_begin, ", ",
              dm.expert_end, ") of ", dm.E, " sharded over ranks, but no exchange (or no workspace for it)");
  ops::RouteRowsArgs rr;
  rr.y = b.ybuf, rr.ldy = dm.H, rr.topk_ids = b.topk_ids, rr.slot_of_route = b.slot_of_route, rr.routes = b.routes;
  rr.T = T, rr.H = dm.H, rr.topk = static_cast<int>(dm.top_k), rr.num_experts = static_cast<int>(dm.E);
  rr.capacity = static_cast<int>(T), rr.expert_begin = dm.expert_begin, rr.expert_end = dm.expert_end;
  ops::route_rows(rr, stream);
  exchange->all_reduce_sum(reinterpret_cast<uint32_t*>(b.routes), T * dm.top_k * dm.H / 2, stream);
  rr.pack = false;
  ops::route_rows(rr, stream);
}

// Router → top-k → the backend's expert stage (→ the exchange of a shard) → combine into h.
void routed_block(const MoeBlockDims& dm, const DeviceMoeLayer& w, const MoeBlockBuffers& b, const uint16_t* x,
                  const uint16_t* x_lo, float* h, int64_t T, cudaStream_t stream, const LinearFn& router_linear,
                  unsigned stages, const ExpertExchange* exchange, const ops::RmsNormArgs* next_norm) {
  ops::GemmBf16Args g;
  g.x = x, g.x_lo = x_lo, g.w = w.router.p, g.y_f32 = b.router_logits, g.split_ws = b.gemm_split, g.M = T, g.N = dm.E;
  g.K = dm.H, g.ldy = dm.E;
  ops::RouterTopkArgs rt;
  rt.logits = b.router_logits, rt.topk_ids = b.topk_ids, rt.topk_w = b.topk_w, rt.T = T;
  rt.num_experts = static_cast<int>(dm.E), rt.topk = static_cast<int>(dm.top_k), rt.norm_topk_prob = dm.norm_topk_prob;
  rt.sigmoid = dm.sigmoid_router, rt.correction_bias = dm.correction_bias ? w.correction_bias.p : nullptr;
  rt.n_group = dm.n_group, rt.topk_group = dm.topk_group, rt.routed_scaling_factor = dm.routed_scaling_factor;
  rt.topk_softmax = dm.topk_softmax, rt.logit_bias = dm.router_logit_bias ? w.router_logit_bias.p : nullptr;
  const bool routing = (stages & kMoeTopk) != 0;
  rt.counts = b.counts;  // zeroed by the routing, filled by the dispatch
  // Decode sizes: the router GEMM's last CTA runs the top-k (the same bits, one kernel fewer).
  if (routing && (stages & kMoeRouterGemm) && fused_topk_enabled() && w.topk_ticket.p) {
    g.fused_topk = &rt, g.topk_ticket = w.topk_ticket.p;
    if (!ops::gemm_bf16_fuses_topk(g)) g.fused_topk = nullptr, g.topk_ticket = nullptr;
  }
  if (stages & kMoeRouterGemm) {
    if (router_linear)
      router_linear(g);
    else
      ops::gemm_bf16(g, stream);
  }
  if (routing && !g.fused_topk) ops::router_topk(rt, stream);
  ExpertStage s;
  s.dims = &dm, s.buffers = &b, s.x = x, s.x_lo = x_lo, s.T = T, s.stages = stages, s.counts_zeroed = routing;
  s.gate_up_bias = dm.expert_bias ? w.expert_gate_up_bias.p : nullptr;
  w.experts->run(s, stream);
  ops::MoeCombineArgs mc;
  mc.y = b.ybuf, mc.topk_ids = b.topk_ids, mc.topk_w = b.topk_w, mc.slot_of_route = b.slot_of_route;
  mc.h = h, mc.T = T, mc.H = dm.H, mc.ldy = dm.H;
  mc.topk = static_cast<int>(dm.top_k), mc.num_experts = static_cast<int>(dm.E), mc.capacity = static_cast<int>(T);
  mc.down_bias = dm.expert_bias ? w.expert_down_bias.p : nullptr;
  mc.fused_norm = next_norm;
  if ((stages & kMoeCombine) && dm.sharded()) exchange_routes(dm, b, T, stream, exchange);
  if (stages & kMoeCombine) ops::moe_combine(mc, stream);
}

}  // namespace

bool moe_block(const MoeBlockDims& dm, const DeviceMoeLayer& w, const MoeBlockBuffers& b, const uint16_t* x,
               const uint16_t* x_lo, float* h, int64_t T, cudaStream_t stream, const LinearFn& router_linear,
               unsigned stages, const ExpertExchange* exchange, const ops::RmsNormArgs* next_norm) {
  if (T == 0) return next_norm != nullptr;  // no rows: nothing to normalize either
  const PdlTokensScope pdl(T);  // PDL for decode-sized blocks only (core/cuda/pdl.cuh)
  // The combine writes h last when there is no dense MLP after it.
  const bool fuse = next_norm && fused_norm_enabled() && w.experts && w.mlp_I == 0 && (stages & kMoeCombine);
  if (w.experts)
    routed_block(dm, w, b, x, x_lo, h, T, stream, router_linear, stages, exchange, fuse ? next_norm : nullptr);
  if (w.mlp_I > 0 && (stages & kMoeDenseMlp)) dense_mlp(dm, w, b, x, x_lo, h, T, stream, router_linear);
  return fuse;
}

ExpertExchange host_staged_exchange(std::function<void(uint32_t* words, int64_t count)> host_sum) {
  MOESQ_CHECK(host_sum, "host_staged_exchange: no host sum");
  ExpertExchange x;
  x.capturable = false;
  // One host buffer for every call (a decode step exchanges once per MoE layer).
  x.all_reduce_sum = [sum = std::move(host_sum), buf = std::make_shared<std::vector<uint32_t>>()](
                         uint32_t* words, int64_t count, cudaStream_t stream) {
    std::vector<uint32_t>& host = *buf;
    host.resize(static_cast<size_t>(count));
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(host.data(), words, host.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    sum(host.data(), count);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(words, host.data(), host.size() * sizeof(uint32_t), cudaMemcpyHostToDevice, stream));
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(stream));  // the buffer is reused by the next call
  };
  return x;
}

// ---- one layer alone ------------------------------------------------------------------------

struct MoeLayerGpu::Impl {
  int device = 0;
  MoeBlockDims dims;
  DeviceMoeLayer w;
};

MoeLayerGpu::MoeLayerGpu(const HostMoeLayer& host, int device) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.device = device;
  m.dims = moe_block_dims(host.spec);
  const DeviceScope scope(device);
  m.w.upload(host.weights, host.backend, m.dims);
}

MoeLayerGpu::~MoeLayerGpu() {
  if (!impl_) return;
  int prev = -1;
  const bool switch_device = cudaGetDevice(&prev) == cudaSuccess && prev != impl_->device;
  if (switch_device) cudaSetDevice(impl_->device);
  impl_->w = DeviceMoeLayer{};  // cudaFree: synchronizes, so no forward in flight still reads the weights
  if (switch_device) cudaSetDevice(prev);
}

const MoeBlockDims& MoeLayerGpu::dims() const { return impl_->dims; }
int MoeLayerGpu::device() const { return impl_->device; }
size_t MoeLayerGpu::weight_bytes() const { return impl_->w.bytes(); }

void MoeLayerGpu::forward(const uint16_t* x, const uint16_t* x_lo, int64_t T, float* h, bool accumulate,
                          int32_t* topk_ids, float* topk_w, cudaStream_t stream) const {
  const Impl& m = *impl_;
  const MoeBlockDims& d = m.dims;
  MOESQ_CHECK(T >= 0 && T <= (int64_t(1) << 20), "MoeLayerGpu: T=", T, " outside [0, 2^20]");
  if (T == 0) return;
  MOESQ_CHECK(x && h, "MoeLayerGpu: x and h are required");
  const DeviceScope scope(m.device);
  if (!accumulate) MOESQ_CUDA_CHECK(cudaMemsetAsync(h, 0, sizeof(float) * T * d.H, stream));
  const StreamScratch s(moe_workspace_bytes(d, T), stream);
  MoeBlockBuffers b = carve_moe_workspace(s.get(), d, T);
  if (topk_ids) b.topk_ids = topk_ids;  // the routes land straight in the caller's tensors
  if (topk_w) b.topk_w = topk_w;
  moe_block(d, m.w, b, x, x_lo, h, T, stream);
}

}  // namespace moesq::runtime
