// The GPU rows, targets and W4A4 error of one expert (compress/expert_cuda.h).
#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "compress/attention_cuda.h"
#include "compress/cuda_context.cuh"
#include "compress/expert_cuda.h"
#include "ops/fake_quant/fake_quant.h"
#include "ops/gather_f32/gather_f32.h"
#include "ops/scatter_add_f32/scatter_add_f32.h"
#include "ops/swiglu_train/swiglu_train.h"
#include "ops/weighted_mse/weighted_mse.h"

namespace moesq::compress {

namespace {

using gpu::Scratch;

constexpr int64_t kChunkRows = 4096;  // rows per GEMM pass (bounds the [rows, 2I] intermediate)

struct Context {
  gpu::ThreadContext& t = gpu::thread_context();
  Scratch<float> X, Y, w_gu, w_d, ab, h, xq, yq, zeros, ones;
  gpu::SplitOperand w_gu_s, w_d_s, x_s, h_s;  // the TF32 parts of forward's GEMM operands
  Scratch<double> row_loss;
  Scratch<int32_t> flag;
  // The layer's propagation (routed_experts_cuda): its inputs, outputs, routes and one chunk of rows.
  Scratch<float> lx, ly, lw, lxe, lye;
  Scratch<int64_t> lidx;
};
Context& context() {
  thread_local Context ctx;
  return ctx;
}

// The host weights into the thread's w_gu [2I, H] (gate rows, then up rows) and w_d [H, I].
void upload_weights(Context& g, const float* gate, const float* up, const float* down, int64_t H, int64_t I) {
  const size_t n = static_cast<size_t>(I * H);
  float* gu = g.w_gu.get(2 * n);
  float* d = g.w_d.get(n);
  g.t.h2d(gu, gate, sizeof(float) * n);
  g.t.h2d(gu + n, up, sizeof(float) * n);
  g.t.h2d(d, down, sizeof(float) * n);
  g.w_gu_s.split(g.t, gu, 2 * n);  // once per expert: every chunk's GEMMs read the parts
  g.w_d_s.split(g.t, d, n);
}

// y [m, H] = (silu(x·gateᵀ) ⊙ (x·upᵀ)) · downᵀ on m device rows x [m, H], with Q_a on h when
// act_block > 0 (the caller quantizes x), through the thread's w_gu / w_d (their TF32 parts: both
// GEMMs are 3xTF32, gpu::sgemm_3xtf32, fp32-class accuracy at tensor-core rates).
void forward(Context& g, const float* x, int64_t m, int64_t H, int64_t I, int act_block, float* y) {
  float* ab = g.ab.get(static_cast<size_t>(kChunkRows * 2 * I));
  float* h = g.h.get(static_cast<size_t>(kChunkRows * I));
  // Row-major C [m, N] = A [m, K] · Bᵀ (B [N, K]) is column-major Cᵀ = B · Aᵀ; 3xTF32 (fp32-class).
  g.x_s.split(g.t, x, static_cast<size_t>(m * H));
  gpu::sgemm_3xtf32(g.t, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(2 * I), static_cast<int>(m), static_cast<int>(H),
                    g.w_gu_s, static_cast<int>(H), g.x_s, static_cast<int>(H), 0.0f, ab, static_cast<int>(2 * I));
  ops::swiglu_train_forward({.rows = m, .I = I, .ab = ab, .h = h, .quantize = act_block > 0,
                             .block = act_block > 0 ? act_block : 32, .nonfinite = g.flag.b.p, .dh = nullptr,
                             .dab = nullptr},
                            g.t.stream);
  g.h_s.split(g.t, h, static_cast<size_t>(m * I));
  gpu::sgemm_3xtf32(g.t, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(H), static_cast<int>(m), static_cast<int>(I),
                    g.w_d_s, static_cast<int>(I), g.h_s, static_cast<int>(I), 0.0f, y, static_cast<int>(H));
}

void reset_flag(Context& g) {
  g.flag.get(1);
  MOESQ_CUDA_CHECK(cudaMemsetAsync(g.flag.b.p, 0, sizeof(int32_t), g.t.stream));
}

int32_t read_flag(Context& g) {
  int32_t v = 0;
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(&v, g.flag.b.p, sizeof(int32_t), cudaMemcpyDeviceToHost, g.t.stream));
  g.t.sync();
  return v;
}

DeviceRows rows_cuda(const model::ExpertWeights& w, int64_t H, int64_t I, const ExpertCalib& c) {
  Context& g = context();
  const int64_t n = c.n;
  const size_t nH = static_cast<size_t>(std::max<int64_t>(n, 1) * H);
  float* X = g.X.get(nH);
  float* Y = g.Y.get(nH);
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(g.t.blas, CUBLAS_PEDANTIC_MATH));
  if (n > 0 && c.dev_X) {  // device-resident states: gathered from the layer's X on the device
    MOESQ_CHECK(static_cast<int64_t>(c.rows.size()) == n, "expert rows on the GPU: ", c.rows.size(),
                " row ids for ", n, " rows");
    int64_t* idx = g.lidx.get(static_cast<size_t>(n));
    g.t.h2d(idx, c.rows.data(), sizeof(int64_t) * n);
    const int64_t src_rows = *std::max_element(c.rows.begin(), c.rows.end()) + 1;
    ops::gather_f32({.src = c.dev_X, .src_rows = src_rows, .C = H, .idx = idx, .m = n, .out = X}, g.t.stream);
  } else if (n > 0) {
    g.t.h2d(X, c.X.data(), sizeof(float) * n * H);
  }
  upload_weights(g, w.gate.data(), w.up.data(), w.down.data(), H, I);
  reset_flag(g);
  for (int64_t t0 = 0; t0 < n; t0 += kChunkRows)
    forward(g, X + t0 * H, std::min(kChunkRows, n - t0), H, I, 0, Y + t0 * H);
  MOESQ_CHECK(read_flag(g) == 0, "the expert's outputs on its calibration rows hold a NaN or an infinity "
                                 "(its weights or inputs are not finite)");
  return {X, Y};
}

