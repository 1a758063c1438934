// The device halves of the built expert backends (registry.h), from the same table.
#include "runtime/experts/registry.h"

#include "core/error.h"

namespace moesq::runtime {

namespace {

struct DeviceRow {
  ExpertBackend id;
  const ExpertBackendDevice& (*device)();
};
#define MOESQ_DEVICE_ROW(id, impl) DeviceRow{id, &impl##_device},
constexpr DeviceRow kRows[] = {MOESQ_EXPERT_BACKENDS(MOESQ_DEVICE_ROW)};
#undef MOESQ_DEVICE_ROW

}  // namespace

const ExpertBackendDevice& expert_backend_device(ExpertBackend b) {
  for (const DeviceRow& r : kRows)
    if (r.id == b) return r.device();
  MOESQ_FAIL("expert backend ", expert_backend_name(b), " is not built in the GPU engine; built: ",
             built_expert_backends());
}

}  // namespace moesq::runtime
