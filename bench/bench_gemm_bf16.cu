// Benchmark of the batch-invariant dense GEMM (src/ops/gemm_bf16/) on the GPU engine's non-expert
// shapes of Qwen3-30B-A3B (q|k|v: N = 5120, K = 2048; o_proj: N = 2048, K = 4096; lm_head: N = 151,936,
// K = 2048), as the deterministic engine calls it (hi + lo input, fixed split-K, fp32 output), with
// the peer in the same run: cuBLAS cublasGemmEx (bf16 in, fp32 compute and output, two calls for
// hi + lo as the engine's non-deterministic mode does). Columns: the 64×64 tile kernel (what gemm_bf16
// runs for M > 64 where gemm_bf16_large_m_fits is false), the large-M path, cuBLAS; TFLOP/s count the
// FLOPs of the product (2·M·N·K per input part); the floor is those FLOPs at cuBLAS's measured rate on
// an 8192³ bf16 GEMM in this run. A program, not a test: it first checks the large-M output is the
// tile kernel's bit for bit and within 1e-3 (relative to Σ|x·w|) of cuBLAS, then times with CUDA events
// (bench_cuda_util.cuh: 5 warm-up runs, median of --reps). Weights stay in L2 when they fit (as in the engine's layer loop they do not).
//
// Usage: bench_gemm_bf16 [--out results.json] [--reps 20] [--quick]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_cuda_util.cuh"
#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "core/half.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/gemm_bf16/gemm_bf16_large_m.h"

namespace {

using namespace moesq;

using bench::median_us;

struct Shape {
  const char* name;
  int64_t N, K;
  bool lo, split;
};


std::vector<uint16_t> rand_bf16(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(nd(g));
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string out;
  int reps = 20;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--quick") quick = true;
    else MOESQ_FAIL("bench_gemm_bf16: unknown argument \"", a, "\" (usage: [--out F] [--reps N] [--quick])");
  }
  cudaStream_t s;
  MOESQ_CUDA_CHECK(cudaStreamCreate(&s));
  cublasHandle_t cb;
  CUBLAS_CHECK(cublasCreate(&cb));
  CUBLAS_CHECK(cublasSetStream(cb, s));
  const float one = 1.0f, zero = 0.0f;

