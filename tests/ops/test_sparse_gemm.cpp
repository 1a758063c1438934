// The CPU twin of the grouped sparse GEMM (ops/sparse_gemm, sparse_gemm_ref on the launcher's
// descriptor): against the format module's dequantization, and bitwise equal in both activation
// layouts. GPU: tests/gpu/test_sparse_gemm.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "format/fp_codecs.h"
#include "format/kernel_layout.h"
#include "format/nvfp4.h"
#include "ops/act_dispatch/act_dispatch.h"
#include "ops/sparse_gemm/sparse_gemm.h"
#include "support/sparse_gemm_ref_y.h"
#include "support/ops_fixtures.h"

namespace {

using namespace moesq;
using namespace moesq::format;
using namespace moesq::ops;
using namespace moesq::test;  // support/ops_fixtures.h
// ref GEMM (fp64 sum, one fp32 rounding, α applied in fp32) vs an independent fp64 sum over the
// format module's scaled dequantization: only the fp32 roundings of α·acc and of ŵ = q·s/γ differ.
constexpr double kRefVsFormatRelTol = 1e-6;

// Separate γ for rows >= m_split (a fused gate|up from the paper's reference): each half is bitwise the
// GEMM with that half's γ for every row, and a bad m_split is refused naming it.
TEST(GroupedSparseGemmRef, RowsFromMSplitTakeTheirOwnGamma) {
  std::mt19937 rng(23);
  const int E = 3, cap = 4;
  const int64_t M = 64, K = 96, split = 32;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_sparse48(M, K, rng));
  std::vector<const format::Sparse48Tensor*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  auto x = random_rows(4, K, rng);
  std::vector<int32_t> ids = {0, 1, 2, 0, 1, 2, 0, 1};
  const ActBatch a = act_dispatch_batch_ref(x.data(), 4, K, ids.data(), 2, E, cap, true);
  const KernelWeights kw = kernel_layout_from_sparse48(ptrs);
  KernelWeights hi = kw, both = kw;
  for (int e = 0; e < E; ++e) hi.gamma[e] = kw.gamma[e] * (1.5f + static_cast<float>(e));
  both.gamma_hi = hi.gamma, both.m_split = split;
  const std::vector<float> y_lo = test::sparse_gemm_ref_y(kw, a, -1.0f), y_hi = test::sparse_gemm_ref_y(hi, a, -1.0f);
  const std::vector<float> y = test::sparse_gemm_ref_y(both, a, -1.0f);
  int differ = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const bool upper = static_cast<int64_t>(i % M) >= split;
    ASSERT_EQ(y[i], upper ? y_hi[i] : y_lo[i]) << "element " << i;
    differ += y_hi[i] != y_lo[i];
  }
  EXPECT_GT(differ, 0);
  both.m_split = 24;  // not a multiple of 16
  try {
    (void)test::sparse_gemm_ref_y(both, a, -1.0f);
    ADD_FAILURE() << "m_split 24 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m_split=24"), std::string::npos) << e.what();
  }
}

TEST(GroupedSparseGemmRef, AgreesWithFormatDequantization) {
  std::mt19937 rng(21);
  const int E = 3, cap = 5;
  const int64_t M = 19, K = 96;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_sparse48(M, K, rng));
  std::vector<const format::Sparse48Tensor*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  const int T = 6, topk = 2;
  auto x = random_rows(T, K, rng);
  std::vector<int32_t> ids = {0, 1, 0, 2, 1, 0, 0, 2, 0, 1, 0, 2};  // expert 0 gets 6 routes → 1 dropped
  const ActBatch a = act_dispatch_batch_ref(x.data(), T, K, ids.data(), topk, E, cap, true);
  const std::vector<float> y = test::sparse_gemm_ref_y(kernel_layout_from_sparse48(ptrs), a, -1.0f);
  double err = 0.0, ref = 0.0;
  for (int e = 0; e < E; ++e) {
    std::vector<float> w(M * K);
    format::sparse48_dequantize(ts[e], w.data());
    for (int s = 0; s < std::min(a.counts[e], cap); ++s) {
      const size_t slot = e * cap + s;
      const int64_t tok = a.route_of_slot[slot] / topk;
      std::vector<float> xq(K);
      for (int64_t k = 0; k < K; ++k) xq[k] = bf16_to_f32(x[tok * K + k]);
      format::quantize_activation_row(xq.data(), K);
      for (int64_t m = 0; m < M; ++m) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(w[m * K + k]) * xq[k];
        err += (acc - y[slot * M + m]) * (acc - y[slot * M + m]);
        ref += acc * acc;
      }
    }
  }
  EXPECT_GT(ref, 0.0);
  EXPECT_LE(std::sqrt(err / ref), kRefVsFormatRelTol);
  EXPECT_EQ(y[(0 * cap + 4) * M + 0] == -1.0f, false);  // slot 4 of expert 0 written (5 kept routes)
}

// Same tokens in both layouts → bitwise the same Y, including ragged counts, a dropped route and K
// with padding; reading a k-major batch as if it were mma-fragment must change Y (the layout is read).
TEST(GroupedSparseGemmRef, BothActLayoutsGiveBitwiseTheSameY) {
  std::mt19937 rng(22);
  const int E = 3, cap = 5, T = 7, topk = 2;
  for (bool quantize : {true, false}) {
    for (int64_t K : {96, 288}) {
      const int64_t M = 17;
      std::vector<format::Sparse48Tensor> ts;
      for (int e = 0; e < E; ++e) ts.push_back(random_sparse48(M, K, rng));
      std::vector<const format::Sparse48Tensor*> ptrs;
      for (auto& t : ts) ptrs.push_back(&t);
      auto x = random_rows(T, K, rng);
      std::vector<int32_t> ids = {0, 1, 0, 2, 1, 0, 0, 2, 0, 1, 0, 1, 2, 1};  // expert 0: 6 routes → 1 dropped
      const ActBatch frag = act_dispatch_batch_ref(x.data(), T, K, ids.data(), topk, E, cap, quantize);
      const ActBatch kmaj = act_dispatch_batch_ref(x.data(), T, K, ids.data(), topk, E, cap, quantize, ActLayout::kKMajor);
      const KernelWeights kw = kernel_layout_from_sparse48(ptrs);
      const std::vector<float> y_frag = test::sparse_gemm_ref_y(kw, frag, -1.0f);
      const std::vector<float> y_kmaj = test::sparse_gemm_ref_y(kw, kmaj, -1.0f);
      bool nonzero = false;
      for (size_t i = 0; i < y_frag.size(); ++i) {
        ASSERT_EQ(std::memcmp(&y_kmaj[i], &y_frag[i], sizeof(float)), 0)
            << "quantize=" << quantize << " M=" << M << " K=" << K << " expert " << i / (cap * M) << " slot "
            << (i / M) % cap << " m=" << i % M << ": " << y_kmaj[i] << " vs " << y_frag[i];
        nonzero |= y_frag[i] != 0.0f && y_frag[i] != -1.0f;
      }
      EXPECT_TRUE(nonzero);
      ActBatch mislabeled = kmaj;
      mislabeled.layout = ActLayout::kMmaFragment;
      const std::vector<float> y_bad = test::sparse_gemm_ref_y(kw, mislabeled, -1.0f);
      EXPECT_NE(y_bad, y_frag) << "quantize=" << quantize << " K=" << K;
    }
  }
}

}  // namespace