double rel_error_cuda(const DeviceRows& rows, int64_t n, int64_t H, int64_t I, const float* gate, const float* up,
                      const float* down, int act_block, float* y_out) {
  Context& g = context();
  const cudaStream_t s = g.t.stream;
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(g.t.blas, CUBLAS_PEDANTIC_MATH));
  upload_weights(g, gate, up, down, H, I);
  const size_t cH = static_cast<size_t>(kChunkRows * H);
  float* xq = g.xq.get(cH);
  float* yq = g.yq.get(cH);
  float* zeros = g.zeros.get(cH);
  float* ones = g.ones.get(static_cast<size_t>(kChunkRows));
  double* rl = g.row_loss.get(static_cast<size_t>(2 * kChunkRows));
  MOESQ_CUDA_CHECK(cudaMemsetAsync(zeros, 0, sizeof(float) * cH, s));
  const std::vector<float> host_ones(static_cast<size_t>(kChunkRows), 1.0f);
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(ones, host_ones.data(), sizeof(float) * kChunkRows, cudaMemcpyHostToDevice, s));
  reset_flag(g);
  std::vector<double> host_rl(static_cast<size_t>(2 * kChunkRows));
  double num = 0.0, den = 0.0;
  for (int64_t t0 = 0; t0 < n; t0 += kChunkRows) {
    const int64_t m = std::min(kChunkRows, n - t0);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(xq, rows.X + t0 * H, sizeof(float) * m * H, cudaMemcpyDeviceToDevice, s));
    ops::fake_quant({.x = xq, .rows = m, .K = H, .block = act_block, .per_row = true, .amax = nullptr,
                     .nonfinite = g.flag.b.p},
                    s);
    // Ŷ into y_out when given: the chunks and GEMM shapes of routed_experts_device, so the same bits.
    float* yo = y_out ? y_out + t0 * H : yq;
    forward(g, xq, m, H, I, act_block, yo);
    const float* y_ref = rows.Y + t0 * H;
    // Σ_o (ŷ − y)² and Σ_o (0 − y)² per row, in fp64 (weights 1, no scaling).
    ops::weighted_mse({.rows = m, .H = H, .y = yo, .y_ref = y_ref, .w = ones, .inv_norm = 1.0, .dy = nullptr,
                       .row_loss = rl},
                      s);
    ops::weighted_mse({.rows = m, .H = H, .y = zeros, .y_ref = y_ref, .w = ones, .inv_norm = 1.0, .dy = nullptr,
                       .row_loss = rl + kChunkRows},
                      s);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(host_rl.data(), rl, sizeof(double) * 2 * kChunkRows, cudaMemcpyDeviceToHost, s));
    g.t.sync();
    for (int64_t i = 0; i < m; ++i) {
      num += host_rl[static_cast<size_t>(i)];
      den += host_rl[static_cast<size_t>(kChunkRows + i)];
    }
  }
  MOESQ_CHECK(read_flag(g) == 0, "the compressed expert's W4A4 outputs hold a NaN or an infinity");
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  return num / den;
}

