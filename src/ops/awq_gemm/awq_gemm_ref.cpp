// Reference packed-AWQ MoE GEMM (see awq_gemm.h). Non-obvious: weights are dequantized per K-tile
// through a 16-entry table per column ((q − z)·s rounded to fp16 once per code), which is bit-identical
// to awq_dequant_one and keeps the reference fast enough for the full Qwen3 fixture in CI.
#include "ops/awq_gemm/awq_gemm.h"

#include <algorithm>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"

namespace moesq::ops {

void awq_moe_gemm_check(const AwqMoeGemmDesc& d) {
  MOESQ_CHECK(d.A && d.C && d.align && d.weights && d.sched, "awq_moe_gemm: null field in the descriptor");
  const RouteAlignment& a = *d.align;
  const TileSchedule& s = *d.sched;
  MOESQ_CHECK(s.N == d.N && s.K == d.K && s.num_blocks == a.num_blocks(), "awq_moe_gemm: schedule is for blocks=",
              s.num_blocks, " N=", s.N, " K=", s.K, " but the call has blocks=", a.num_blocks(), " N=", d.N,
              " K=", d.K);
  MOESQ_CHECK(d.a_row_div > 0 && (a.num_routes() + d.a_row_div - 1) / d.a_row_div <= d.num_a_rows,
              "awq_moe_gemm: ", a.num_routes(), " routes / a_row_div ", d.a_row_div, " exceed the ",
              d.num_a_rows, " input rows");
  MOESQ_CHECK(s.thread_k % format::kAwqGroup == 0 || format::kAwqGroup % s.thread_k == 0, "awq_moe_gemm: thread_k ", s.thread_k,
              " must divide or be a multiple of the AWQ group 128");
  for (int64_t p = 0; p < a.num_blocks(); ++p) {
    const int32_t e = a.block_expert[p];
    MOESQ_CHECK(e >= 0 && e < static_cast<int32_t>(d.weights->size()), "awq_moe_gemm: block ", p, " expert ", e,
                " has no weights (", d.weights->size(), " experts)");
    const format::AwqLinear& w = (*d.weights)[e];
    MOESQ_CHECK(!w.empty() && w.N == d.N && w.K == d.K, "awq_moe_gemm: expert ", e, " weights are [", w.N, ", ",
                w.K, "], the GEMM needs [N=", d.N, ", K=", d.K, "]");
  }
}

void awq_moe_gemm_ref(const AwqMoeGemmDesc& d) {
  awq_moe_gemm_check(d);
  const RouteAlignment& a = *d.align;
  const TileSchedule& s = *d.sched;
  const int64_t K = d.K, N = d.N, TK = s.thread_k, TN = s.thread_n, b = a.block_size;
  parallel_for(s.tiles, [&](int64_t t) {
    const int64_t p = t / s.n_tiles, n0 = (t % s.n_tiles) * TN;
    const format::AwqLinear& w = (*d.weights)[a.block_expert[p]];
    std::vector<int32_t> routes;
    for (int64_t i = 0; i < b; ++i)
      if (a.sorted_ids[p * b + i] != a.sentinel()) routes.push_back(a.sorted_ids[p * b + i]);
    if (routes.empty()) return;
    const int64_t R = static_cast<int64_t>(routes.size());
    std::vector<float> arow(R * TK), slab(TK * TN), table(16 * TN);
    std::vector<float> partial(R * TN), acc(R * TN), out(R * TN, 0.0f);
    const int num_slices = s.tile_slices(t);
    const int64_t kt_per_slice = s.k_tiles / num_slices;
    for (int slice = 0; slice < num_slices; ++slice) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t kt = slice * kt_per_slice; kt < (slice + 1) * kt_per_slice; ++kt) {
        const int64_t k0 = kt * TK;
        // Dequantize the [TK, TN] weight slab; the group is constant when TK <= 128 (checked above).
        for (int64_t kk = 0; kk < TK; ++kk) {
          const int64_t k = k0 + kk;
          if (kk == 0 || k % format::kAwqGroup == 0) {
            const int64_t g = k / format::kAwqGroup;
            for (int64_t j = 0; j < TN; ++j) {
              const int z = w.zero(g, n0 + j);
              const float sc = f16_to_f32(w.scale(g, n0 + j));
              for (int q = 0; q < 16; ++q) table[j * 16 + q] = f16_to_f32(f32_to_f16(static_cast<float>(q - z) * sc));
            }
          }
          for (int64_t j = 0; j < TN; ++j) slab[kk * TN + j] = table[j * 16 + w.q(k, n0 + j)];
        }
        for (int64_t i = 0; i < R; ++i) {
          const uint16_t* src = d.A + (routes[i] / d.a_row_div) * K + k0;
          for (int64_t kk = 0; kk < TK; ++kk) arow[i * TK + kk] = f16_to_f32(src[kk]);
        }
        // K-tile partial sums: sequential over k for every (row, column); vectorizes over columns.
        std::fill(partial.begin(), partial.end(), 0.0f);
        for (int64_t i = 0; i < R; ++i) {
          float* __restrict pr = &partial[i * TN];
          for (int64_t kk = 0; kk < TK; ++kk) {
            const float av = arow[i * TK + kk];
            const float* __restrict wr = &slab[kk * TN];
            for (int64_t j = 0; j < TN; ++j) pr[j] += av * wr[j];
          }
        }
        for (int64_t i = 0; i < R * TN; ++i) acc[i] += partial[i];
      }
      // Global fp32 reduction in fixed slice order (slice 0 initializes).
      for (int64_t i = 0; i < R * TN; ++i) out[i] = slice == 0 ? acc[i] : out[i] + acc[i];
    }
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < TN; ++j) {
        const float v = out[i * TN + j];
        d.C[routes[i] * N + n0 + j] = f32_to_f16(v);
        if (d.C_f32) d.C_f32[routes[i] * N + n0 + j] = v;
      }
  });
}

}  // namespace moesq::ops
