// Random top-k expert ids for MoE tests: M tokens × k distinct experts in [0, E), in a shuffled order,
// deterministic from `seed` (SplitMix64); random fp16 rows; the AWQ GEMM `_ref` runner with its error
// budget. Shared by the alignment, AWQ GEMM and AWQ layer tests.
#pragma once
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "core/half.h"
#include "core/splitmix64.h"
#include "ops/awq_gemm/awq_gemm.h"
#include "ops/route_align/route_align.h"

namespace moesq::test {

inline std::vector<int32_t> random_topk(int64_t M, int k, int E, uint64_t seed) {
  SplitMix64 g(seed);
  std::vector<int32_t> ids;  // [M, k] row-major
  for (int64_t t = 0; t < M; ++t) {
    std::set<int32_t> row;
    while (static_cast<int>(row.size()) < k) row.insert(static_cast<int32_t>(g.below(E)));
    std::vector<int32_t> v(row.begin(), row.end());
    for (size_t i = v.size() - 1; i > 0; --i) std::swap(v[i], v[g.below(i + 1)]);
    ids.insert(ids.end(), v.begin(), v.end());
  }
  return ids;
}

// [rows, cols] fp16 bits uniform in [−1, 1), deterministic from `seed`.
inline std::vector<uint16_t> random_f16(int64_t rows, int64_t cols, uint64_t seed) {
  SplitMix64 g(seed ^ 0xf16f16ull);
  std::vector<uint16_t> v(rows * cols);
  for (auto& h : v) h = f32_to_f16(2.0f * g.uniform() - 1.0f);
  return v;
}

// Implementation-error budget vs an fp64 dot product of the SAME dequantized weights: the fp32 sum of
// K products (relative error ≲ K·2^-24·Σ|a·w|) plus one fp16 rounding (2^-11 relative).
inline constexpr double kRtolF16 = 0x1p-10;
inline constexpr double kAtolSum = 64.0 * 0x1p-24;  // × Σ|a·w|, generous for K ≤ 2048

// The packed-AWQ GEMM on one plan and schedule, through `gemm_fn` (the `_ref`, or the CUDA host wrapper on
// the same descriptor): C [M·k, N] fp16 (and the fp32 values when f32; the `_ref` only).
inline std::vector<uint16_t> run_gemm(const std::vector<uint16_t>& A, int64_t rows, int div, const ops::RouteAlignment& a,
                                      const std::vector<format::AwqLinear>& w, const ops::TileSchedule& s,
                                      std::vector<float>* f32 = nullptr,
                                      void (*gemm_fn)(const ops::AwqMoeGemmDesc&) = ops::awq_moe_gemm_ref) {
  std::vector<uint16_t> C(a.num_routes() * s.N, 0);
  if (f32) f32->assign(C.size(), 0.0f);
  ops::AwqMoeGemmDesc d;
  d.A = A.data();
  d.num_a_rows = rows;
  d.a_row_div = div;
  d.N = s.N;
  d.K = s.K;
  d.align = &a;
  d.weights = &w;
  d.sched = &s;
  d.C = C.data();
  d.C_f32 = f32 ? f32->data() : nullptr;
  gemm_fn(d);
  return C;
}

// The sorted distinct expert ids of a top-k array.
inline std::vector<int32_t> active_experts(const std::vector<int32_t>& ids) {
  std::set<int32_t> s(ids.begin(), ids.end());
  return {s.begin(), s.end()};
}

}  // namespace moesq::test
