// Benchmark of the grouped sparse GEMM (src/cuda/sparse_gemm.cu) on the paper's Table 8 shapes,
// with the dense bf16 peers measured in the same run: cuBLAS grouped GEMM (cublasGemmGroupedBatchedEx,
// one group per distinct token count) here, torch._grouped_mm via bench/peer_grouped_mm.py (its JSON
// merged with --peer-json). A program, not a test: it checks first (expert 0 against the CPU ref on
// the same packed bits), then times with CUDA events (warm-up, median of --reps), weights rotated
// through > 512 MB so L2 never holds them, and prints µs, TB/s of packed weight bytes, TFLOP/s,
// the floors (bytes ÷ measured copy bandwidth; FLOPs ÷ measured rate) and the ratio to the faster peer.
//
// Non-obvious decision: weights are random kernel-layout bytes generated ON the GPU (valid
// metadata nibbles, block scales in [2^-2, 2^2]) rather than quantized on the host: the Kimi shape
// is 11 G weights, and a GEMM's speed does not depend on which valid bits it streams.
//
// Usage: bench_gemm [--out results.json] [--peer-json torch.json] [--reps 50] [--quick] [--only name/G/N]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/cuda/check.cuh"
#include "ops/sparse_gemm/sparse_gemm.h"
#include "format/fp_codecs.h"
#include "format/kernel_layout.h"

namespace {

using namespace moesq;

constexpr size_t kRotateBytes = 512ull << 20;  // > 8× the H200's L2
// Output is bf16: the check vs the fp64 CPU ref is bounded by bf16 rounding (2^-9 relative).
constexpr double kCheckRelTol = 4e-3;

#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_ = (call);                                                            \
    MOESQ_CHECK(st_ == CUBLAS_STATUS_SUCCESS, #call, " failed: cublas status ", int(st_)); \
  } while (0)

struct Shape {
  std::string name;
  int64_t M, K;
  std::vector<int> Gs, Ns;
};

std::vector<int> counts_for(int G, int N) {  // {N, 3N/4, N/2, N/4}, rounded up
  const int cyc[4] = {N, (3 * N + 3) / 4, (N + 1) / 2, (N + 3) / 4};
  std::vector<int> c(G);
  for (int e = 0; e < G; ++e) c[e] = cyc[e % 4];
  return c;
}

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Random kernel-layout chunks: codes random, scales UE4M3 in [0x28, 0x48] (2^-2..2^2), meta nibbles
// from the 6 valid ordered-metadata patterns.
__global__ void fill_weights(uint8_t* w, size_t bytes, uint64_t seed) {
  const uint8_t kNibbles[6] = {0x4, 0x8, 0xC, 0x9, 0xD, 0xE};
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ull + i);
    const size_t off = i % moe::kChunkBytes;
    uint8_t v;
    if (off < moe::kChunkCodeBytes) v = static_cast<uint8_t>(h);
    else if (off < moe::kChunkCodeBytes + moe::kChunkScaleBytes) v = static_cast<uint8_t>(0x28 + h % 33);
    else v = static_cast<uint8_t>(kNibbles[h % 6] | (kNibbles[(h >> 8) % 6] << 4));
    w[i] = v;
  }
}

