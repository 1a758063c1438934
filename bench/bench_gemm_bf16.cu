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
// --small-m (session 30): the decode regime instead — M ∈ {1, 8, 64} on the same shapes plus the router
// (N = 128), W streamed from HBM (16 distinct weight copies per timed graph, ≥ 8× the L2), gemm_bf16 as the
// engine calls it, the small-M kernel with 1, 2 and 4 token tiles per staged W tile (2 and 4 for
// M > 16), the decode path (session 31: a CTA of 128 columns and all tokens) with 8 warps × 16, 4 × 32 and 2 rows × 4 × 32 columns, the W-as-A path at register
// depths 3 / 4 / 6 (M ≤ 8), cuBLAS; each as TB/s of W read and as a fraction of the measured
// device-to-device copy rate (read + write bytes), the floor a weight stream can reach. Bits: every
// path equals gemm_bf16 for every row (checked first).
//
// Usage: bench_gemm_bf16 [--out results.json] [--reps 20] [--quick] [--small-m [--only SHAPE] [--m M]]
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
#include "ops/gemm_bf16/gemm_bf16_decode.h"
#include "ops/gemm_bf16/gemm_bf16_small_m.h"
#include "ops/gemm_bf16/gemm_bf16_wa.h"

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

// Median µs of one call of `fn(copy)` over `copies` weight copies, captured as one CUDA graph (as the
// engine replays its decode step: kernels back to back, PDL edges where the launcher sets them).
template <typename F>
double graph_us(F&& fn, int copies, int reps, cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  MOESQ_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int c = 0; c < copies; ++c) fn(c);
  MOESQ_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  MOESQ_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double us = median_us([&](int) { MOESQ_CUDA_CHECK(cudaGraphLaunch(ge, s)); }, reps, s);
  MOESQ_CUDA_CHECK(cudaGraphExecDestroy(ge));
  MOESQ_CUDA_CHECK(cudaGraphDestroy(g));
  return us / copies;
}

