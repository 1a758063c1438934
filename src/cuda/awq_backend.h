// The CUDA backend of `moesq audit`: native alignment by atomics on the device, the packed-AWQ GEMM
// kernel for both layer GEMMs, and H1's persistent device tensors (paper 000: three tensors shaped like
// the input, top-k weights and top-k ids, filled once before the layer is built, never used by it).
#pragma once
#include "moe/audit.h"

namespace moesq::cuda {

moe::AuditBackend cuda_audit_backend();

// The CUDA GEMM as a moe::AwqGemmFn on HOST buffers (uploads, runs awq_moe_gemm_cuda, downloads).
// Falls back to moe::awq_moe_gemm_ref for configs the kernel does not support.
void awq_moe_gemm_cuda_host(const moe::AwqMoeGemmDesc& d);

// Native alignment on the device: one thread per route claims its slot in its expert's region with
// atomicAdd (vLLM moe_align_block_size's scatter), so the order inside an expert is the atomic order.
moe::RouteAlignment align_routes_cuda(const std::vector<int32_t>& topk_ids, int64_t M, int topk, int num_experts,
                                      int block_size);

}  // namespace moesq::cuda
