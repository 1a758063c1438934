// Test helper: runs ops::sparse_gemm_ref (the launcher's descriptor, host pointers) on kernel-layout
// weights and an activation batch (KernelWeights::gamma_hi / m_split honoured); returns y_f32
// [E, capacity, M], untouched slots = `fill`.
#pragma once
#include <vector>

#include "core/error.h"
#include "format/kernel_layout.h"
#include "ops/common/act_batch.h"
#include "ops/sparse_gemm/sparse_gemm.h"

namespace moesq::test {

inline std::vector<float> sparse_gemm_ref_y(const format::KernelWeights& kw, const ops::ActBatch& act, float fill) {
  MOESQ_CHECK(kw.num_experts == act.num_experts && kw.K_pad == act.K_pad && kw.meta_order == format::kDefaultMetaOrder,
              "sparse_gemm_ref_y: weights E=", kw.num_experts, " K_pad=", kw.K_pad, " vs batch E=", act.num_experts,
              " K_pad=", act.K_pad);
  std::vector<float> inv_gamma(kw.num_experts);
  for (int e = 0; e < kw.num_experts; ++e) inv_gamma[e] = 1.0f / kw.gamma[e];
  std::vector<float> inv_gamma_hi(kw.gamma_hi.size());
  for (size_t e = 0; e < kw.gamma_hi.size(); ++e) inv_gamma_hi[e] = 1.0f / kw.gamma_hi[e];
  std::vector<float> y(static_cast<size_t>(act.num_experts) * act.capacity * kw.M, fill);
  ops::SparseGemmArgs a;
  a.w = kw.data.data();
  a.w_inv_gamma = inv_gamma.data();
  a.w_inv_gamma_hi = kw.gamma_hi.empty() ? nullptr : inv_gamma_hi.data();
  a.m_split = kw.m_split;
  a.x = act.x.data();
  a.x_layout = act.layout;
  a.x_inv_scale = act.inv_scale.data();
  a.counts = act.counts.data();
  a.y_f32 = y.data();
  a.num_experts = act.num_experts;
  a.capacity = act.capacity;
  a.M = kw.M;
  a.M_pad = kw.M_pad;
  a.K_pad = kw.K_pad;
  a.ldy = kw.M;
  ops::sparse_gemm_ref(a);
  return y;
}

}  // namespace moesq::test