  // The measured dense bf16 rate: cuBLAS on 8192³ (fp32 output).
  double rate_tflops = 0;
  {
    const int n = 8192;
    DevBuf<uint16_t> A(rand_bf16(size_t(n) * n, 1)), B(rand_bf16(size_t(n) * n, 2));
    DevBuf<float> C(size_t(n) * n);
    const double us = median_us([&](int) {
      CUBLAS_CHECK(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A.p, CUDA_R_16BF, n, B.p, CUDA_R_16BF, n,
                                &zero, C.p, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }, 5, s);
    rate_tflops = 2.0 * n * n * double(n) / us / 1e6;
  }
  std::printf("measured dense bf16 rate (cuBLAS 8192^3, fp32 out): %.1f TFLOP/s\n\n", rate_tflops);

  const Shape shapes[] = {{"qkv", 5120, 2048, true, true},
                          {"o_proj", 2048, 4096, true, true},
                          {"qkv-plain", 5120, 2048, false, false},
                          {"lm_head", 151936, 2048, true, false}};
  const std::vector<int64_t> Ms = quick ? std::vector<int64_t>{512, 8192} : std::vector<int64_t>{128, 512, 2048, 8192};
  nlohmann::json rows = nlohmann::json::array();
  std::printf("| GEMM | M | N | K | hi+lo | split | tile 64×64 µs | large-M µs | cuBLAS µs | large-M TFLOP/s | "
              "floor | vs tile | vs cuBLAS |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes)
    for (int64_t M : Ms) {
      if (std::string(sh.name) == "lm_head" && M > 512) continue;  // the engine's lm_head sees the sampled rows
      const int64_t N = sh.N, K = sh.K;
      DevBuf<uint16_t> x(rand_bf16(size_t(M) * K, 10 + M)), xl(rand_bf16(size_t(M) * K, 11 + M, 1.0f / 512));
      DevBuf<uint16_t> w(rand_bf16(size_t(N) * K, 12 + N));
      DevBuf<float> y(size_t(M) * N), yt(size_t(M) * N), yc(size_t(M) * N);
      DevBuf<float> ws(sh.split ? ops::gemm_bf16_split_floats(M, N, K) : 1);
      ops::GemmBf16Args g;
      g.x = x.p, g.x_lo = sh.lo ? xl.p : nullptr, g.w = w.p, g.M = M, g.N = N, g.K = K, g.ldy = N;
      g.split_ws = sh.split ? ws.p : nullptr;
      auto run_new = [&] { g.y_f32 = y.p; ops::detail::gemm_bf16_large_m(g, s); };
      auto run_tile = [&] { g.y_f32 = yt.p; ops::detail::gemm_bf16_tile(g, s); };
      auto run_cublas = [&] {
        const int n = int(N), m = int(M), k = int(K);
        CUBLAS_CHECK(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w.p, CUDA_R_16BF, k, x.p, CUDA_R_16BF, k,
                                  &zero, yc.p, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (sh.lo)
          CUBLAS_CHECK(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w.p, CUDA_R_16BF, k, xl.p, CUDA_R_16BF,
                                    k, &one, yc.p, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      run_new();
      run_tile();
      run_cublas();
      MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
      const std::vector<float> a = y.download(), b = yt.download(), c = yc.download();
      size_t differ = 0;
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        uint32_t ua, ub;
        std::memcpy(&ua, &a[i], 4);
        std::memcpy(&ub, &b[i], 4);
        differ += ua != ub;
        // Σ|x·w| ≈ √K · (rms product) for unit normals: bound the difference relative to that scale.
        worst = std::max(worst, std::fabs(double(a[i]) - double(c[i])) / std::sqrt(double(K)));
      }
      MOESQ_CHECK(differ == 0, sh.name, " M=", M, ": ", differ, " outputs differ from the 64x64 tile kernel");
      MOESQ_CHECK(worst < 1e-3, sh.name, " M=", M, ": differs from cuBLAS by ", worst, " (relative)");
      const double t_tile = median_us([&](int) { run_tile(); }, reps, s);
      const double t_new = median_us([&](int) { run_new(); }, reps, s);
      const double t_cub = median_us([&](int) { run_cublas(); }, reps, s);
      const double flops = 2.0 * M * N * K * (sh.lo ? 2 : 1);
      const double tflops = flops / t_new / 1e6, floor_us = flops / (rate_tflops * 1e6);
      std::printf("| %s | %lld | %lld | %lld | %s | %s | %.1f | %.1f | %.1f | %.1f | %.0f %% | %.2f× | %.2f× |\n",
                  sh.name, (long long)M, (long long)N, (long long)K, sh.lo ? "yes" : "no", sh.split ? "yes" : "no",
                  t_tile, t_new, t_cub, tflops, 100.0 * floor_us / t_new, t_tile / t_new, t_cub / t_new);
      std::fflush(stdout);
      rows.push_back({{"gemm", sh.name}, {"M", M}, {"N", N}, {"K", K}, {"hi_lo", sh.lo}, {"split", sh.split},
                      {"tile_us", t_tile}, {"large_m_us", t_new}, {"cublas_us", t_cub}, {"tflops", tflops},
                      {"floor_fraction", floor_us / t_new}, {"speedup_vs_tile", t_tile / t_new},
                      {"ratio_vs_cublas", t_cub / t_new}});
    }
  if (!out.empty()) {
    std::ofstream f(out);
    f << nlohmann::json{{"rate_tflops", rate_tflops}, {"rows", rows}}.dump(2) << "\n";
  }
  CUBLAS_CHECK(cublasDestroy(cb));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gemm_bf16: %s\n", e.what());
  return 1;
}
