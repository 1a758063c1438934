// Expert backend names (backend.h): one row per ExpertBackend value, in the order the CLI lists them;
// which are built is the table of experts/registry.h.
#include "runtime/backend.h"

#include "core/error.h"

namespace moesq::runtime {

namespace {

struct NameRow {
  ExpertBackend id;
  const char* name;
};
constexpr NameRow kNames[] = {
    {ExpertBackend::kAuto, "auto"},           {ExpertBackend::kBf16, "bf16"},
    {ExpertBackend::kSparseW4A4, "sparse-w4a4"}, {ExpertBackend::kSparseW4A16, "sparse-w4a16"},
    {ExpertBackend::kAwqW4A16, "awq-w4a16"},  {ExpertBackend::kNvfp4W4A16, "nvfp4-w4a16"},
};

}  // namespace

const char* expert_backend_name(ExpertBackend b) {
  for (const NameRow& r : kNames)
    if (r.id == b) return r.name;
  return "?";
}

ExpertBackend parse_expert_backend(const std::string& s) {
  std::string all;
  for (const NameRow& r : kNames) {
    if (s == r.name) return r.id;
    all += (all.empty() ? "" : ", ") + std::string(r.name);
  }
  MOESQ_FAIL("--experts: \"", s, "\" is not one of ", all);
}

}  // namespace moesq::runtime
