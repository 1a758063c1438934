// Benchmark of the grouped sparse GEMM (src/ops/sparse_gemm/) on the paper's Table 8 shapes,
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

#include "bench_cuda_util.cuh"
#include "core/half.h"
#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "ops/sparse_gemm/sparse_gemm.h"
#include "format/fp_codecs.h"
#include "format/kernel_layout.h"

namespace {

using namespace moesq;

constexpr size_t kRotateBytes = 512ull << 20;  // > 8× the H200's L2
// Output is bf16: the check vs the fp64 CPU ref is bounded by bf16 rounding (2^-9 relative).
constexpr double kCheckRelTol = 4e-3;

using bench::median_us;

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
    const size_t off = i % format::kChunkBytes;
    uint8_t v;
    if (off < format::kChunkCodeBytes) v = static_cast<uint8_t>(h);
    else if (off < format::kChunkCodeBytes + format::kChunkScaleBytes) v = static_cast<uint8_t>(0x28 + h % 33);
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


struct Ceilings {
  double copy_tbs = 0, dense_tflops = 0;
};

Ceilings measure_ceilings(cublasHandle_t h, cudaStream_t s, int reps) {
  Ceilings c;
  const size_t bytes = 4ull << 30;
  DevBuf<uint8_t> src(bytes), dst(bytes);
  fill_weights<<<4096, 256, 0, s>>>(src.p, bytes, 1);
  const double us = median_us([&](int) { MOESQ_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s)); },
                              std::max(5, reps / 5), s);
  c.copy_tbs = 2.0 * bytes / (us * 1e-6) / 1e12;  // bytes read + written
  src = {}, dst = {};
  const int n = 8192;
  DevBuf<uint16_t> A(size_t(n) * n), B(size_t(n) * n), C(size_t(n) * n);
  fill_bf16<<<4096, 256, 0, s>>>(A.p, size_t(n) * n, 2);
  fill_bf16<<<4096, 256, 0, s>>>(B.p, size_t(n) * n, 3);
  const float one = 1.0f, zero = 0.0f;
  const double gus = median_us(
      [&](int) {
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A.p, CUDA_R_16BF, n, B.p, CUDA_R_16BF, n, &zero,
                                  C.p, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      },
      std::max(5, reps / 5), s);
  c.dense_tflops = 2.0 * n * n * double(n) / (gus * 1e-6) / 1e12;
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

namespace {

struct Options {
  std::string out_path = "bench_gemm.json", peer_path, only;  // only: run rows whose "name/G/N" contains it
  int reps = 50;
  bool quick = false;
  bool help = false;
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      MOESQ_CHECK(i + 1 < argc, a, " needs a value\n", kUsage);
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
      return o;
    } else if (a == "--out") o.out_path = value();
    else if (a == "--peer-json") o.peer_path = value();
    else if (a == "--reps") {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      MOESQ_CHECK(end && *end == '\0' && n >= 1 && n <= 100000, "--reps ", v, ": not an integer in [1, 100000]");
      o.reps = static_cast<int>(n);
    } else if (a == "--quick") o.quick = true;
    else if (a == "--only") o.only = value();
    else MOESQ_FAIL("unknown argument ", a, "\n", kUsage);
  }
  return o;
}

// The Table-8 rows: shape × experts G × tokens per expert N.
const std::vector<Shape> kShapes = {
    {"qwen3-30b-a3b.gate_up", 1536, 2048, {8, 32, 128}, {1, 8, 16, 64, 256, 1024}},
    {"qwen3-30b-a3b.down", 2048, 768, {8, 32, 128}, {1, 8, 16, 64, 256, 1024}},
    {"kimi-k2.5.gate_up", 4096, 7168, {384}, {8, 32, 128, 256}},
};

std::string row_key(const std::string& name, int G, int N) {
  return name + "/" + std::to_string(G) + "/" + std::to_string(N);
}

