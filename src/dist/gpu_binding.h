// Which GPU a rank uses (docs/PARALLEL.md): one process per GPU is the layout of a multi-GPU run, so a
// rank takes the GPU of its index among the ranks of its own host. A pure function of the host-local
// rank and the visible device count (CUDA_VISIBLE_DEVICES narrows those), the same rule on every host:
// no rank asks another, and the outputs do not depend on the binding (every expert's result depends
// only on its seed stream, docs/PARALLEL.md).
#pragma once
#include <string>

namespace moesq::dist {

// The device ordinal of host-local rank `local_rank` (in [0, local_size)) among `device_count` visible
// GPUs: local_rank mod device_count, so more ranks than GPUs share them round-robin. Error naming the
// argument for device_count < 1 or a rank outside [0, local_size).
int gpu_for_local_rank(int local_rank, int local_size, int device_count);

// One line for the run's log: empty when every rank of the host has a GPU of its own, else how many
// ranks share how many GPUs (they still give the same bits, only slower).
std::string gpu_sharing_note(int local_size, int device_count);

}  // namespace moesq::dist