const ExpertDevice kExpertDeviceCuda{.rows = rows_cuda, .rel_error = rel_error_cuda};

// The routed part of DecoderModel::moe_block on device rows dX [n, H] (unquantized; Q_a'd here into a
// copy, once: Q_a is per row, so every expert sees the same quantized row the CPU's per-expert Q_a
// gives), then per expert in ascending id order, per chunk of its rows: gather → gate|up GEMM → SwiGLU
// (+ Q_a) → down GEMM → y[token] += weight · out (ops/scatter_add_f32). Every expert's weights pass once
// through the thread's pinned staging. stored / kept (DeviceStates::expert_outputs, or null): an expert
// with kept[e] = 1 has its outputs at stored + (its first route in routes_by_expert order) · H already
// (rel_error_cuda's y_out: the same chunks, so the same bits) and is only added. Returns y [n, H] in the
// thread's scratch (valid until the next call), on the thread's stream.
float* routed_experts_device(Context& g, const std::vector<model::ExpertWeights>& experts, int64_t H, int64_t I,
                             const float* dX, const model::Routes& r, int act_block, const float* stored = nullptr,
                             const uint8_t* kept = nullptr) {
  const int64_t n = r.n, k = r.k, E = static_cast<int64_t>(experts.size());
  MOESQ_CHECK(static_cast<int64_t>(r.expert.size()) == n * k && static_cast<int64_t>(r.weight.size()) == n * k,
              "routed experts on the GPU: the routes hold ", r.expert.size(), " ids for n = ", n, ", top-k ", k);
  // The routes of each expert in token order: the destination row and weight of each.
  const RoutesByExpert by = routes_by_expert(r, E);
  const std::vector<int64_t>& start = by.start;
  const std::vector<int64_t>& ids = by.ids;
  std::vector<int64_t> idx(static_cast<size_t>(n * k));
  std::vector<float> w(static_cast<size_t>(n * k));
  for (size_t at = 0; at < ids.size(); ++at) {
    idx[at] = ids[at] / k;
    w[at] = r.weight[static_cast<size_t>(ids[at])];
  }
  const cudaStream_t s = g.t.stream;
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(g.t.blas, CUBLAS_PEDANTIC_MATH));
  float* dxq = g.lx.get(static_cast<size_t>(std::max<int64_t>(n, 1) * H));
  float* dy = g.ly.get(static_cast<size_t>(std::max<int64_t>(n, 1) * H));
  float* dw = g.lw.get(static_cast<size_t>(std::max<int64_t>(n * k, 1)));
  int64_t* didx = g.lidx.get(static_cast<size_t>(std::max<int64_t>(n * k, 1)));
  float* xe = g.lxe.get(static_cast<size_t>(kChunkRows * H));
  float* ye = g.lye.get(static_cast<size_t>(kChunkRows * H));
  if (n == 0) return dy;
  g.t.h2d(didx, idx.data(), sizeof(int64_t) * n * k);
  g.t.h2d(dw, w.data(), sizeof(float) * n * k);
  MOESQ_CUDA_CHECK(cudaMemsetAsync(dy, 0, sizeof(float) * n * H, s));
  auto is_kept = [&](int64_t e) { return stored && kept && kept[e]; };
  bool compute = false;  // some expert with rows is not kept: X is needed, Q_a'd
  for (int64_t e = 0; e < E; ++e)
    compute |= start[static_cast<size_t>(e) + 1] > start[static_cast<size_t>(e)] && !is_kept(e);
  if (compute && dxq != dX)
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(dxq, dX, sizeof(float) * n * H, cudaMemcpyDeviceToDevice, s));
  if (compute && act_block > 0)
    ops::fake_quant({.x = dxq, .rows = n, .K = H, .block = act_block, .per_row = true, .amax = nullptr,
                     .nonfinite = g.flag.b.p},
                    s);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = start[static_cast<size_t>(e)], ne = start[static_cast<size_t>(e) + 1] - b;
    if (ne == 0) continue;
    if (is_kept(e)) {
      for (int64_t t0 = 0; t0 < ne; t0 += kChunkRows)
        ops::scatter_add_f32({.src = stored + (b + t0) * H, .w = dw + b + t0, .idx = didx + b + t0,
                              .m = std::min(kChunkRows, ne - t0), .C = H, .y = dy, .y_rows = n},
                             s);
      continue;
    }
    const model::ExpertWeights& ew = experts[static_cast<size_t>(e)];
    MOESQ_CHECK(static_cast<int64_t>(ew.gate.size()) == I * H && static_cast<int64_t>(ew.up.size()) == I * H &&
                    static_cast<int64_t>(ew.down.size()) == H * I,
                "routed experts on the GPU: expert ", e, " is not loaded with [", I, ", ", H, "] weights");
    upload_weights(g, ew.gate.data(), ew.up.data(), ew.down.data(), H, I);
    for (int64_t t0 = 0; t0 < ne; t0 += kChunkRows) {
      const int64_t m = std::min(kChunkRows, ne - t0);
      ops::gather_f32({.src = dxq, .src_rows = n, .C = H, .idx = didx + b + t0, .m = m, .out = xe}, s);
      forward(g, xe, m, H, I, act_block, ye);
      ops::scatter_add_f32({.src = ye, .w = dw + b + t0, .idx = didx + b + t0, .m = m, .C = H, .y = dy, .y_rows = n},
                           s);
    }
  }
  return dy;
}