std::vector<int> token_counts_of(const Shape& sh, bool quick) {
  return quick ? std::vector<int>(sh.Ns.begin(), sh.Ns.begin() + 2) : sh.Ns;
}

// The second dense peer: torch._grouped_mm rows measured by bench/peer_grouped_mm.py, by "name/G/N".
struct TorchPeer {
  std::map<std::string, nlohmann::json> rows;
  nlohmann::json meta;
};

TorchPeer load_torch_peer(const std::string& path) {
  TorchPeer p;
  if (path.empty()) return p;
  std::ifstream f(path);
  MOESQ_CHECK(f.good(), "cannot read --peer-json ", path);
  p.meta = nlohmann::json::parse(f);
  for (auto& r : p.meta["rows"]) p.rows[row_key(r["name"].get<std::string>(), r["G"].get<int>(), r["N"].get<int>())] = r;
  return p;
}

// What every row needs: the stream, cuBLAS, the repetitions and the measured ceilings.
struct BenchContext {
  cudaStream_t s = nullptr;
  cublasHandle_t cb = nullptr;
  int reps = 50;
  Ceilings ceil;
};

// The experts of one (shape, G): enough rotating copies of the packed weights (and of the dense bf16
// weights for cuBLAS) to exceed L2, so every timed launch streams from HBM; 1/γ_w per expert.
struct ExpertSet {
  int64_t M = 0, K = 0, M_pad = 0, K_pad = 0;
  int G = 0;
  std::vector<DevBuf<uint8_t>> w;    // [wsets] each [G, M_pad/16, K_pad/256, 1408] kernel layout (random bits)
  std::vector<DevBuf<uint16_t>> wd;  // [dsets] each [G, M, K] bf16 (the dense peer's weights)
  std::vector<float> inv_gamma;      // [G] 1/γ_w
  DevBuf<float> d_inv_gamma;         // [G] device copy
};

ExpertSet make_expert_set(const Shape& sh, int G, cudaStream_t s) {
  ExpertSet x;
  x.M = sh.M;
  x.K = sh.K;
  x.K_pad = format::padded_k(sh.K);
  x.M_pad = (sh.M + 15) / 16 * 16;
  x.G = G;
  const size_t wbytes = size_t(G) * (x.M_pad / 16) * (x.K_pad / format::kChunkK) * format::kChunkBytes;
  const int wsets = int(std::clamp<size_t>((kRotateBytes + wbytes - 1) / wbytes, 1, 64));
  x.w.resize(wsets);
  for (int i = 0; i < wsets; ++i) {
    x.w[i].alloc(wbytes);
    fill_weights<<<4096, 256, 0, s>>>(x.w[i].p, wbytes, 100 + i);
  }
  const size_t dbytes = size_t(G) * x.M * x.K * 2;
  const int dsets = int(std::clamp<size_t>((kRotateBytes + dbytes - 1) / dbytes, 1, 16));
  x.wd.resize(dsets);
  for (int i = 0; i < dsets; ++i) {
    x.wd[i].alloc(dbytes / 2);
    fill_bf16<<<4096, 256, 0, s>>>(x.wd[i].p, dbytes / 2, 200 + i);
  }
  x.inv_gamma.resize(G);
  for (int e = 0; e < G; ++e) x.inv_gamma[e] = 1.0f / (2688.0f + e);
  x.d_inv_gamma.upload(x.inv_gamma);
  return x;
}

// The activations of one row: x in kernel layout for the sparse GEMM, xd dense for cuBLAS, outputs.
struct RowBuffers {
  DevBuf<uint16_t> x, xd, y, yd;  // [G, cap, K_pad], [G, cap, K], [G, cap, M], [G, cap, M] bf16
  DevBuf<float> x_inv;            // [G, cap]
  DevBuf<int32_t> counts;         // [G]
};

