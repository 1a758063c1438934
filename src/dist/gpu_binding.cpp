// dist/gpu_binding.h.
#include "dist/gpu_binding.h"

#include "core/error.h"

namespace moesq::dist {

int gpu_for_local_rank(int local_rank, int local_size, int device_count) {
  MOESQ_CHECK(device_count >= 1, "gpu_for_local_rank: device_count ", device_count, " (no visible GPU)");
  MOESQ_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size, "gpu_for_local_rank: local rank ",
              local_rank, " outside [0, ", local_size, ")");
  return local_rank % device_count;
}

std::string gpu_sharing_note(int local_size, int device_count) {
  if (local_size <= device_count || device_count < 1) return "";
  return std::to_string(local_size) + " ranks on this host share its " + std::to_string(device_count) + " GPU" +
         (device_count == 1 ? "" : "s") + " (rank mod " + std::to_string(device_count) +
         "): the same bits as one GPU per rank, slower";
}

}  // namespace moesq::dist