int small_m(cudaStream_t s, cublasHandle_t cb, const std::string& out, int reps, const std::string& only, int64_t only_m) {
  const float one = 1.0f, zero = 0.0f;
  // The copy rate: 1 GiB device to device, read + write bytes.
  double copy_tbs = 0;
  {
    const size_t n = size_t(1) << 30;
    DevBuf<uint8_t> a(n), b(n);
    const double us = median_us([&](int) { MOESQ_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, s)); }, 5, s);
    copy_tbs = 2.0 * double(n) / us / 1e6;
  }
  std::printf("measured device-to-device copy rate (1 GiB, read + write): %.2f TB/s\n\n", copy_tbs);
  const Shape shapes[] = {{"qkv", 5120, 2048, true, true},
                          {"o_proj", 2048, 4096, true, true},
                          {"router", 128, 2048, true, true},
                          {"lm_head", 151936, 2048, true, false}};
  const int depths[] = {3, 4, 6};
  nlohmann::json rows = nlohmann::json::array();
  std::printf("| GEMM | M | N | K | W MB | gemm_bf16 µs (TB/s) | small-M tt1 | tt2 | tt4 | decode 8×16 | decode 4×32 | decode 2×4×32 | decode wgmma | W-as-A d3 | d4 | d6 | "
              "cuBLAS µs (TB/s) | best ÷ copy rate |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    if (!only.empty() && only != sh.name) continue;
    const int64_t N = sh.N, K = sh.K;
    const double wbytes = 2.0 * double(N) * double(K);
    const int copies = std::max(2, std::min(16, int(std::ceil(400e6 / wbytes))));
    std::vector<DevBuf<uint16_t>> w;  // once per shape (the lm_head's 2 × 311 M host samples take seconds)
    for (int c = 0; c < copies; ++c) w.emplace_back(rand_bf16(size_t(N) * K, 30 + c));
    for (int64_t M : {1, 8, 64}) {
      if (only_m > 0 && M != only_m) continue;
      DevBuf<uint16_t> x(rand_bf16(size_t(M) * K, 20 + M)), xl(rand_bf16(size_t(M) * K, 21 + M, 1.0f / 512));
      DevBuf<float> y(size_t(M) * N), yw(size_t(M) * N), yc(size_t(M) * N);
      DevBuf<float> ws(sh.split ? ops::gemm_bf16_split_floats(M, N, K) : 1);
      ops::GemmBf16Args g;
      g.x = x.p, g.x_lo = sh.lo ? xl.p : nullptr, g.M = M, g.N = N, g.K = K, g.ldy = N;
      g.split_ws = sh.split ? ws.p : nullptr;
      auto run_eng = [&](int c) { g.w = w[c].p, g.y_f32 = y.p; ops::gemm_bf16(g, s); };
      auto run_wa = [&](int c, int depth) { g.w = w[c].p, g.y_f32 = yw.p; ops::detail::gemm_bf16_wa(g, s, depth); };
      auto run_cublas = [&](int c) {
        const int n = int(N), m = int(M), k = int(K);
        CUBLAS_CHECK(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w[c].p, CUDA_R_16BF, k, x.p, CUDA_R_16BF,
                                  k, &zero, yc.p, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (sh.lo)
          CUBLAS_CHECK(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w[c].p, CUDA_R_16BF, k, xl.p, CUDA_R_16BF,
                                    k, &one, yc.p, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      g.w = w[0].p;
      const bool wa = ops::detail::gemm_bf16_wa_fits(g);
      run_eng(0);
      const std::vector<float> ref = y.download();
      double t_wa[3] = {0, 0, 0};
      for (int d = 0; d < 3 && wa; ++d) {
        run_wa(0, depths[d]);
        MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
        MOESQ_CHECK(std::memcmp(ref.data(), yw.download().data(), ref.size() * 4) == 0, sh.name, " M=", M,
                    ": W-as-A depth ", depths[d], " differs from gemm_bf16");
        t_wa[d] = graph_us([&](int c) { run_wa(c, depths[d]); }, copies, reps, s);
      }
      const double t_eng = graph_us(run_eng, copies, reps, s);
      // The small-M kernel at 1, 2 and 4 token tiles (gemm_bf16_small_m.h), then the decode path
      // (gemm_bf16_decode.h): each checked bitwise against gemm_bf16's output first.
      double t_tt[3] = {0, 0, 0}, t_dec[4] = {0, 0, 0, 0};
      for (int i = 0; i < 3 && (i == 0 || M > 16) && ops::detail::gemm_bf16_small_m_fits(g); ++i) {
        auto run_tt = [&](int c) { g.w = w[c].p, g.y_f32 = yw.p; ops::detail::gemm_bf16_small_m(g, s, 1 << i); };
        run_tt(0);
        MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
        MOESQ_CHECK(std::memcmp(ref.data(), yw.download().data(), ref.size() * 4) == 0, sh.name, " M=", M,
                    ": the small-M kernel at ", 1 << i, " token tiles differs from gemm_bf16");
        t_tt[i] = graph_us(run_tt, copies, reps, s);
      }
      for (int i = 0; i < 3 && ops::detail::gemm_bf16_decode_fits(g); ++i) {  // 8×16, 4×32, 2×4×32 warps×columns
        const int cols = i == 0 ? 16 : 32, wrows = i == 2 ? 2 : 1;
        auto run_dec = [&](int c) { g.w = w[c].p, g.y_f32 = yw.p; ops::detail::gemm_bf16_decode(g, s, cols, wrows); };
        run_dec(0);
        MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
        MOESQ_CHECK(std::memcmp(ref.data(), yw.download().data(), ref.size() * 4) == 0, sh.name, " M=", M,
                    ": the decode path at ", cols, " columns × ", wrows, " warp rows differs from gemm_bf16");
        t_dec[i] = graph_us(run_dec, copies, reps, s);
      }
      if (ops::detail::gemm_bf16_decode_fits(g)) {  // the wgmma form (gemm_bf16_decode_wg): "≠" if its bits differ
        auto run_wg = [&](int c) { g.w = w[c].p, g.y_f32 = yw.p; ops::detail::gemm_bf16_decode_wg(g, s); };
        run_wg(0);
        MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
        const bool same = std::memcmp(ref.data(), yw.download().data(), ref.size() * 4) == 0;
        if (!same) std::fprintf(stderr, "%s M=%lld: the wgmma decode kernel DIFFERS from gemm_bf16\n", sh.name, (long long)M);
        t_dec[3] = same ? graph_us(run_wg, copies, reps, s) : -1;
      }
      const double t_cub = graph_us(run_cublas, copies, reps, s);
      double best = t_eng;
      for (double t : t_wa) if (t > 0) best = std::min(best, t);
      for (double t : t_tt) if (t > 0) best = std::min(best, t);
      for (double t : t_dec) if (t > 0) best = std::min(best, t);
      auto tbs = [&](double us) { return wbytes / us / 1e6; };
      auto cell = [&](double us) {
        char b[48];
        if (us > 0) std::snprintf(b, sizeof b, "%.1f (%.2f)", us, tbs(us));
        else std::snprintf(b, sizeof b, us < 0 ? "≠" : "–");
        return std::string(b);
      };
      std::printf("| %s | %lld | %lld | %lld | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f %% |\n", sh.name,
                  (long long)M, (long long)N, (long long)K, wbytes / 1e6, cell(t_eng).c_str(), cell(t_tt[0]).c_str(),
                  cell(t_tt[1]).c_str(), cell(t_tt[2]).c_str(), cell(t_dec[0]).c_str(), cell(t_dec[1]).c_str(), cell(t_dec[2]).c_str(), cell(t_dec[3]).c_str(), cell(t_wa[0]).c_str(),
                  cell(t_wa[1]).c_str(), cell(t_wa[2]).c_str(), cell(t_cub).c_str(), 100.0 * tbs(best) / copy_tbs);
      std::fflush(stdout);
      rows.push_back({{"gemm", sh.name}, {"M", M}, {"N", N}, {"K", K}, {"w_bytes", wbytes}, {"copies", copies},
                      {"gemm_bf16_us", t_eng}, {"small_m_tt1_us", t_tt[0]}, {"small_m_tt2_us", t_tt[1]}, {"small_m_tt4_us", t_tt[2]}, {"decode_w16_us", t_dec[0]}, {"decode_w32_us", t_dec[1]}, {"decode_w32r2_us", t_dec[2]}, {"decode_wgmma_us", t_dec[3]}, {"wa_d3_us", t_wa[0]}, {"wa_d4_us", t_wa[1]}, {"wa_d6_us", t_wa[2]},
                      {"cublas_us", t_cub}, {"copy_tbs", copy_tbs}});
    }
  }
  if (!out.empty()) {
    std::ofstream f(out);
    f << nlohmann::json{{"copy_tbs", copy_tbs}, {"rows", rows}}.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string out;
  int reps = 20;
  bool quick = false, small = false;
  std::string only;    // --only NAME: one shape of --small-m (for a profiler)
  int64_t only_m = 0;  // --m M: one M of --small-m
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--quick") quick = true;
    else if (a == "--small-m") small = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--m" && i + 1 < argc) only_m = std::atoll(argv[++i]);
    else MOESQ_FAIL("bench_gemm_bf16: unknown argument \"", a, "\" (usage: [--out F] [--reps N] [--quick] [--small-m [--only qkv|o_proj|router|lm_head] [--m 1|8|64]])");
  }
  cudaStream_t s;
  MOESQ_CUDA_CHECK(cudaStreamCreate(&s));
  cublasHandle_t cb;
  CUBLAS_CHECK(cublasCreate(&cb));
  CUBLAS_CHECK(cublasSetStream(cb, s));
  if (small) {
    const int rc = small_m(s, cb, out, reps, only, only_m);
    CUBLAS_CHECK(cublasDestroy(cb));
    return rc;
  }
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
