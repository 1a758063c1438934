// The packed-AWQ MoE GEMM reference (ops/awq_gemm): correctness against an fp64 dense product on awkward
// M, and an exact integer-valued case under every schedule. The paper-000 mechanism and the layer's
// invariance: tests/audit/test_awq_layer.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/half.h"
#include "support/moe_fixtures.h"
#include "ops/route_align/route_align.h"
#include "ops/awq_gemm/awq_gemm.h"

using namespace moesq;
using namespace moesq::format;
using namespace moesq::ops;

namespace {

using namespace moesq::test;  // support/moe_fixtures.h

}  // namespace

TEST(AwqGemmRef, MatchesFp64DenseProductOnAwkwardShapes) {
  const int64_t N = 256, K = 512;
  const int E = 6, k = 2;
  for (int64_t M : {1, 2, 3, 7, 9}) {
    const auto ids = random_topk(M, k, E, 100 + M);
    const auto a = align_routes(ids, M, k, E, 8, AlignOrder::Native, M);
    std::vector<AwqLinear> w(E);
    for (int32_t e : active_experts(ids)) w[e] = awq_random(N, K, 7 * e + 1, 0.005f, 0.02f);
    const auto A = random_f16(M, K, 40 + M);
    const auto s = make_schedule(ScheduleKind::Native, a.num_blocks(), N, K, 64, 128, 5);  // forces splits
    const auto C = run_gemm(A, M, k, a, w, s);
    int nonzero = 0;
    for (int64_t r = 0; r < M * k; ++r) {
      const AwqLinear& we = w[ids[r]];
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0, mag = 0;
        for (int64_t kk = 0; kk < K; ++kk) {
          const double p = double(f16_to_f32(A[(r / k) * K + kk])) * awq_dequant_one(we, n, kk);
          ref += p;
          mag += std::fabs(p);
        }
        const double got = f16_to_f32(C[r * N + n]);
        ASSERT_LE(std::fabs(got - ref), kRtolF16 * std::fabs(ref) + kAtolSum * mag)
            << "M=" << M << " N=" << N << " K=" << K << " route " << r << " expert " << ids[r] << " n=" << n;
        nonzero += got != 0.0;
      }
    }
    EXPECT_GT(nonzero, M * k * N / 2) << "M=" << M;
  }
}

TEST(AwqGemmRef, IntegerValuedCaseIsExactUnderEverySchedule) {
  // Scales 1.0 and small integer activations: every partial sum is an integer below 2^11, exact in
  // fp32 and fp16, so all schedules and grids must agree bit for bit with the integer dot product.
  const int64_t N = 128, K = 256, M = 5;
  const int E = 3, k = 2;
  const auto ids = random_topk(M, k, E, 1);
  std::vector<AwqLinear> w(E);
  SplitMix64 g(2);
  for (int e = 0; e < E; ++e) {
    std::vector<uint8_t> codes(K * N), zeros(K / 128 * N, 8);
    for (auto& c : codes) c = 6 + g.below(5);  // q − z ∈ [−2, 2]
    w[e] = awq_from_codes(N, K, codes, zeros, std::vector<uint16_t>(K / 128 * N, f32_to_f16(1.0f)));
  }
  std::vector<uint16_t> A(M * K);
  for (auto& x : A) x = f32_to_f16(static_cast<float>(static_cast<int>(g.below(5)) - 2));
  const auto a = align_routes(ids, M, k, E, 8, AlignOrder::Native, 3);
  for (int64_t G : {1, 2, 3, 100}) {
    const auto s = make_schedule(ScheduleKind::Native, a.num_blocks(), N, K, 64, 128, G);
    const auto C = run_gemm(A, M, k, a, w, s);
    for (int64_t r = 0; r < M * k; ++r)
      for (int64_t n = 0; n < N; ++n) {
        int64_t ref = 0;
        for (int64_t kk = 0; kk < K; ++kk)
          ref += static_cast<int64_t>(f16_to_f32(A[(r / k) * K + kk])) * (w[ids[r]].q(kk, n) - 8);
        ASSERT_EQ(f16_to_f32(C[r * N + n]), static_cast<float>(ref)) << "G=" << G << " route " << r << " n=" << n;
      }
  }
}