RowBuffers make_row_buffers(const ExpertSet& ex, int cap, const std::vector<int>& counts, cudaStream_t s) {
  const int G = ex.G;
  RowBuffers b;
  b.x.alloc(size_t(G) * cap * ex.K_pad);
  b.xd.alloc(size_t(G) * cap * ex.K);
  b.y.alloc(size_t(G) * cap * ex.M);
  b.yd.alloc(size_t(G) * cap * ex.M);
  b.x_inv.alloc(size_t(G) * cap);
  b.counts.alloc(G);
  fill_bf16<<<4096, 256, 0, s>>>(b.x.p, size_t(G) * cap * ex.K_pad, 7);
  fill_bf16<<<4096, 256, 0, s>>>(b.xd.p, size_t(G) * cap * ex.K, 8);
  std::vector<float> ones(size_t(G) * cap, 1.0f / 2688.0f);
  b.x_inv.upload(ones.data(), ones.size());
  b.counts.upload(counts.data(), G);
  return b;
}


// Check first: the output of the last sparse_gemm call for expert 0 (tokens 0, 1, the middle and the
// last: first and last n-block of its tiles) against an fp64 CPU product on the same bits. Returns the
// relative Frobenius error.
double check_against_ref(const ExpertSet& ex, const ops::SparseGemmArgs& a, int count0) {
  const int64_t M = ex.M, K = ex.K, K_pad = ex.K_pad;
  format::KernelWeights kw;
  kw.num_experts = 1;
  kw.M = M;
  kw.K = K;
  kw.M_pad = ex.M_pad;
  kw.K_pad = K_pad;
  kw.data.resize(kw.expert_bytes());
  MOESQ_CUDA_CHECK(cudaMemcpy(kw.data.data(), ex.w[0].p, kw.data.size(), cudaMemcpyDeviceToHost));
  std::vector<float> wdec(size_t(M) * K);
  format::kernel_layout_unpack_ref(kw, 0, wdec.data());
  std::vector<int> toks;
  for (int t : {0, 1, count0 / 2, count0 - 1})
    if (t >= 0 && t < count0 && std::find(toks.begin(), toks.end(), t) == toks.end()) toks.push_back(t);
  const int nt = toks.back() + 1;
  std::vector<uint16_t> hx(size_t(nt) * K_pad), hy(size_t(nt) * M);
  MOESQ_CUDA_CHECK(cudaMemcpy(hx.data(), a.x, sizeof(uint16_t) * hx.size(), cudaMemcpyDeviceToHost));
  MOESQ_CUDA_CHECK(cudaMemcpy(hy.data(), a.y, sizeof(uint16_t) * hy.size(), cudaMemcpyDeviceToHost));
  double err = 0, nrm = 0;
  for (int t : toks)
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(wdec[m * K + k]) * bf16_to_f32(hx[t * K_pad + format::act_storage_index(k, a.x_layout)]);
      acc *= double(ex.inv_gamma[0] * (1.0f / 2688.0f));
      const double d = bf16_to_f32(hy[t * M + m]) - acc;
      err += d * d;
      nrm += acc * acc;
    }
  return std::sqrt(err / std::max(nrm, 1e-300));
}

