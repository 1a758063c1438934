// CPU twin of ops::gemm_bf16 (gemm_bf16.h): plain loops, fp64 accumulation of exact bf16 products.
#include "ops/gemm_bf16/gemm_bf16.h"

#include <algorithm>

#include "core/error.h"
#include "core/half.h"

namespace moesq::ops {

void gemm_bf16_check(const GemmBf16Args& a) {
  MOESQ_CHECK(a.groups >= 1 && a.M >= 0 && a.N > 0 && a.K > 0, "gemm_bf16: bad sizes G=", a.groups, " M=", a.M,
              " N=", a.N, " K=", a.K);
  MOESQ_CHECK(a.K % 8 == 0, "gemm_bf16: K=", a.K, " is not a multiple of 8 (16-byte rows)");
  MOESQ_CHECK(a.ldy >= a.N, "gemm_bf16: ldy=", a.ldy, " < N=", a.N);
  MOESQ_CHECK((a.y_f32 != nullptr) != (a.y_bf16 != nullptr), "gemm_bf16: give exactly one of y_f32, y_bf16");
  MOESQ_CHECK(!a.accumulate || a.y_f32, "gemm_bf16: accumulate needs the fp32 output");
  MOESQ_CHECK(a.x && a.w, "gemm_bf16: null input");
  MOESQ_CHECK(!a.split_ws || (a.groups == 1 && a.y_f32 && !a.counts), "gemm_bf16: split_ws needs groups == 1, y_f32 and no counts");
  if (a.fused_topk) {
    const RouterTopkArgs& r = *a.fused_topk;
    MOESQ_CHECK(a.groups == 1 && !a.counts && a.y_f32 && !a.accumulate && r.logits == a.y_f32 && r.T == a.M &&
                    r.num_experts == a.N && a.ldy == a.N,
                "gemm_bf16: fused_topk needs groups 1, no counts, no accumulate and the routing's logits [T=", r.T,
                ", E=", r.num_experts, "] to be this GEMM's fp32 output [M=", a.M, ", N=", a.N, ", ldy=", a.ldy, "]");
    MOESQ_CHECK(a.topk_ticket, "gemm_bf16: fused_topk without a topk_ticket");
    router_topk_check(r);
  }
}

size_t gemm_bf16_split_floats(int64_t M, int64_t N, int64_t K) {
  return static_cast<size_t>((K + kGemmSplitK - 1) / kGemmSplitK) * std::max<int64_t>(M, 1) * N;
}

void gemm_bf16_ref(const GemmBf16Args& a) {
  gemm_bf16_check(a);
  for (int g = 0; g < a.groups; ++g) {
    const int64_t rows = a.counts ? std::clamp<int64_t>(a.counts[g], 0, a.M) : a.M;
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t n = 0; n < a.N; ++n) {
        const uint16_t* xr = a.x + (g * a.M + m) * a.K;
        const uint16_t* wr = a.w + (g * a.N + n) * a.K;
        double acc = 0.0;
        const uint16_t* lr = a.x_lo ? a.x_lo + (g * a.M + m) * a.K : nullptr;
        for (int64_t k = 0; k < a.K; ++k) {
          acc += static_cast<double>(bf16_to_f32(xr[k]) * bf16_to_f32(wr[k]));
          if (lr) acc += static_cast<double>(bf16_to_f32(lr[k]) * bf16_to_f32(wr[k]));
        }
        const int64_t o = (g * a.M + m) * a.ldy + n;
        if (a.y_f32)
          a.y_f32[o] = a.accumulate ? a.y_f32[o] + static_cast<float>(acc) : static_cast<float>(acc);
        else
          a.y_bf16[o] = f32_to_bf16(static_cast<float>(acc));
      }
  }
  if (a.fused_topk) router_topk_ref(*a.fused_topk);
}

}  // namespace moesq::ops