constexpr const char* kNonFiniteLayerOutput =
    "the layer's W4A4 expert outputs hold a NaN or an infinity (its MoE inputs or compressed weights are not finite)";

// routed_experts_device on host rows X (LayerDevice::routed_experts).
// logits [n, E] = X [n, H] (device) · routerᵀ (host [E, H]) by one pedantic cuBLAS SGEMM: the ONE router
// GEMM of both state paths (DeviceStates::router_logits, LayerDevice::router_logits), so they route alike.
std::vector<float> router_logits_device(Context& g, const float* dX, int64_t n, int64_t H,
                                        const std::vector<float>& router, int64_t E) {
  MOESQ_CHECK(static_cast<int64_t>(router.size()) == E * H, "router logits on the GPU: the router holds ",
              router.size(), " values, expected E·H = ", E * H);
  std::vector<float> logits(static_cast<size_t>(n * E));
  if (n == 0) return logits;
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(g.t.blas, CUBLAS_PEDANTIC_MATH));
  float* w = g.w_d.get(static_cast<size_t>(E * H));
  float* out = g.ly.get(static_cast<size_t>(n * E));
  g.t.h2d(w, router.data(), sizeof(float) * E * H);
  const float one = 1.0f, zero = 0.0f;
  MOESQ_CUBLAS_CHECK(cublasSgemm(g.t.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(E), static_cast<int>(n),
                                 static_cast<int>(H), &one, w, static_cast<int>(H), dX, static_cast<int>(H), &zero, out,
                                 static_cast<int>(E)));
  g.t.d2h(logits.data(), out, sizeof(float) * n * E);
  return logits;
}

std::vector<float> router_logits_cuda(const std::vector<float>& X, int64_t n, int64_t H,
                                      const std::vector<float>& router, int64_t E) {
  MOESQ_CHECK(static_cast<int64_t>(X.size()) == n * H, "router logits on the GPU: X holds ", X.size(),
              " values for n = ", n, " rows of H = ", H);
  if (n == 0) return {};
  Context& g = context();
  float* dx = g.lx.get(static_cast<size_t>(n * H));
  g.t.h2d(dx, X.data(), sizeof(float) * n * H);
  return router_logits_device(g, dx, n, H, router, E);
}

