// Benchmark of the packed-AWQ W4A16 MoE GEMM (native vs invariant vs invariant-split schedule) against the dense fp16 peer
// (cuBLAS, one cublasGemmEx per active expert) at the Qwen3-30B-A3B shapes, following the pre-declared
// protocol bench/awq_protocol.json. It checks first (GPU vs CPU `_ref` on the same packed bits for
// M <= 64; native vs invariant and invariant-split for every M), then times with CUDA events (warm-ups, one event pair per
// iteration), and writes every raw timing to --out for bench/validate_awq_timing.py to recompute.
// Usage: bench_awq_gemm --protocol bench/awq_protocol.json --out raw.json
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "core/threads.h"
#include "ops/awq_gemm/awq_gemm.h"
#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "ops/route_align/route_align.h"
#include "format/awq_int4.h"
#include "audit/awq_layer.h"
#include "audit/plan_json.h"

using namespace moesq;

namespace {

constexpr double kRtol = 0x1p-9, kAtol = 0x1p-14;  // GPU vs `_ref`: 2 fp16 ulps (see tests/gpu/test_awq_gemm.cu)
constexpr double kHbmTBs = 4.25;                     // measured H200 HBM bandwidth (DESIGN.md §4)

#define CUBLAS_CHECK(call) MOESQ_CHECK((call) == CUBLAS_STATUS_SUCCESS, #call " failed")

template <typename F>
std::vector<double> time_it(F&& fn, int warm, int iters) {
  cudaEvent_t a, b;
  MOESQ_CUDA_CHECK(cudaEventCreate(&a));
  MOESQ_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) fn();
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    MOESQ_CUDA_CHECK(cudaEventRecord(a));
    fn();
    MOESQ_CUDA_CHECK(cudaEventRecord(b));
    MOESQ_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MOESQ_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string proto_path = "bench/awq_protocol.json", out_path = "awq_raw.json";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    MOESQ_CHECK((a == "--protocol" || a == "--out") && i + 1 < argc, "unknown argument or missing value: ", a,
                " (usage: bench_awq_gemm [--protocol FILE.json] [--out FILE.json])");
    (a == "--protocol" ? proto_path : out_path) = argv[i + 1];
  }
  MOESQ_CHECK(std::ifstream(proto_path).good(), "cannot read --protocol ", proto_path);
  const auto proto = nlohmann::json::parse(std::ifstream(proto_path));
  const int warm = proto["warmup_iterations"], iters = proto["timed_iterations"];
  const int E = proto["num_experts"], topk = proto["top_k"], b = proto["block_size"];
  cudaDeviceProp prop{};
  MOESQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  nlohmann::json raw = {{"device", prop.name}, {"sms", prop.multiProcessorCount}, {"warmup_iterations", warm},
                        {"timed_iterations", iters}, {"points", nlohmann::json::object()}};
  for (const auto& shape : proto["shapes"]) {
    const int64_t N = shape["N"], K = shape["K"];
    // Weights for all experts (AWQ packed + the dense fp16 dequantized copy for cuBLAS).
    std::vector<format::AwqLinear> W(E);
    parallel_for(E, [&](int64_t e) { W[e] = format::awq_random(N, K, 1000 + e, 0.5f * 0.2f / std::sqrt(float(K)), 1.5f * 0.2f / std::sqrt(float(K))); });
    std::vector<int32_t> qw, qz, slot(E);
    std::vector<uint16_t> sc, dense(static_cast<size_t>(E) * N * K);
    for (int e = 0; e < E; ++e) {
      slot[e] = e;
      qw.insert(qw.end(), W[e].qweight.begin(), W[e].qweight.end());
      qz.insert(qz.end(), W[e].qzeros.begin(), W[e].qzeros.end());
      sc.insert(sc.end(), W[e].scales.begin(), W[e].scales.end());
    }
    parallel_for(E, [&](int64_t e) {
      const auto d = format::awq_dequantize_ref(W[e]);
      for (int64_t i = 0; i < N * K; ++i) dense[e * N * K + i] = f32_to_f16(d[i]);
    });
    const DevBuf<int32_t> d_qw(qw), d_qz(qz), d_slot(slot);
    const DevBuf<uint16_t> d_sc(sc), d_dense(dense);
    for (int64_t M : proto["operating_points_tokens"].get<std::vector<int64_t>>()) {
      SplitMix64 g(7 + M);
      std::vector<int32_t> ids;
      for (int64_t t = 0; t < M; ++t) {
        std::set<int32_t> row;
        while (static_cast<int>(row.size()) < topk) row.insert(static_cast<int32_t>(g.below(E)));
        ids.insert(ids.end(), row.begin(), row.end());
      }
      const auto a = ops::align_routes(ids, M, topk, E, b, ops::AlignOrder::Canonical);
      const auto x = audit::make_random_f16(M, K, 8 + M);  // W13-style: route r reads token r / k
      const int64_t R = M * topk;
      const auto tc = ops::select_thread_config(N, K);
      const int bps = ops::awq_gemm_blocks_per_sm(tc.thread_n, tc.thread_k);
      const int64_t grid = static_cast<int64_t>(prop.multiProcessorCount) * bps;
      const auto s_nat = ops::make_schedule(ops::ScheduleKind::Native, a.num_blocks(), N, K, tc.thread_k, tc.thread_n, grid);
      const auto s_inv = ops::make_schedule(ops::ScheduleKind::Invariant, a.num_blocks(), N, K, tc.thread_k, tc.thread_n, grid);
      const auto s_spl =
          ops::make_schedule(ops::ScheduleKind::InvariantSplit, a.num_blocks(), N, K, tc.thread_k, tc.thread_n, grid);
      const DevBuf<uint16_t> d_x(x);
      const DevBuf<int32_t> d_ids(a.sorted_ids), d_be(a.block_expert);
      DevBuf<uint16_t> d_c(R * N);  // [R, N] fp16
      DevBuf<float> d_ws(std::max<int64_t>({1, ops::awq_workspace_floats(s_nat), ops::awq_workspace_floats(s_spl)}));
      auto desc = [&](const ops::TileSchedule& s) {
        ops::AwqMoeGemmCudaDesc d;
        d.A = reinterpret_cast<const __half*>(d_x.p);
        d.a_row_div = topk;
        d.sorted_ids = d_ids.p;
        d.block_expert = d_be.p;
        d.expert_slot = d_slot.p;
        d.sentinel = a.sentinel();
        d.block_size = b;
        d.qweight = d_qw.p;
        d.qzeros = d_qz.p;
        d.scales = reinterpret_cast<const __half*>(d_sc.p);
        d.C = reinterpret_cast<__half*>(d_c.p);
        d.workspace = d_ws.p;
        d.sched = s;
        return d;
      };
      const auto d_nat = desc(s_nat), d_inv = desc(s_inv), d_spl = desc(s_spl);
      auto run_get = [&](const ops::AwqMoeGemmCudaDesc& d) {
        ops::awq_moe_gemm_cuda(d, nullptr);
        return d_c.download();
      };
      // ---- check first ----
      const auto c_nat = run_get(d_nat), c_inv = run_get(d_inv), c_spl = run_get(d_spl);
      bool correct = true;
      int64_t bad = -1;
      auto close = [](double x, double y) { return std::fabs(x - y) <= kAtol + kRtol * std::fabs(y); };
      for (int64_t i = 0; i < R * N && correct; ++i)
        if (!close(f16_to_f32(c_inv[i]), f16_to_f32(c_nat[i]))) correct = false, bad = i;
      for (int64_t i = 0; i < R * N && correct; ++i)
        if (!close(f16_to_f32(c_spl[i]), f16_to_f32(c_nat[i]))) correct = false, bad = i;
      if (correct && M <= 64) {
        std::vector<uint16_t> c_ref(R * N);
        ops::AwqMoeGemmDesc rd;
        rd.A = x.data();
        rd.num_a_rows = M;
        rd.a_row_div = topk;
        rd.N = N;
        rd.K = K;
        rd.align = &a;
        rd.weights = &W;
        rd.sched = &s_nat;
        rd.C = c_ref.data();
        ops::awq_moe_gemm_ref(rd);
        for (int64_t i = 0; i < R * N && correct; ++i)
          if (!close(f16_to_f32(c_nat[i]), f16_to_f32(c_ref[i]))) correct = false, bad = i;
        // invariant-split vs its own `_ref` (same slices, same reduction order).
        rd.sched = &s_spl;
        ops::awq_moe_gemm_ref(rd);
        for (int64_t i = 0; i < R * N && correct; ++i)
          if (!close(f16_to_f32(c_spl[i]), f16_to_f32(c_ref[i]))) correct = false, bad = i;
      }
      if (!correct)
        std::fprintf(stderr, "CHECK FAILED %s M=%lld N=%lld K=%lld first bad index %lld (route %lld, n %lld)\n",
                     shape["name"].get<std::string>().c_str(), (long long)M, (long long)N, (long long)K, (long long)bad,
                     (long long)(bad / N), (long long)(bad % N));
      // ---- cuBLAS dense fp16 peer: gathered per-expert inputs (outside the timing), one GEMM per expert ----
      std::vector<int64_t> cnt(E, 0), off(E + 1, 0);
      for (int32_t e : ids) ++cnt[e];
      for (int e = 0; e < E; ++e) off[e + 1] = off[e] + cnt[e];
      std::vector<uint16_t> xg(R * K);
      std::vector<int64_t> fill(off.begin(), off.end() - 1);
      for (int64_t r = 0; r < R; ++r) std::copy(x.begin() + (r / topk) * K, x.begin() + (r / topk + 1) * K, xg.begin() + fill[ids[r]]++ * K);
      const DevBuf<uint16_t> d_xg(xg);
      DevBuf<uint16_t> d_cg(R * N);  // [R, N] fp16
      const float one = 1.0f, zero = 0.0f;
      auto cublas_all = [&] {
        for (int e = 0; e < E; ++e)
          if (cnt[e])
            CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, cnt[e], K, &one, d_dense.p + e * N * K, CUDA_R_16F, K,
                                      d_xg.p + off[e] * K, CUDA_R_16F, K, &zero, d_cg.p + off[e] * N, CUDA_R_16F, N,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      // ---- time ----
      nlohmann::json pt;
      pt["M"] = M;
      pt["routes"] = R;
      pt["blocks"] = a.num_blocks();
      pt["grid"] = grid;
      pt["blocks_per_sm"] = bps;
      pt["native_schedule"] = audit::schedule_to_json(s_nat);
      pt["invariant_split_schedule"] = audit::schedule_to_json(s_spl);
      pt["correct"] = correct;
      pt["times_ms"]["native"] = time_it([&] { ops::awq_moe_gemm_cuda(d_nat, nullptr); }, warm, iters);
      pt["times_ms"]["invariant"] = time_it([&] { ops::awq_moe_gemm_cuda(d_inv, nullptr); }, warm, iters);
      pt["times_ms"]["invariant-split"] = time_it([&] { ops::awq_moe_gemm_cuda(d_spl, nullptr); }, warm, iters);
      pt["times_ms"]["cublas_fp16"] = time_it(cublas_all, warm, iters);
      int active = 0;
      for (int e = 0; e < E; ++e) active += cnt[e] > 0;
      const double packed_bytes = double(active) * W[0].packed_bytes(), flops = 2.0 * R * N * K;
      for (const char* m : {"native", "invariant", "invariant-split", "cublas_fp16"}) {
        const double med = median(pt["times_ms"][m].get<std::vector<double>>());
        pt["median_ms"][m] = med;
        std::printf("%s M=%-5lld %-15s median %.4f ms  %.2f TFLOP/s  %.0f GB/s packed weights\n",
                    shape["name"].get<std::string>().c_str(), (long long)M, m, med, flops / med / 1e9,
                    packed_bytes / med / 1e6);
      }
      pt["packed_weight_bytes"] = packed_bytes;
      pt["hbm_floor_ms"] = packed_bytes / (kHbmTBs * 1e12) * 1e3;
      raw["points"][shape["name"].get<std::string>() + "/M=" + std::to_string(M)] = pt;
    }
  }
  std::ofstream(out_path) << raw.dump(1) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  cublasDestroy(handle);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_awq_gemm: %s\n", e.what());
  return 1;
}
