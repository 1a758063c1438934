// Expert backend names (backend.h); which are built is the table of experts/registry.h.
#include "runtime/backend.h"

#include "core/error.h"

namespace moesq::runtime {

namespace {
constexpr ExpertBackend kAll[] = {ExpertBackend::kAuto,        ExpertBackend::kBf16,     ExpertBackend::kSparseW4A4,
                                  ExpertBackend::kSparseW4A16, ExpertBackend::kAwqW4A16, ExpertBackend::kNvfp4W4A16};
}

const char* expert_backend_name(ExpertBackend b) {
  switch (b) {
    case ExpertBackend::kAuto: return "auto";
    case ExpertBackend::kBf16: return "bf16";
    case ExpertBackend::kSparseW4A4: return "sparse-w4a4";
    case ExpertBackend::kSparseW4A16: return "sparse-w4a16";
    case ExpertBackend::kAwqW4A16: return "awq-w4a16";
    case ExpertBackend::kNvfp4W4A16: return "nvfp4-w4a16";
  }
  return "?";
}

ExpertBackend parse_expert_backend(const std::string& s) {
  for (ExpertBackend b : kAll)
    if (s == expert_backend_name(b)) return b;
  MOESQ_FAIL("--experts: \"", s, "\" is not one of auto, bf16, sparse-w4a4, sparse-w4a16, awq-w4a16, nvfp4-w4a16");
}

}  // namespace moesq::runtime
