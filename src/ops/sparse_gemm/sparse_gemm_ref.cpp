// CPU twin of the grouped sparse GEMM (sparse_gemm.h): the launcher's own descriptor, HOST pointers.
//
// Non-obvious decision: the weights are read from the same kernel-layout bytes the GPU streams
// (format::kernel_layout_unpack_ref, exact dec(q)·dec(scale)), products are summed in fp64 in
// logical K order over all K_pad columns (the padding holds exact zeros, so adding it changes no
// bit), and the sum is rounded once to fp32 before α = (1/γ_w)·(1/γ_a) — the kernel's order up to
// its fp32 accumulation order. Both activation layouts give bitwise the same y.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "ops/sparse_gemm/sparse_gemm.h"

namespace moesq::ops {

void sparse_gemm_ref(const SparseGemmArgs& a) {
  MOESQ_CHECK(a.num_experts > 0 && a.M > 0 && a.M_pad >= a.M && a.M_pad % format::kMmaM == 0 && a.K_pad > 0 &&
                  a.K_pad % format::kChunkK == 0,
              "sparse_gemm_ref: E=", a.num_experts, " M=", a.M, " M_pad=", a.M_pad, " K_pad=", a.K_pad,
              " (M_pad % 16, K_pad % 256 required)");
  MOESQ_CHECK(a.w && a.w_inv_gamma && a.x && a.counts && (a.y || a.y_f32) && a.ldy >= a.M && a.capacity >= 0,
              "sparse_gemm_ref: missing buffer, ldy=", a.ldy, " < M=", a.M, " or capacity=", a.capacity);
  MOESQ_CHECK(!a.w_inv_gamma_hi || (a.m_split > 0 && a.m_split < a.M && a.m_split % 16 == 0), "sparse_gemm_ref: m_split=",
              a.m_split, " must be a multiple of 16 in (0, M=", a.M, ") when w_inv_gamma_hi is given");
  const int64_t M = a.M, K = a.K_pad;
  const size_t expert_bytes = static_cast<size_t>(a.M_pad / format::kMmaM) * (a.K_pad / format::kChunkK) * format::kChunkBytes;
  std::vector<float> w(static_cast<size_t>(M * K));
  for (int e = 0; e < a.num_experts; ++e) {
    format::kernel_layout_unpack_ref(a.w + e * expert_bytes, M, K, a.M_pad, a.K_pad, format::kDefaultMetaOrder, w.data());
    const int n = std::min(a.counts[e], a.capacity);
    const float inv_w = a.w_inv_gamma[e];
    const float inv_w_hi = a.w_inv_gamma_hi ? a.w_inv_gamma_hi[e] : inv_w;
    parallel_for(n, [&](int64_t slot) {
      const size_t s = static_cast<size_t>(e) * a.capacity + slot;
      std::vector<double> xv(K);
      for (int64_t k = 0; k < K; ++k) xv[k] = bf16_to_f32(a.x[s * a.K_pad + format::act_storage_index(k, a.x_layout)]);
      const float inv_a = a.x_inv_scale ? a.x_inv_scale[s] : 1.0f;
      for (int64_t m = 0; m < M; ++m) {
        const float alpha = (a.w_inv_gamma_hi && m >= a.m_split ? inv_w_hi : inv_w) * inv_a;
        double acc = 0.0;
        const float* wr = w.data() + m * K;
        for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(wr[k]) * xv[k];
        const float v = static_cast<float>(acc) * alpha;
        if (a.y_f32) a.y_f32[s * a.ldy + m] = v;
        if (a.y) a.y[s * a.ldy + m] = f32_to_bf16(v);
      }
    });
  }
}

}  // namespace moesq::ops