std::vector<float> routed_experts_cuda(const std::vector<model::ExpertWeights>& experts, int64_t H, int64_t I,
                                       const std::vector<float>& X, const model::Routes& r, int act_block) {
  const int64_t n = r.n;
  MOESQ_CHECK(static_cast<int64_t>(X.size()) == n * H, "routed experts on the GPU: X holds ", X.size(),
              " values for n = ", n, " rows of H = ", H);
  std::vector<float> y(static_cast<size_t>(n * H), 0.0f);
  if (n == 0) return y;
  Context& g = context();
  reset_flag(g);
  float* dx = g.lx.get(static_cast<size_t>(n * H));
  g.t.h2d(dx, X.data(), sizeof(float) * n * H);
  const float* dy = routed_experts_device(g, experts, H, I, dx, r, act_block);  // Q_a in place in dx
  g.t.d2h(y.data(), dy, sizeof(float) * n * H);
  MOESQ_CHECK(read_flag(g) == 0, kNonFiniteLayerOutput);
  return y;
}

// The calibration states on the device (DeviceStates): h and X whole, packed row after row.
class DeviceStatesCuda final : public DeviceStates {
 public:
  void upload(const std::vector<std::vector<float>>& h, int64_t H) override {
    H_ = H;
    offset_.assign(h.size() + 1, 0);
    for (size_t i = 0; i < h.size(); ++i) {
      MOESQ_CHECK(static_cast<int64_t>(h[i].size()) % H == 0, "device states: sequence ", i, " holds ", h[i].size(),
                  " values, not a multiple of H = ", H);
      offset_[i + 1] = offset_[i] + static_cast<int64_t>(h[i].size()) / H;
    }
    const int64_t n = offset_.back();
    h_.alloc(static_cast<size_t>(std::max<int64_t>(n, 1) * H));
    X_.alloc(static_cast<size_t>(std::max<int64_t>(n, 1) * H));
    Context& g = context();
    for (size_t i = 0; i < h.size(); ++i) g.t.h2d(h_.p + offset_[i] * H, h[i].data(), sizeof(float) * h[i].size());
    g.t.sync();
  }
  const float* attention(const io::ModelSpec& spec, const model::LayerWeights& L) override {
    attention_rows_cuda(spec, L, h_.p, X_.p, offset_);
    context().t.sync();
    return X_.p;
  }
  std::vector<float> router_logits(const std::vector<float>& router, int64_t E) override {
    return router_logits_device(context(), X_.p, offset_.back(), H_, router, E);
  }
  // The buffer is granted against the previous MoE layer's low watermark of free memory (note_memory,
  // sampled by the workers while their scratch was held) with a tenth of the GPU kept free for larger
  // experts: the workers' scratch comes first. Before any layer has been sampled, nothing is granted.
  float* expert_outputs(int64_t routes) override {
    const size_t need = static_cast<size_t>(std::max<int64_t>(routes, 1) * H_);
    const size_t low = low_free_.exchange(kUnsampled);  // the next layer samples afresh
    const size_t have = Yq_.p ? sizeof(float) * Yq_.n : 0;
    if (low == kUnsampled || sizeof(float) * need + total_ / 10 > low + have) {
      Yq_ = DevBuf<float>();  // the workers need the room (or their need is not known yet)
      return nullptr;
    }
    if (Yq_.p && Yq_.n >= need) return Yq_.p;
    Yq_ = DevBuf<float>();  // frees a smaller one first
    Yq_.alloc(need);
    return Yq_.p;
  }
  void note_memory() override {
    size_t free = 0, total = 0;
    MOESQ_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    total_ = total;
    size_t low = low_free_.load();
    while (free < low && !low_free_.compare_exchange_weak(low, free)) {
    }
  }
  void propagate(const std::vector<model::ExpertWeights>& experts, int64_t I, const model::Routes& r, int act_block,
                 const std::vector<uint8_t>& kept, const model::ExpertWeights* shared, int64_t shared_I) override {
    const int64_t n = offset_.back();
    MOESQ_CHECK(r.n == n, "device states: routes of ", r.n, " rows for ", n, " states");
    MOESQ_CHECK(kept.empty() || (static_cast<int64_t>(kept.size()) == static_cast<int64_t>(experts.size()) && Yq_.p),
                "device states: ", kept.size(), " kept-output flags for ", experts.size(), " experts");
    if (n == 0) return;
    Context& g = context();
    reset_flag(g);
    // The shared expert first, into Ys_ (routed_experts_device's output lives in the thread's scratch,
    // which the routed call below reuses).
    if (shared) plain_mlp_rows(g, *shared, shared_I, Ys_);
    float* dy = routed_experts_device(g, experts, H_, I, X_.p, r, act_block, kept.empty() ? nullptr : Yq_.p,
                                      kept.empty() ? nullptr : kept.data());
    // y += shared (the host path's y[i] += ys[i]), then h += y (the CPU's order: the MLP part first,
    // then the residual add), in pieces the int count holds. axpy with α = 1 is one rounded add.
    if (shared) add_rows(g, Ys_.p, dy);
    add_rows(g, dy, h_.p);
    MOESQ_CHECK(read_flag(g) == 0, kNonFiniteLayerOutput);
  }
  void propagate_mlp(const model::ExpertWeights& W, int64_t I) override {
    const int64_t n = offset_.back();
    if (n == 0) return;
    Context& g = context();
    reset_flag(g);
    plain_mlp_rows(g, W, I, Ys_);
    add_rows(g, Ys_.p, h_.p);
    MOESQ_CHECK(read_flag(g) == 0, "the dense MLP layer's outputs hold a NaN or an infinity (its inputs or weights "
                                   "are not finite)");
  }
  void download(std::vector<std::vector<float>>& h) override {
    MOESQ_CHECK(h.size() + 1 == offset_.size(), "device states: ", h.size(), " host sequences for ",
                offset_.size() - 1, " on the device");
    Context& g = context();
    for (size_t i = 0; i < h.size(); ++i) {
      h[i].resize(static_cast<size_t>((offset_[i + 1] - offset_[i]) * H_));
      g.t.d2h(h[i].data(), h_.p + offset_[i] * H_, sizeof(float) * h[i].size());
    }
  }

