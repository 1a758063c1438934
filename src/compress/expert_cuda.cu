// The GPU rows, targets and W4A4 error of one expert (compress/expert_cuda.h).
#include <algorithm>
#include <limits>
#include <vector>

#include "compress/cuda_context.cuh"
#include "compress/expert_cuda.h"
#include "ops/fake_quant/fake_quant.h"
#include "ops/swiglu_train/swiglu_train.h"
#include "ops/weighted_mse/weighted_mse.h"

namespace moesq::compress {

namespace {

using gpu::Scratch;

constexpr int64_t kChunkRows = 4096;  // rows per GEMM pass (bounds the [rows, 2I] intermediate)

struct Context {
  gpu::ThreadContext& t = gpu::thread_context();
  Scratch<float> X, Y, w_gu, w_d, ab, h, xq, yq, zeros, ones;
  Scratch<double> row_loss;
  Scratch<int32_t> flag;
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
}

// y [m, H] = (silu(x·gateᵀ) ⊙ (x·upᵀ)) · downᵀ on m device rows x [m, H], with Q_a on h when
// act_block > 0 (the caller quantizes x), through the thread's w_gu / w_d.
void forward(Context& g, const float* x, int64_t m, int64_t H, int64_t I, int act_block, float* y) {
  float* ab = g.ab.get(static_cast<size_t>(kChunkRows * 2 * I));
  float* h = g.h.get(static_cast<size_t>(kChunkRows * I));
  const float one = 1.0f, zero = 0.0f;
  // Row-major C [m, N] = A [m, K] · Bᵀ (B [N, K]) is column-major Cᵀ = B · Aᵀ.
  MOESQ_CUBLAS_CHECK(cublasSgemm(g.t.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(2 * I), static_cast<int>(m),
                                 static_cast<int>(H), &one, g.w_gu.b.p, static_cast<int>(H), x, static_cast<int>(H),
                                 &zero, ab, static_cast<int>(2 * I)));
  ops::swiglu_train_forward({.rows = m, .I = I, .ab = ab, .h = h, .quantize = act_block > 0,
                             .block = act_block > 0 ? act_block : 32, .nonfinite = g.flag.b.p, .dh = nullptr,
                             .dab = nullptr},
                            g.t.stream);
  MOESQ_CUBLAS_CHECK(cublasSgemm(g.t.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(H), static_cast<int>(m),
                                 static_cast<int>(I), &one, g.w_d.b.p, static_cast<int>(I), h, static_cast<int>(I),
                                 &zero, y, static_cast<int>(H)));
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
  if (n > 0)
    g.t.h2d(X, c.X.data(), sizeof(float) * n * H);
  upload_weights(g, w.gate.data(), w.up.data(), w.down.data(), H, I);
  reset_flag(g);
  for (int64_t t0 = 0; t0 < n; t0 += kChunkRows)
    forward(g, X + t0 * H, std::min(kChunkRows, n - t0), H, I, 0, Y + t0 * H);
  MOESQ_CHECK(read_flag(g) == 0, "the expert's outputs on its calibration rows hold a NaN or an infinity "
                                 "(its weights or inputs are not finite)");
  return {X, Y};
}

double rel_error_cuda(const DeviceRows& rows, int64_t n, int64_t H, int64_t I, const float* gate, const float* up,
                      const float* down, int act_block) {
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
    forward(g, xq, m, H, I, act_block, yq);
    const float* y_ref = rows.Y + t0 * H;
    // Σ_o (ŷ − y)² and Σ_o (0 − y)² per row, in fp64 (weights 1, no scaling).
    ops::weighted_mse({.rows = m, .H = H, .y = yq, .y_ref = y_ref, .w = ones, .inv_norm = 1.0, .dy = nullptr,
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

}  // namespace

const ExpertDevice* expert_device_cuda() { return &kExpertDeviceCuda; }

}  // namespace moesq::compress
