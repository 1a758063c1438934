// SGPTQ of one expert on the GPU (compress/sgptq_cuda.h): the CPU solver's stages (compress/sgptq.cpp,
// compress/hessian.cpp, methods/sgptq.cpp) on the device, on the calling thread's own stream, with
// its device memory kept across the experts the thread solves (grow-only scratch: no cudaMalloc /
// cudaFree per expert once the largest expert has been seen).
#include <thrust/execution_policy.h>
#include <thrust/reverse.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "compress/cuda_context.cuh"
#include "compress/hessian.h"
#include "compress/pipeline.h"
#include "compress/sgptq_cuda.h"
#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "format/nvfp4.h"
#include "ops/sgptq_columns/sgptq_columns.h"
#include "ops/swiglu_train/swiglu_train.h"
#include "ops/widen_f64/widen_f64.h"

namespace moesq::compress {

namespace {

// Rows widened to fp64 per DSYRK: bounds the chunk at kChunkRows·K doubles (hessian.cpp's chunk).
constexpr int64_t kChunkRows = 4096;

using gpu::Scratch;

// The thread's SGPTQ scratch (its stream and handles: gpu::thread_context()).
struct Context {
  gpu::ThreadContext& t = gpu::thread_context();
  cudaStream_t s = t.stream;
  cublasHandle_t blas = t.blas;
  cusolverDnHandle_t solver = t.solver;
  Scratch<float> X, ab, h, wq, dense, wf;
  Scratch<double> chunk, H, M, Wt, w64, err, row_loss, work;
  Scratch<uint8_t> patterns, scale_codes, value_codes, trtri_work;
  Scratch<int32_t> flags;  // [0] cuSOLVER info, [1] non-finite GPTQ error
  gpu::SplitOperand wq_s, x_s;  // the TF32 parts of inter_hessian's GEMM operands
  void sync() { t.sync(); }
};
Context& context() {
  thread_local Context ctx;
  return ctx;
}

// Adds 2 Σ_t x_t x_tᵀ / n over device rows x [rows, K] (rows of a total n) to H: column-major lower =
// row-major upper triangle (the other triangle is never written).
void add_rows(Context& g, const float* x, int64_t rows, int64_t K, int64_t n, double* H) {
  const double alpha = 2.0 / static_cast<double>(n), beta = 1.0;
  double* a = g.chunk.get(static_cast<size_t>(std::min(kChunkRows, rows) * K));
  for (int64_t t0 = 0; t0 < rows; t0 += kChunkRows) {
    const int64_t m = std::min(kChunkRows, rows - t0);
    ops::widen_f64({.x = x + t0 * K, .rows = m, .K = K, .w = nullptr, .out = a}, g.s);
    // Column-major A = the chunk as [K, m]: C = α A Aᵀ + β C.
    MOESQ_CUBLAS_CHECK(cublasDsyrk(g.blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, static_cast<int>(K),
                                   static_cast<int>(m), &alpha, a, static_cast<int>(K), &beta, H, static_cast<int>(K)));
  }
}

// H [K, K] zeroed, then 2 XᵀX / n over the device rows X [n, K].
void hessian(Context& g, const float* X, int64_t n, int64_t K, double* H) {
  MOESQ_CUDA_CHECK(cudaMemsetAsync(H, 0, sizeof(double) * K * K, g.s));
  if (n > 0) add_rows(g, X, n, K, n, H);
}

// The Hessian of down's inputs through the compressed gate|up wq [2I, H] (no activation quant):
// z = silu(X·gqᵀ) ⊙ (X·uqᵀ), H = 2 zᵀz / n.
void inter_hessian(Context& g, const float* X, int64_t n, int64_t H, int64_t I, const float* wq, double* Hz) {
  MOESQ_CUDA_CHECK(cudaMemsetAsync(Hz, 0, sizeof(double) * I * I, g.s));
  if (n == 0) return;
  const int64_t C = std::min(kChunkRows, n);
  float* ab = g.ab.get(static_cast<size_t>(C * 2 * I));
  float* z = g.h.get(static_cast<size_t>(C * I));
  g.wq_s.split(g.t, wq, static_cast<size_t>(2 * I * H));
  for (int64_t t0 = 0; t0 < n; t0 += C) {
    const int64_t m = std::min(C, n - t0);
    // Row-major ab [m, 2I] = X[t0:t0+m] · wqᵀ (column-major: abᵀ = wq · Xᵀ), 3xTF32 (fp32-class).
    g.x_s.split(g.t, X + t0 * H, static_cast<size_t>(m * H));
    gpu::sgemm_3xtf32(g.t, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(2 * I), static_cast<int>(m), static_cast<int>(H),
                      g.wq_s, static_cast<int>(H), g.x_s, static_cast<int>(H), 0.0f, ab, static_cast<int>(2 * I));
    ops::swiglu_train_forward({.rows = m, .I = I, .ab = ab, .h = z, .quantize = false, .block = 32,
                               .nonfinite = nullptr, .dh = nullptr, .dab = nullptr},
                              g.s);
    add_rows(g, z, m, I, n, Hz);
  }
}

// How a projection's Hessian was prepared (compress/sgptq.cpp's Prepared, without the matrices).
struct Factor {
  bool fallback = false;
  std::string reason;
  std::vector<char> dead;  // [K] inputs with diag H == 0 (their weights are zeroed)
  int64_t n_dead = 0;
};

// Diagonal of a [K, K] device matrix ↔ host (a strided copy).
void diag_to_host(Context& g, const double* A, int64_t K, double* d) {
  MOESQ_CUDA_CHECK(cudaMemcpy2DAsync(d, sizeof(double), A, sizeof(double) * (K + 1), sizeof(double), K,
                                     cudaMemcpyDeviceToHost, g.s));
  g.sync();
}
void diag_to_device(Context& g, double* A, int64_t K, const double* d) {
  MOESQ_CUDA_CHECK(cudaMemcpy2DAsync(A, sizeof(double) * (K + 1), d, sizeof(double), sizeof(double), K,
                                     cudaMemcpyHostToDevice, g.s));
  g.sync();  // d is the caller's host memory
}

int32_t info_to_host(Context& g, const int32_t* info) {
  int32_t v = 0;
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(&v, info, sizeof(int32_t), cudaMemcpyDeviceToHost, g.s));
  g.sync();
  return v;
}

// U (the upper Cholesky factor of H⁻¹) written over H [K, K] (row-major upper filled, the rest 0),
// by the CPU's route (hessian.cpp): damping and dead inputs on the diagonal, M = chol(J H J),
// M⁻¹, U = J M⁻¹ J. M [K, K] is scratch. On a fallback, U = identity.
Factor factor(Context& g, double* H, int64_t K, int64_t n, const SgptqOptions& opt, double* M) {
  Factor f;
  f.dead.assign(static_cast<size_t>(K), 0);
  auto identity = [&](std::string why) {
    f.fallback = true;
    f.reason = std::move(why);
    f.n_dead = 0;
    std::fill(f.dead.begin(), f.dead.end(), 0);
    MOESQ_CUDA_CHECK(cudaMemsetAsync(H, 0, sizeof(double) * K * K, g.s));
    const std::vector<double> ones(static_cast<size_t>(K), 1.0);
    diag_to_device(g, H, K, ones.data());
    return f;
  };
  if (n == 0) return identity("no calibration tokens: identity Hessian");
  if (n < opt.min_tokens)
    return identity("only " + std::to_string(n) + " calibration tokens (< min_tokens " +
                    std::to_string(opt.min_tokens) + "): identity Hessian");
  std::vector<double> d(static_cast<size_t>(K));
  diag_to_host(g, H, K, d.data());
  for (double v : d)
    if (!std::isfinite(v)) return identity("non-finite Hessian: identity Hessian");
  for (int64_t k = 0; k < K; ++k)
    if (d[k] == 0.0) {
      d[k] = 1.0;
      f.dead[k] = 1;
      ++f.n_dead;
    }
  double mean_diag = 0.0;
  for (int64_t k = 0; k < K; ++k) mean_diag += d[k];
  mean_diag /= static_cast<double>(K);
  const double damp = opt.percdamp * mean_diag;
  double max_diag = 0.0;
  for (int64_t k = 0; k < K; ++k) {
    d[k] += damp;
    max_diag = std::max(max_diag, d[k]);
  }
  diag_to_device(g, H, K, d.data());
  const std::string not_pd = "Hessian not positive definite after damping (percdamp " + std::to_string(opt.percdamp) +
                             ", " + std::to_string(n) + " tokens): identity Hessian";
  // J H J is the flat reversal of H; its row-major lower triangle (= column-major upper) is filled.
  thrust::reverse_copy(thrust::cuda::par_nosync.on(g.s), H, H + K * K, M);
  const int k = static_cast<int>(K);
  int lwork = 0;
  MOESQ_CUSOLVER_CHECK(cusolverDnDpotrf_bufferSize(g.solver, CUBLAS_FILL_MODE_UPPER, k, M, k, &lwork));
  double* work = g.work.get(static_cast<size_t>(std::max(lwork, 1)));
  int32_t* info = g.flags.get(2);
  MOESQ_CUSOLVER_CHECK(cusolverDnDpotrf(g.solver, CUBLAS_FILL_MODE_UPPER, k, M, k, work, lwork, info));
  if (info_to_host(g, info) != 0) return identity(not_pd);
  diag_to_host(g, M, K, d.data());  // the pivots L_jj (hessian.cpp pivots_ok)
  for (double v : d)
    if (!std::isfinite(v) || !(v > 0.0) || !(v * v > kMinPivotRel * max_diag)) return identity(not_pd);
  size_t dev_bytes = 0, host_bytes = 0;
  MOESQ_CUSOLVER_CHECK(cusolverDnXtrtri_bufferSize(g.solver, CUBLAS_FILL_MODE_UPPER, CUBLAS_DIAG_NON_UNIT, K,
                                                   CUDA_R_64F, M, K, &dev_bytes, &host_bytes));
  uint8_t* dev_work = g.trtri_work.get(std::max<size_t>(dev_bytes, 1));
  std::vector<uint8_t> host_work(std::max<size_t>(host_bytes, 1));
  MOESQ_CUSOLVER_CHECK(cusolverDnXtrtri(g.solver, CUBLAS_FILL_MODE_UPPER, CUBLAS_DIAG_NON_UNIT, K, CUDA_R_64F, M, K,
                                        dev_work, dev_bytes, host_work.data(), host_bytes, info));
  if (info_to_host(g, info) != 0) return identity(not_pd);
  thrust::reverse_copy(thrust::cuda::par_nosync.on(g.s), M, M + K * K, H);
  return f;
}

// One projection W [N, K] (host) against the factor U [K, K] (device): the column loop, then the
// codes read back and packed. dequant (optional, device [N, K]) receives the dequantized result.
SgptqResult solve(Context& g, const float* W, int64_t N, int64_t K, const double* U, const Factor& f, float gamma,
                  const SgptqOptions& opt, const std::string& name, float* dequant) {
  if (!(gamma > 0.0f)) gamma = format::nvfp4_tensor_scale(format::amax_abs(W, N * K));
  MOESQ_CHECK(std::isfinite(gamma), "sgptq: tensor ", name, " has a non-finite global scale");
  const int64_t G = K / format::kGroup, S = K / format::kSparseScaleBlock;
  const int64_t block = opt.block_size;
  // Wt [K, N] fp64 with the dead inputs' weights zeroed (not on a fallback: plain magnitude + RTN):
  // W uploaded as fp32, widened (ops/widen_f64), transposed (cuBLAS DGEAM), dead rows of Wt cleared.
  const size_t NK = static_cast<size_t>(N * K);
  float* wf = g.wf.get(NK);
  double* w64 = g.w64.get(NK);
  double* Wt = g.Wt.get(NK);
  g.t.h2d(wf, W, sizeof(float) * NK);
  ops::widen_f64({.x = wf, .rows = N, .K = K, .w = nullptr, .out = w64}, g.s);
  {
    const double one = 1.0, zero = 0.0;  // column-major: Wt [N, K] (ld N) = (w64 [K, N], ld K)ᵀ
    MOESQ_CUBLAS_CHECK(cublasDgeam(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(K), &one,
                                   w64, static_cast<int>(K), &zero, Wt, static_cast<int>(N), Wt, static_cast<int>(N)));
  }
  for (int64_t c = 0; c < K; ++c)
    if (f.dead[c]) MOESQ_CUDA_CHECK(cudaMemsetAsync(Wt + c * N, 0, sizeof(double) * N, g.s));
  uint8_t* pat = g.patterns.get(static_cast<size_t>(N * G));
  uint8_t* sc = g.scale_codes.get(static_cast<size_t>(N * S));
  uint8_t* vc = g.value_codes.get(static_cast<size_t>(N * K / 2));
  float* dense = g.dense.get(static_cast<size_t>(N * K));
  double* err = g.err.get(static_cast<size_t>(std::min(block, K) * N));
  double* row_loss = g.row_loss.get(static_cast<size_t>(N));
  int32_t* bad = g.flags.get(2) + 1;
  MOESQ_CUDA_CHECK(cudaMemsetAsync(row_loss, 0, sizeof(double) * N, g.s));
  MOESQ_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int32_t), g.s));
  const double minus_one = -1.0, one = 1.0;
  for (int64_t b0 = 0; b0 < K; b0 += block) {
    const int64_t b1 = std::min(b0 + block, K);
    ops::sgptq_columns({.N = N, .K = K, .b0 = b0, .b1 = b1, .Wt = Wt, .U = U, .gamma = gamma, .choose = true,
                        .pattern_at_group = opt.pattern_at_group, .gptq_from = 0, .patterns = pat,
                        .scale_codes = sc, .value_codes = vc, .dense_rounded = dense, .dequant = dequant,
                        .err = err, .row_loss = row_loss, .nonfinite = bad},
                       g.s);
    if (b1 < K) {
      // Row-major Wt[b1:K, :] −= U[b0:b1, b1:K]ᵀ · err [b1−b0, N] (column-major: Wtᵀ −= errᵀ · U_blk).
      MOESQ_CUBLAS_CHECK(cublasDgemm(g.blas, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(N), static_cast<int>(K - b1),
                                     static_cast<int>(b1 - b0), &minus_one, err, static_cast<int>(N), U + b0 * K + b1,
                                     static_cast<int>(K), &one, Wt + b1 * N, static_cast<int>(N)));
    }
  }
  SgptqResult res;
  res.fallback = f.fallback;
  res.fallback_reason = f.reason;
  res.dead_columns = f.n_dead;
  res.patterns.resize(static_cast<size_t>(N * G));
  res.dense_rounded.resize(static_cast<size_t>(N * K));
  std::vector<uint8_t> scales(static_cast<size_t>(N * S)), values(static_cast<size_t>(N * K / 2));
  std::vector<double> losses(static_cast<size_t>(N));
  int32_t nonfinite = 0;
  g.t.d2h(res.patterns.data(), pat, res.patterns.size());
  g.t.d2h(scales.data(), sc, scales.size());
  g.t.d2h(values.data(), vc, values.size());
  g.t.d2h(res.dense_rounded.data(), dense, sizeof(float) * res.dense_rounded.size());
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(losses.data(), row_loss, sizeof(double) * N, cudaMemcpyDeviceToHost, g.s));
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(&nonfinite, bad, sizeof(int32_t), cudaMemcpyDeviceToHost, g.s));
  g.sync();
  MOESQ_CHECK(nonfinite == 0, "sgptq on the GPU: tensor ", name,
              ": a GPTQ rounding error became NaN or infinite (the Hessian factor overflowed)");
  for (double l : losses) res.gptq_loss += l;
  res.packed = sgptq_pack(N, K, gamma, res.patterns, std::move(scales), values);
  return res;
}

}  // namespace