 private:
  // out [n, H] = the plain SwiGLU MLP W (gate/up [I, H], down [H, I]) on X, no Q_a: every row routed to
  // the one expert with weight 1, in plain_mlp_chunk_rows chunks (plain_mlp_on_device's GEMM shapes).
  void plain_mlp_rows(Context& g, const model::ExpertWeights& W, int64_t I, DevBuf<float>& out) {
    const int64_t n = offset_.back(), chunk = plain_mlp_chunk_rows(H_, I);
    if (out.n < static_cast<size_t>(n * H_)) out = DevBuf<float>(), out.alloc(static_cast<size_t>(n * H_));
    const std::vector<model::ExpertWeights> one = {W};
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
      const int64_t m = std::min(chunk, n - r0);
      const float* y = routed_experts_device(g, one, H_, I, X_.p + r0 * H_, one_expert_routes(m), 0);
      MOESQ_CUDA_CHECK(cudaMemcpyAsync(out.p + r0 * H_, y, sizeof(float) * m * H_, cudaMemcpyDeviceToDevice, g.t.stream));
    }
  }
  // y [n, H] += x [n, H] (cuBLAS axpy, α = 1), in pieces the int count holds.
  void add_rows(Context& g, const float* x, float* y) {
    const float one = 1.0f;
    const int64_t total = offset_.back() * H_, piece = int64_t{1} << 30;
    for (int64_t o = 0; o < total; o += piece)
      MOESQ_CUBLAS_CHECK(cublasSaxpy(g.t.blas, static_cast<int>(std::min(piece, total - o)), &one, x + o, 1, y + o, 1));
  }

  int64_t H_ = 0;
  std::vector<int64_t> offset_;  // [S + 1] first row of each sequence
  DevBuf<float> h_, X_;          // [n, H] each
  DevBuf<float> Yq_;             // [routes, H] the experts' W4A4 outputs (expert_outputs), or empty
  DevBuf<float> Ys_;             // [n, H] a dense layer's or the shared expert's outputs, or empty
  static constexpr size_t kUnsampled = std::numeric_limits<size_t>::max();
  std::atomic<size_t> low_free_{kUnsampled};  // the least free memory note_memory saw since expert_outputs
  std::atomic<size_t> total_{0};              // the GPU's memory (bytes)
};

std::unique_ptr<DeviceStates> make_states_cuda() { return std::make_unique<DeviceStatesCuda>(); }

const LayerDevice kLayerDeviceCuda{
    .moe_inputs = moe_inputs_cuda, .routed_experts = routed_experts_cuda, .router_logits = router_logits_cuda,
    .make_states = make_states_cuda};

}  // namespace

const ExpertDevice* expert_device_cuda() { return &kExpertDeviceCuda; }

const LayerDevice* layer_device_cuda() { return &kLayerDeviceCuda; }

}  // namespace moesq::compress
