// The CUDA backend of `moesq audit`: native alignment by atomics on the device (ops::align_routes_cuda),
// the packed-AWQ GEMM kernel for both layer GEMMs (ops::awq_moe_gemm_cuda_host), and H1's persistent
// device tensors (paper 000: three tensors shaped like the input, top-k weights and top-k ids, filled
// once before the layer is built, never used by it).
#pragma once
#include "audit/audit.h"

namespace moesq::audit {

audit::AuditBackend cuda_audit_backend();

}  // namespace moesq::audit
