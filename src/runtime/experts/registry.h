// The ONE table of the expert backends the GPU engine builds. A row ROW(id, impl) names the backend's
// halves impl_host() (experts/<file>.cpp, CPU library) and impl_device() (experts/<file>.cu, CUDA
// library); the table expands once in registry.cpp (names, host halves) and once in registry.cu (device
// halves), so the CPU build links without any kernel. Order = the order of the "built:" list in errors.
#pragma once
#include "runtime/backend.h"
#include "runtime/experts/expert_backend.h"

#define MOESQ_EXPERT_BACKENDS(ROW)                         \
  ROW(::moesq::runtime::ExpertBackend::kBf16, bf16)         \
  ROW(::moesq::runtime::ExpertBackend::kSparseW4A4, sparse_w4a4) \
  ROW(::moesq::runtime::ExpertBackend::kSparseW4A16, sparse_w4a16)

namespace moesq::runtime {

#define MOESQ_EXPERT_BACKEND_HALVES(id, impl) \
  const ExpertBackendHost& impl##_host();     \
  const ExpertBackendDevice& impl##_device();
MOESQ_EXPERT_BACKENDS(MOESQ_EXPERT_BACKEND_HALVES)
#undef MOESQ_EXPERT_BACKEND_HALVES

// The halves of a built backend; Error naming it and the built ones otherwise (kAuto included:
// resolve it first, weights.h resolve_backend).
const ExpertBackendHost& expert_backend_host(ExpertBackend b);
const ExpertBackendDevice& expert_backend_device(ExpertBackend b);  // CUDA builds only

}  // namespace moesq::runtime