SgptqExpert sgptq_expert_cuda(const ExpertJob& job, const SgptqOptions& opt, ExpertReport& rep) {
  MOESQ_CHECK(!job.variant.gate_bias && !job.variant.up_bias && !job.variant.down_bias && !job.variant.clamped,
              "sgptq on the GPU: this family's experts have biases / a clamped SwiGLU (gpt-oss), which the GPU "
              "solver does not implement; use --device cpu");
  int devices = 0;
  MOESQ_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0,
              "sgptq on the GPU: no CUDA device found (use --device cpu)");
  const ExpertCalib& c = job.calib;
  const int64_t H = job.H, I = job.I, n = c.n;
  for (int p = 0; p < 3; ++p) sgptq_check_weights(job.weights(p), job.N(p), job.K(p), opt, job.names[p]);
  Context& g = context();
  const float* X = job.dev ? job.dev->X : nullptr;  // the rows already on the device, else uploaded here
  if (!X) {
    float* up = g.X.get(static_cast<size_t>(std::max<int64_t>(n, 1) * H));
    if (n > 0) g.t.h2d(up, c.X.data(), sizeof(float) * n * H);
    X = up;
  }
  const size_t sq = static_cast<size_t>(std::max(H * H, I * I));
  double* Hm = g.H.get(sq);
  double* M = g.M.get(sq);
  float* wq = g.wq.get(static_cast<size_t>(2 * I * H));  // the compressed gate rows, then up rows
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(g.blas, CUBLAS_PEDANTIC_MATH));  // fp32 GEMMs without TF32
  SgptqExpert s;
  hessian(g, X, n, H, Hm);
  const Factor fx = factor(g, Hm, H, n, opt, M);  // gate and up share it
  s.proj[0] = solve(g, job.w.gate.data(), I, H, Hm, fx, job.gs_gu, opt, job.names[0], wq);
  s.proj[1] = solve(g, job.w.up.data(), I, H, Hm, fx, job.gs_gu, opt, job.names[1], wq + I * H);
  inter_hessian(g, X, n, H, I, wq, Hm);
  const Factor fz = factor(g, Hm, I, n, opt, M);
  s.proj[2] = solve(g, job.w.down.data(), H, I, Hm, fz, job.gs_d, opt, job.names[2], nullptr);
  note_sgptq_fallbacks(s, rep);
  return s;
}

}  // namespace moesq::compress