// Times the other built instances of this token range (heuristic tuning data, bench/NOTES.md);
// leaves `a` as it found it. Returns {config name: µs}.
nlohmann::json sweep_configs(const BenchContext& ctx, const ExpertSet& ex, ops::SparseGemmArgs& a, int N,
                             const ops::GemmConfig& cfg) {
  nlohmann::json sweep = nlohmann::json::object();
  std::vector<std::pair<std::string, ops::GemmConfig>> alts;
  auto mma = [](int mt, int nt) {
    ops::GemmConfig c;
    c.m16_tiles_per_warp = mt;
    c.n_tiles = nt;
    return std::make_pair(std::to_string(16 * mt) + "x" + std::to_string(8 * nt), c);
  };
  if (N <= 8) alts = {mma(1, 1), mma(2, 1), mma(2, 2)};
  else if (N <= 16) alts = {mma(1, 2), mma(2, 2)};
  else alts = {mma(2, 2), mma(4, 4)};
  if (N >= 64)
    for (auto [bm, bn, st] : std::vector<std::tuple<int, int, int>>{{128, 128, 4}, {128, 256, 4}, {256, 128, 4}})
      alts.emplace_back("wgmma" + std::to_string(bm) + "x" + std::to_string(bn) + "s" + std::to_string(st),
                        ops::wgmma_config(bm, bn, st));
  const int wsets = int(ex.w.size());
  for (const auto& [name, alt] : alts) {
    a.x_layout = ops::sparse_gemm_act_layout(alt);
    const double t = median_us(
        [&](int i) {
          a.w = ex.w[i % wsets].p;
          ops::sparse_gemm(a, N, ctx.s, &alt);
        },
        std::max(10, ctx.reps / 2), ctx.s);
    sweep[name] = t;
  }
  a.x_layout = ops::sparse_gemm_act_layout(cfg);
  a.w = ex.w[0].p;
  return sweep;
}

// cuBLAS grouped GEMM peer (dense bf16, one group per distinct count). Returns µs, or −1 with *error set.
double time_cublas_peer(const BenchContext& ctx, const ExpertSet& ex, const RowBuffers& b, int cap,
                        const std::vector<int>& counts, std::string* error) {
  const int G = ex.G;
  const int64_t M = ex.M, K = ex.K;
  const int dsets = int(ex.wd.size());
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
    for (int d = 0; d < dsets; ++d) hA[size_t(d) * G + i] = ex.wd[d].p + size_t(e) * M * K;
    hB[i] = b.xd.p + size_t(e) * cap * K;
    hC[i] = b.yd.p + size_t(e) * cap * M;
  }
  const DevBuf<const void*> d_a(hA), d_b(hB);  // per-group A and B pointers
  const DevBuf<void*> d_c(hC);                  // per-group C pointers
  const void** dA = d_a.p;
  const void** dB = d_b.p;
  void** dC = d_c.p;
  double cublas_us = -1;
  try {
    cublas_us = median_us(
        [&](int i) {
          CUBLAS_CHECK(cublasGemmGroupedBatchedEx(ctx.cb, ta.data(), tb.data(), ms.data(), ns.data(), ks.data(),
                                                  alpha.data(), dA + size_t(i % dsets) * G, CUDA_R_16BF, lda.data(),
                                                  dB, CUDA_R_16BF, ldb.data(), beta.data(), dC, CUDA_R_16BF,
                                                  ldc.data(), ngroups, gsize.data(), CUBLAS_COMPUTE_32F));
        },
        ctx.reps, ctx.s);
  } catch (const std::exception& ex_) {
    *error = ex_.what();
  }
  return cublas_us;
}

// What one row measured, before the floors and ratios are derived from it.
struct RowTimes {
  std::string config;
  double check_err = 0, sparse_us = 0, cublas_us = -1, torch_us = -1;
  int64_t tokens = 0;
  nlohmann::json sweep;
  std::string cublas_err;
};

