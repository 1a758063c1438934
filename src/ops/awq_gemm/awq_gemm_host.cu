// awq_moe_gemm_cuda_host (awq_gemm.h): the CUDA GEMM behind the host-buffer AwqMoeGemmDesc of the `_ref`,
// so callers that hold host tensors (the audit layer) can swap the two. Non-obvious: only the experts
// the plan uses are uploaded, and expert_slot maps an expert id to its slot in the packed arrays.
#include <vector>

#include <cuda_fp16.h>

#include "core/cuda/dev_buf.cuh"
#include "ops/awq_gemm/awq_gemm.h"

namespace moesq::ops {

void awq_moe_gemm_cuda_host(const ops::AwqMoeGemmDesc& d) {
  ops::awq_moe_gemm_check(d);
  MOESQ_CHECK(d.C_f32 == nullptr, "awq_moe_gemm_cuda_host: the fp32 capture (C_f32) exists only in the _ref");
  if (!awq_gemm_cuda_supported(*d.sched, d.align->block_size)) return ops::awq_moe_gemm_ref(d);
  const ops::RouteAlignment& a = *d.align;
  const auto& W = *d.weights;
  std::vector<int32_t> slot(W.size(), -1), qw, qz;
  std::vector<uint16_t> sc;
  int nslots = 0;
  for (int32_t e : a.block_expert)
    if (slot[e] < 0) {
      slot[e] = nslots++;
      qw.insert(qw.end(), W[e].qweight.begin(), W[e].qweight.end());
      qz.insert(qz.end(), W[e].qzeros.begin(), W[e].qzeros.end());
      sc.insert(sc.end(), W[e].scales.begin(), W[e].scales.end());
    }
  const int64_t R = a.num_routes();
  DevBuf<uint16_t> dA(d.A, d.num_a_rows * d.K), dS(sc.data(), sc.size()), dC(R * d.N);
  DevBuf<int32_t> dIds(a.sorted_ids.data(), a.sorted_ids.size()), dBE(a.block_expert.data(), a.block_expert.size()),
      dSlot(slot.data(), slot.size()), dQW(qw.data(), qw.size()), dQZ(qz.data(), qz.size());
  DevBuf<float> ws(static_cast<size_t>(awq_workspace_floats(*d.sched)));
  MOESQ_CUDA_CHECK(cudaMemset(dC.p, 0, R * d.N * 2));
  AwqMoeGemmCudaDesc c;
  c.A = reinterpret_cast<const __half*>(dA.p);
  c.a_row_div = d.a_row_div;
  c.sorted_ids = dIds.p;
  c.block_expert = dBE.p;
  c.expert_slot = dSlot.p;
  c.sentinel = a.sentinel();
  c.block_size = a.block_size;
  c.qweight = dQW.p;
  c.qzeros = dQZ.p;
  c.scales = reinterpret_cast<const __half*>(dS.p);
  c.C = reinterpret_cast<__half*>(dC.p);
  c.workspace = ws.p;
  c.sched = *d.sched;
  awq_moe_gemm_cuda(c, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  MOESQ_CUDA_CHECK(cudaMemcpy(d.C, dC.p, R * d.N * 2, cudaMemcpyDeviceToHost));
}

}  // namespace moesq::ops