// Random bf16 values on the NVFP4 grid (E2M1 magnitude × 2^j), or plain normal-ish for the peers.
__global__ void fill_bf16(uint16_t* x, size_t n, uint64_t seed) {
  const float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ull + i);
    float v = kE2M1[h & 7] * ((h & 8) ? -1.0f : 1.0f) * ldexpf(1.0f, int((h >> 4) % 5) - 2);
    x[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

template <typename F>
double median_us(F&& fn, int reps, cudaStream_t s) {
  cudaEvent_t a, b;
  MOESQ_CUDA_CHECK(cudaEventCreate(&a));
  MOESQ_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) fn(i);
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    MOESQ_CUDA_CHECK(cudaEventRecord(a, s));
    fn(i);
    MOESQ_CUDA_CHECK(cudaEventRecord(b, s));
    MOESQ_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MOESQ_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Ceilings {
  double copy_tbs = 0, dense_tflops = 0;
};

Ceilings measure_ceilings(cublasHandle_t h, cudaStream_t s, int reps) {
  Ceilings c;
  const size_t bytes = 4ull << 30;
  uint8_t *src, *dst;
  MOESQ_CUDA_CHECK(cudaMalloc(&src, bytes));
  MOESQ_CUDA_CHECK(cudaMalloc(&dst, bytes));
  fill_weights<<<4096, 256, 0, s>>>(src, bytes, 1);
  const double us = median_us([&](int) { MOESQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); },
                              std::max(5, reps / 5), s);
  c.copy_tbs = 2.0 * bytes / (us * 1e-6) / 1e12;  // bytes read + written
  cudaFree(src);
  cudaFree(dst);
  const int n = 8192;
  uint16_t *A, *B, *C;
  MOESQ_CUDA_CHECK(cudaMalloc(&A, sizeof(uint16_t) * n * n));
  MOESQ_CUDA_CHECK(cudaMalloc(&B, sizeof(uint16_t) * n * n));
  MOESQ_CUDA_CHECK(cudaMalloc(&C, sizeof(uint16_t) * n * n));
  fill_bf16<<<4096, 256, 0, s>>>(A, size_t(n) * n, 2);
  fill_bf16<<<4096, 256, 0, s>>>(B, size_t(n) * n, 3);
  const float one = 1.0f, zero = 0.0f;
  const double gus = median_us(
      [&](int) {
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, &zero,
                                  C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      },
      std::max(5, reps / 5), s);
  c.dense_tflops = 2.0 * n * n * double(n) / (gus * 1e-6) / 1e12;
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  return c;
}

}  // namespace

constexpr const char* kUsage =
    "usage: bench_gemm [--out FILE.json] [--peer-json TORCH.json] [--only NAME/G/N] [--reps N] [--quick]\n"
    "  --out        results JSON (default bench_gemm.json)\n"
    "  --peer-json  torch._grouped_mm times from bench/peer_grouped_mm.py (second dense peer)\n"
    "  --only       run the rows whose \"name/G/N\" contains this text, e.g. qwen3-30b-a3b.gate_up/128/1024\n"
    "  --reps       timed repetitions per kernel (median reported; default 50)\n"
    "  --quick      the first two token counts of each shape only\n";