// Prints the row's table line and returns its JSON record (floors, fractions, ratio to the faster peer).
nlohmann::json report_row(const BenchContext& ctx, const Shape& sh, int G, int N, const RowTimes& t,
                          const TorchPeer& peer) {
  const int64_t M = sh.M, K = sh.K, S = t.tokens;
  const double us = t.sparse_us;
  const double packed = double(G) * M * K * 11.0 / 32.0;  // 2.75 bits/weight
  const double flops = 2.0 * M * K * double(S);
  const double floor_bytes_us = packed / (ctx.ceil.copy_tbs * 1e12) * 1e6;
  const double floor_flops_dense_us = flops / (ctx.ceil.dense_tflops * 1e12) * 1e6;
  const double floor_flops_sparse_us = floor_flops_dense_us / 2.0;  // 2:4 tensor cores: ≤ 2× dense
  const double floor_us = std::max(floor_bytes_us, floor_flops_sparse_us);
  double best_peer = -1;
  for (double p : {t.cublas_us, t.torch_us})
    if (p > 0 && (best_peer < 0 || p < best_peer)) best_peer = p;
  const double speedup = best_peer > 0 ? best_peer / us : -1;
  std::printf("%-22s %4d %5d %7lld | %9.1f %7.2f %7.1f %9.1f %5.0f%% | %9.1f %9.1f %7.2f\n", sh.name.c_str(), G, N,
              static_cast<long long>(S), us, packed / (us * 1e-6) / 1e12, flops / (us * 1e-6) / 1e12, floor_us,
              100.0 * floor_us / us, t.cublas_us, t.torch_us, speedup);
  std::fflush(stdout);
  nlohmann::json row = {{"name", sh.name},
                        {"M", M},
                        {"K", K},
                        {"G", G},
                        {"N", N},
                        {"tokens", S},
                        {"config", t.config},
                        {"check_rel_err", t.check_err},
                        {"sparse_us", us},
                        {"packed_weight_bytes", packed},
                        {"packed_tbs", packed / (us * 1e-6) / 1e12},
                        {"tflops_dense_equiv", flops / (us * 1e-6) / 1e12},
                        {"floor_bytes_us", floor_bytes_us},
                        {"floor_flops_sparse_us", floor_flops_sparse_us},
                        {"floor_flops_dense_us", floor_flops_dense_us},
                        {"fraction_of_floor", floor_us / us},
                        {"cublas_grouped_us", t.cublas_us},
                        {"torch_grouped_mm_us", t.torch_us},
                        {"speedup_vs_faster_peer", speedup},
                        {"sweep_us_by_config", t.sweep}};
  if (!t.cublas_err.empty()) row["cublas_error"] = t.cublas_err;
  const std::string key = row_key(sh.name, G, N);
  if (peer.rows.count(key) && peer.rows.at(key).contains("error")) row["torch_error"] = peer.rows.at(key)["error"];
  return row;
}

