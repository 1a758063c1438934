// The built expert backends (registry.h): which are built, their list, their host halves.
#include "runtime/experts/registry.h"

#include "core/error.h"

namespace moesq::runtime {

namespace {

struct HostRow {
  ExpertBackend id;
  const ExpertBackendHost& (*host)();
};
#define MOESQ_HOST_ROW(id, impl) HostRow{id, &impl##_host},
constexpr HostRow kRows[] = {MOESQ_EXPERT_BACKENDS(MOESQ_HOST_ROW)};
#undef MOESQ_HOST_ROW

}  // namespace

bool expert_backend_built(ExpertBackend b) {
  if (b == ExpertBackend::kAuto) return true;
  for (const HostRow& r : kRows)
    if (r.id == b) return true;
  return false;
}

std::string built_expert_backends() {
  std::string s;
  for (const HostRow& r : kRows) s += (s.empty() ? "" : ", ") + std::string(expert_backend_name(r.id));
  return s;
}

void require_built(ExpertBackend b) {
  MOESQ_CHECK(expert_backend_built(b), "expert backend ", expert_backend_name(b),
              " is not built in the GPU engine; built: ", built_expert_backends());
}

const ExpertBackendHost& expert_backend_host(ExpertBackend b) {
  for (const HostRow& r : kRows)
    if (r.id == b) return r.host();
  MOESQ_FAIL("expert backend ", expert_backend_name(b), " is not built in the GPU engine; built: ",
             built_expert_backends());
}

}  // namespace moesq::runtime