int main(int argc, char** argv) try {
  std::string out_path = "bench_gemm.json", peer_path, only;  // only: run rows whose "name/G/N" contains it
  int reps = 50;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      MOESQ_CHECK(i + 1 < argc, a, " needs a value\n", kUsage);
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (a == "--out") out_path = value();
    else if (a == "--peer-json") peer_path = value();
    else if (a == "--reps") {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      MOESQ_CHECK(end && *end == '\0' && n >= 1 && n <= 100000, "--reps ", v, ": not an integer in [1, 100000]");
      reps = static_cast<int>(n);
    } else if (a == "--quick") quick = true;
    else if (a == "--only") only = value();
    else MOESQ_FAIL("unknown argument ", a, "\n", kUsage);
  }
  const std::vector<Shape> shapes = {
      {"qwen3-30b-a3b.gate_up", 1536, 2048, {8, 32, 128}, {1, 8, 16, 64, 256, 1024}},
      {"qwen3-30b-a3b.down", 2048, 768, {8, 32, 128}, {1, 8, 16, 64, 256, 1024}},
      {"kimi-k2.5.gate_up", 4096, 7168, {384}, {8, 32, 128, 256}},
  };
  bool any_row = false;
  for (const auto& sh : shapes)
    for (int G : sh.Gs)
      for (size_t j = 0; j < (quick ? 2 : sh.Ns.size()); ++j)
        any_row |= (sh.name + "/" + std::to_string(G) + "/" + std::to_string(sh.Ns[j])).find(only) != std::string::npos;
  MOESQ_CHECK(any_row, "no row matches --only ", only, " (rows are named like qwen3-30b-a3b.gate_up/128/1024)");
  std::map<std::string, nlohmann::json> peer;  // "name/G/N" → torch row
  nlohmann::json peer_meta;
  if (!peer_path.empty()) {
    std::ifstream f(peer_path);
    MOESQ_CHECK(f.good(), "cannot read --peer-json ", peer_path);
    peer_meta = nlohmann::json::parse(f);
    for (auto& r : peer_meta["rows"])
      peer[r["name"].get<std::string>() + "/" + std::to_string(r["G"].get<int>()) + "/" + std::to_string(r["N"].get<int>())] = r;
  }

  cudaStream_t s;
  MOESQ_CUDA_CHECK(cudaStreamCreate(&s));
  cublasHandle_t cb;
  CUBLAS_CHECK(cublasCreate(&cb));
  CUBLAS_CHECK(cublasSetStream(cb, s));
  cudaDeviceProp prop;
  MOESQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const Ceilings ceil = measure_ceilings(cb, s, reps);
  std::printf("device %s, %d SMs, L2 %d MB; measured copy %.2f TB/s (read+write), dense bf16 cuBLAS %.0f TFLOP/s\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, ceil.copy_tbs, ceil.dense_tflops);

  nlohmann::json rows = nlohmann::json::array();
  int check_failures = 0;
  std::printf("%-22s %4s %5s %7s | %9s %7s %7s %9s %6s | %9s %9s %7s\n", "shape", "G", "N", "tokens", "sparse_us",
              "TB/s", "TFLOP/s", "floor_us", "floor%", "cublas_us", "torch_us", "speedup");
  for (const auto& sh : shapes) {
    const int64_t M = sh.M, K = sh.K, K_pad = moe::padded_k(K), M_pad = (M + 15) / 16 * 16;
    for (int G : sh.Gs) {
      const size_t wbytes = size_t(G) * (M_pad / 16) * (K_pad / moe::kChunkK) * moe::kChunkBytes;
      const int wsets = int(std::clamp<size_t>((kRotateBytes + wbytes - 1) / wbytes, 1, 64));
      std::vector<uint8_t*> w(wsets);
      for (int i = 0; i < wsets; ++i) {
        MOESQ_CUDA_CHECK(cudaMalloc(&w[i], wbytes));
        fill_weights<<<4096, 256, 0, s>>>(w[i], wbytes, 100 + i);
      }
      const size_t dbytes = size_t(G) * M * K * 2;
      const int dsets = int(std::clamp<size_t>((kRotateBytes + dbytes - 1) / dbytes, 1, 16));
      std::vector<uint16_t*> wd(dsets);
      for (int i = 0; i < dsets; ++i) {
        MOESQ_CUDA_CHECK(cudaMalloc(&wd[i], dbytes));
        fill_bf16<<<4096, 256, 0, s>>>(wd[i], dbytes / 2, 200 + i);
      }
      std::vector<float> inv_gamma(G);
      for (int e = 0; e < G; ++e) inv_gamma[e] = 1.0f / (2688.0f + e);
      float* d_ig;
      MOESQ_CUDA_CHECK(cudaMalloc(&d_ig, sizeof(float) * G));
      MOESQ_CUDA_CHECK(cudaMemcpy(d_ig, inv_gamma.data(), sizeof(float) * G, cudaMemcpyHostToDevice));

      for (int N : quick ? std::vector<int>(sh.Ns.begin(), sh.Ns.begin() + 2) : sh.Ns) {
        if (!only.empty() && (sh.name + "/" + std::to_string(G) + "/" + std::to_string(N)).find(only) == std::string::npos)
          continue;
        const std::vector<int> counts = counts_for(G, N);
        int64_t S = 0;
        for (int c : counts) S += c;
        const int cap = N;
        uint16_t *x, *xd, *y, *yd;
        float* x_inv;
        int32_t* d_counts;
        MOESQ_CUDA_CHECK(cudaMalloc(&x, sizeof(uint16_t) * G * cap * K_pad));
        MOESQ_CUDA_CHECK(cudaMalloc(&xd, sizeof(uint16_t) * G * cap * K));
        MOESQ_CUDA_CHECK(cudaMalloc(&y, sizeof(uint16_t) * G * cap * M));
        MOESQ_CUDA_CHECK(cudaMalloc(&yd, sizeof(uint16_t) * G * cap * M));
        MOESQ_CUDA_CHECK(cudaMalloc(&x_inv, sizeof(float) * G * cap));
        MOESQ_CUDA_CHECK(cudaMalloc(&d_counts, sizeof(int32_t) * G));
        fill_bf16<<<4096, 256, 0, s>>>(x, size_t(G) * cap * K_pad, 7);
        fill_bf16<<<4096, 256, 0, s>>>(xd, size_t(G) * cap * K, 8);
        {
          std::vector<float> ones(size_t(G) * cap, 1.0f / 2688.0f);
          MOESQ_CUDA_CHECK(cudaMemcpy(x_inv, ones.data(), sizeof(float) * ones.size(), cudaMemcpyHostToDevice));
          MOESQ_CUDA_CHECK(cudaMemcpy(d_counts, counts.data(), sizeof(int32_t) * G, cudaMemcpyHostToDevice));
        }
        cuda::SparseGemmArgs a;
        a.w = w[0];
        a.w_inv_gamma = d_ig;
        a.x = x;
        a.x_inv_scale = x_inv;
        a.counts = d_counts;
        a.y = y;
        a.num_experts = G;
        a.capacity = cap;
        a.M = M;
        a.M_pad = M_pad;
        a.K_pad = K_pad;
        a.ldy = M;
        const cuda::GemmConfig cfg = cuda::sparse_gemm_heuristic(G, M, K_pad, N);
        a.x_layout = cuda::sparse_gemm_act_layout(cfg);  // x is random: only the check reads its order

        // ---- check first: expert 0, first ≤ 4 tokens, against the CPU ref on the same bits ----
        cuda::sparse_gemm(a, N, s, &cfg);
        MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
        double check_err;
        {
          moe::KernelWeights kw;
          kw.num_experts = 1;
          kw.M = M;
          kw.K = K;
          kw.M_pad = M_pad;
          kw.K_pad = K_pad;
          kw.data.resize(kw.expert_bytes());
          MOESQ_CUDA_CHECK(cudaMemcpy(kw.data.data(), w[0], kw.data.size(), cudaMemcpyDeviceToHost));
          std::vector<float> wdec(size_t(M) * K);
          moe::kernel_layout_decode_ref(kw, 0, wdec.data());
          // Tokens 0, 1, the middle and the last of expert 0: first and last n-block of its tiles.
          std::vector<int> toks;
          for (int t : {0, 1, counts[0] / 2, counts[0] - 1})
            if (t >= 0 && t < counts[0] && std::find(toks.begin(), toks.end(), t) == toks.end()) toks.push_back(t);
          const int nt = toks.back() + 1;
          std::vector<uint16_t> hx(size_t(nt) * K_pad), hy(size_t(nt) * M);
          MOESQ_CUDA_CHECK(cudaMemcpy(hx.data(), x, sizeof(uint16_t) * hx.size(), cudaMemcpyDeviceToHost));
          MOESQ_CUDA_CHECK(cudaMemcpy(hy.data(), y, sizeof(uint16_t) * hy.size(), cudaMemcpyDeviceToHost));
          double err = 0, nrm = 0;
          for (int t : toks)
            for (int64_t m = 0; m < M; ++m) {
              double acc = 0;
              for (int64_t k = 0; k < K; ++k)
                acc += double(wdec[m * K + k]) * bf16_to_f32(hx[t * K_pad + moe::act_storage_index(k, a.x_layout)]);
              acc *= double(inv_gamma[0] * (1.0f / 2688.0f));
              const double d = bf16_to_f32(hy[t * M + m]) - acc;
              err += d * d;
              nrm += acc * acc;
            }
          check_err = std::sqrt(err / std::max(nrm, 1e-300));
          if (!(check_err <= kCheckRelTol)) {  // keep timing (the numbers say how fast a WRONG kernel is), fail at exit
            std::printf("CHECK FAILED: %s G=%d N=%d GPU vs CPU ref rel err %.3g > %.3g\n", sh.name.c_str(), G, N,
                        check_err, kCheckRelTol);
            ++check_failures;
          }
        }
        const double us = median_us(
            [&](int i) {
              a.w = w[i % wsets];
              cuda::sparse_gemm(a, N, s, &cfg);
            },
            reps, s);
        // Sweep the other built instances of this token range (heuristic tuning data, bench/NOTES.md).
        nlohmann::json sweep = nlohmann::json::object();
        {
          std::vector<std::pair<std::string, cuda::GemmConfig>> alts;
          auto mma = [](int mt, int nt) {
            cuda::GemmConfig c;
            c.m_tiles = mt;
            c.n_tiles = nt;
            return std::make_pair(std::to_string(16 * mt) + "x" + std::to_string(8 * nt), c);
          };
          if (N <= 8) alts = {mma(1, 1), mma(2, 1), mma(2, 2)};
          else if (N <= 16) alts = {mma(1, 2), mma(2, 2)};
          else alts = {mma(2, 2), mma(4, 4)};
          if (N >= 64)
            for (auto [bm, bn, st] : std::vector<std::tuple<int, int, int>>{
                     {128, 128, 4}, {128, 256, 4}, {256, 128, 4}})
              alts.emplace_back("wgmma" + std::to_string(bm) + "x" + std::to_string(bn) + "s" + std::to_string(st),
                                cuda::wgmma_config(bm, bn, st));
          for (const auto& [name, alt] : alts) {
            a.x_layout = cuda::sparse_gemm_act_layout(alt);
            const double t = median_us(
                [&](int i) {
                  a.w = w[i % wsets];
                  cuda::sparse_gemm(a, N, s, &alt);
                },
                std::max(10, reps / 2), s);
            sweep[name] = t;
          }
          a.x_layout = cuda::sparse_gemm_act_layout(cfg);
          a.w = w[0];
        }

        // ---- cuBLAS grouped GEMM peer: one group per distinct count ----
        std::map<int, std::vector<int>> by_count;
        for (int e = 0; e < G; ++e) by_count[counts[e]].push_back(e);
        const int ngroups = int(by_count.size());
        std::vector<cublasOperation_t> ta(ngroups, CUBLAS_OP_T), tb(ngroups, CUBLAS_OP_N);
        std::vector<int> ms(ngroups, int(M)), ns, ks(ngroups, int(K)), lda(ngroups, int(K)), ldb(ngroups, int(K)),
            ldc(ngroups, int(M)), gsize;
        std::vector<float> alpha(ngroups, 1.0f), beta(ngroups, 0.0f);
        std::vector<int> order;
        for (auto& [c, es] : by_count) {
          ns.push_back(c);
          gsize.push_back(int(es.size()));
          order.insert(order.end(), es.begin(), es.end());
        }
        std::vector<const void*> hA(size_t(dsets) * G), hB(G);
        std::vector<void*> hC(G);
        for (int i = 0; i < G; ++i) {
          const int e = order[i];
          for (int d = 0; d < dsets; ++d) hA[size_t(d) * G + i] = wd[d] + size_t(e) * M * K;
          hB[i] = xd + size_t(e) * cap * K;
          hC[i] = yd + size_t(e) * cap * M;
        }
        const void** dA;
        const void** dB;
        void** dC;
        MOESQ_CUDA_CHECK(cudaMalloc(&dA, sizeof(void*) * hA.size()));
        MOESQ_CUDA_CHECK(cudaMalloc(&dB, sizeof(void*) * G));
        MOESQ_CUDA_CHECK(cudaMalloc(&dC, sizeof(void*) * G));
        MOESQ_CUDA_CHECK(cudaMemcpy(dA, hA.data(), sizeof(void*) * hA.size(), cudaMemcpyHostToDevice));
        MOESQ_CUDA_CHECK(cudaMemcpy(dB, hB.data(), sizeof(void*) * G, cudaMemcpyHostToDevice));
        MOESQ_CUDA_CHECK(cudaMemcpy(dC, hC.data(), sizeof(void*) * G, cudaMemcpyHostToDevice));
        double cublas_us = -1;
        std::string cublas_err;
        try {
          cublas_us = median_us(
              [&](int i) {
                CUBLAS_CHECK(cublasGemmGroupedBatchedEx(cb, ta.data(), tb.data(), ms.data(), ns.data(), ks.data(),
                                                        alpha.data(), dA + size_t(i % dsets) * G, CUDA_R_16BF,
                                                        lda.data(), dB, CUDA_R_16BF, ldb.data(), beta.data(), dC,
                                                        CUDA_R_16BF, ldc.data(), ngroups, gsize.data(),
                                                        CUBLAS_COMPUTE_32F));
              },
              reps, s);
        } catch (const std::exception& ex) {
          cublas_err = ex.what();
        }
        cudaFree(dA);
        cudaFree(dB);
        cudaFree(dC);

        const std::string key = sh.name + "/" + std::to_string(G) + "/" + std::to_string(N);
        double torch_us = -1;
        if (peer.count(key) && peer[key].contains("us")) torch_us = peer[key]["us"].get<double>();
        const double packed = double(G) * M * K * 11.0 / 32.0;  // 2.75 bits/weight
        const double flops = 2.0 * M * K * double(S);
        const double floor_bytes_us = packed / (ceil.copy_tbs * 1e12) * 1e6;
        const double floor_flops_dense_us = flops / (ceil.dense_tflops * 1e12) * 1e6;
        const double floor_flops_sparse_us = floor_flops_dense_us / 2.0;  // 2:4 tensor cores: ≤ 2× dense
        const double floor_us = std::max(floor_bytes_us, floor_flops_sparse_us);
        double best_peer = -1;
        for (double p : {cublas_us, torch_us})
          if (p > 0 && (best_peer < 0 || p < best_peer)) best_peer = p;
        const double speedup = best_peer > 0 ? best_peer / us : -1;
        std::printf("%-22s %4d %5d %7lld | %9.1f %7.2f %7.1f %9.1f %5.0f%% | %9.1f %9.1f %7.2f\n", sh.name.c_str(), G, N,
                    static_cast<long long>(S), us, packed / (us * 1e-6) / 1e12, flops / (us * 1e-6) / 1e12, floor_us,
                    100.0 * floor_us / us, cublas_us, torch_us, speedup);
        std::fflush(stdout);
        nlohmann::json row = {{"name", sh.name},
                              {"M", M},
                              {"K", K},
                              {"G", G},
                              {"N", N},
                              {"tokens", S},
                              {"config", cfg.str()},
                              {"check_rel_err", check_err},
                              {"sparse_us", us},
                              {"packed_weight_bytes", packed},
                              {"packed_tbs", packed / (us * 1e-6) / 1e12},
                              {"tflops_dense_equiv", flops / (us * 1e-6) / 1e12},
                              {"floor_bytes_us", floor_bytes_us},
                              {"floor_flops_sparse_us", floor_flops_sparse_us},
                              {"floor_flops_dense_us", floor_flops_dense_us},
                              {"fraction_of_floor", floor_us / us},
                              {"cublas_grouped_us", cublas_us},
                              {"torch_grouped_mm_us", torch_us},
                              {"speedup_vs_faster_peer", speedup},
                              {"sweep_us_by_config", sweep}};
        if (!cublas_err.empty()) row["cublas_error"] = cublas_err;
        if (peer.count(key) && peer[key].contains("error")) row["torch_error"] = peer[key]["error"];
        rows.push_back(row);
        cudaFree(x);
        cudaFree(xd);
        cudaFree(y);
        cudaFree(yd);
        cudaFree(x_inv);
        cudaFree(d_counts);
      }
      for (auto p : w) cudaFree(p);
      for (auto p : wd) cudaFree(p);
      cudaFree(d_ig);
    }
  }
  nlohmann::json out = {{"device", prop.name},
                        {"sms", prop.multiProcessorCount},
                        {"copy_tbs_read_plus_write", ceil.copy_tbs},
                        {"dense_bf16_tflops_cublas_8192", ceil.dense_tflops},
                        {"reps", reps},
                        {"counts", "cycle {N, 3N/4, N/2, N/4}, rounded up"},
                        {"torch", peer_meta.contains("torch") ? peer_meta["torch"] : nlohmann::json()},
                        {"rows", rows}};
  std::ofstream(out_path) << out.dump(1) << "\n";
  cublasDestroy(cb);
  cudaStreamDestroy(s);
  if (check_failures) std::fprintf(stderr, "bench_gemm: %d rows failed the check against the CPU ref\n", check_failures);
  return check_failures ? 2 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gemm: %s\n", e.what());
  return 1;
}