// One row (shape, G, N): check the heuristic's kernel against the CPU ref, time it, sweep the other
// instances, time the cuBLAS peer, look up the torch peer. *check_failed when the check fails (the
// row is still timed: the numbers say how fast a WRONG kernel is; main fails at exit).
nlohmann::json run_row(const BenchContext& ctx, const Shape& sh, const ExpertSet& ex, int N, const TorchPeer& peer,
                       bool* check_failed) {
  const int G = ex.G;
  const std::vector<int> counts = counts_for(G, N);
  RowTimes t;
  for (int c : counts) t.tokens += c;
  const int cap = N;
  RowBuffers b = make_row_buffers(ex, cap, counts, ctx.s);
  ops::SparseGemmArgs a;
  a.w = ex.w[0].p;
  a.w_inv_gamma = ex.d_inv_gamma.p;
  a.x = b.x.p;
  a.x_inv_scale = b.x_inv.p;
  a.counts = b.counts.p;
  a.y = b.y.p;
  a.num_experts = G;
  a.capacity = cap;
  a.M = ex.M;
  a.M_pad = ex.M_pad;
  a.K_pad = ex.K_pad;
  a.ldy = ex.M;
  const ops::GemmConfig cfg = ops::sparse_gemm_heuristic(G, ex.M, ex.K_pad, N);
  a.x_layout = ops::sparse_gemm_act_layout(cfg);  // x is random: only the check reads its order
  t.config = cfg.str();

  ops::sparse_gemm(a, N, ctx.s, &cfg);
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(ctx.s));
  t.check_err = check_against_ref(ex, a, counts[0]);
  *check_failed = !(t.check_err <= kCheckRelTol);
  if (*check_failed)
    std::printf("CHECK FAILED: %s G=%d N=%d GPU vs CPU ref rel err %.3g > %.3g\n", sh.name.c_str(), G, N, t.check_err,
                kCheckRelTol);
  const int wsets = int(ex.w.size());
  t.sparse_us = median_us(
      [&](int i) {
        a.w = ex.w[i % wsets].p;
        ops::sparse_gemm(a, N, ctx.s, &cfg);
      },
      ctx.reps, ctx.s);
  t.sweep = sweep_configs(ctx, ex, a, N, cfg);
  t.cublas_us = time_cublas_peer(ctx, ex, b, cap, counts, &t.cublas_err);
  const std::string key = row_key(sh.name, G, N);
  if (peer.rows.count(key) && peer.rows.at(key).contains("us")) t.torch_us = peer.rows.at(key)["us"].get<double>();
  return report_row(ctx, sh, G, N, t, peer);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse_args(argc, argv);
  if (opt.help) {
    std::printf("%s", kUsage);
    return 0;
  }
  bool any_row = false;
  for (const auto& sh : kShapes)
    for (int G : sh.Gs)
      for (int N : token_counts_of(sh, opt.quick)) any_row |= row_key(sh.name, G, N).find(opt.only) != std::string::npos;
  MOESQ_CHECK(any_row, "no row matches --only ", opt.only, " (rows are named like qwen3-30b-a3b.gate_up/128/1024)");
  const TorchPeer peer = load_torch_peer(opt.peer_path);

  BenchContext ctx;
  ctx.reps = opt.reps;
  MOESQ_CUDA_CHECK(cudaStreamCreate(&ctx.s));
  CUBLAS_CHECK(cublasCreate(&ctx.cb));
  CUBLAS_CHECK(cublasSetStream(ctx.cb, ctx.s));
  cudaDeviceProp prop;
  MOESQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  ctx.ceil = measure_ceilings(ctx.cb, ctx.s, ctx.reps);
  std::printf("device %s, %d SMs, L2 %d MB; measured copy %.2f TB/s (read+write), dense bf16 cuBLAS %.0f TFLOP/s\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, ctx.ceil.copy_tbs, ctx.ceil.dense_tflops);

  nlohmann::json rows = nlohmann::json::array();
  int check_failures = 0;
  std::printf("%-22s %4s %5s %7s | %9s %7s %7s %9s %6s | %9s %9s %7s\n", "shape", "G", "N", "tokens", "sparse_us",
              "TB/s", "TFLOP/s", "floor_us", "floor%", "cublas_us", "torch_us", "speedup");
  for (const auto& sh : kShapes)
    for (int G : sh.Gs) {
      ExpertSet ex = make_expert_set(sh, G, ctx.s);
      for (int N : token_counts_of(sh, opt.quick)) {
        if (!opt.only.empty() && row_key(sh.name, G, N).find(opt.only) == std::string::npos) continue;
        bool failed = false;
        rows.push_back(run_row(ctx, sh, ex, N, peer, &failed));
        check_failures += failed;
      }
    }
  nlohmann::json out = {{"device", prop.name},
                        {"sms", prop.multiProcessorCount},
                        {"copy_tbs_read_plus_write", ctx.ceil.copy_tbs},
                        {"dense_bf16_tflops_cublas_8192", ctx.ceil.dense_tflops},
                        {"reps", ctx.reps},
                        {"counts", "cycle {N, 3N/4, N/2, N/4}, rounded up"},
                        {"torch", peer.meta.contains("torch") ? peer.meta["torch"] : nlohmann::json()},
                        {"rows", rows}};
  std::ofstream(opt.out_path) << out.dump(1) << "\n";
  cublasDestroy(ctx.cb);
  cudaStreamDestroy(ctx.s);
  if (check_failures) std::fprintf(stderr, "bench_gemm: %d rows failed the check against the CPU ref\n", check_failures);
  return check_failures ? 2 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gemm: %s\n", e.what());
  return 1;
}
