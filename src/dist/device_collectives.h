// Collectives on DEVICE buffers between the ranks of a Communicator, one GPU per rank, through NCCL
// (docs/PARALLEL.md "The expert-parallel engine"). The Communicator stays the process and bootstrap
// layer: rank 0's ncclUniqueId travels by its broadcast(). What the expert-parallel engine's exchange
// calls when every rank has a GPU of its own; NCCL refuses two ranks on one GPU, where the engine keeps
// the host-staged exchange (runtime::host_staged_exchange over dist::allreduce_sum_u32).
// Built only with CUDA (src/dist/*.cu); without NCCL at build time, create() is an Error naming it.
#pragma once
#include <cstdint>
#include <memory>

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

#include "dist/communicator.h"

namespace moesq::dist {

// Whether this build links NCCL.
bool nccl_built();

class DeviceCollectives {
 public:
  // Collective over every rank of `comm`: each rank joins on CUDA device `device` (which it must own:
  // two ranks on one GPU are refused by NCCL). Error, on every rank, naming NCCL's reason when any
  // rank fails to join (the ranks agree through comm.allgather, so none waits for a failed peer), or
  // when the build has no NCCL.
  static std::unique_ptr<DeviceCollectives> create(Communicator& comm, int device);
  ~DeviceCollectives();
  DeviceCollectives(const DeviceCollectives&) = delete;
  DeviceCollectives& operator=(const DeviceCollectives&) = delete;

  // Collective, enqueued on `stream` (capturable in a CUDA graph): words[0, count) (device memory, the
  // same count on every rank) become their uint32 sum over the ranks (ncclUint32, ncclSum: an integer
  // sum, wrapping, exact, so the bits are the same on every rank whatever NCCL's reduction order).
  // Error naming NCCL's reason when the enqueue fails.
  void allreduce_sum_u32(uint32_t* words, int64_t count, cudaStream_t stream);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  DeviceCollectives() = default;
  void* comm_ = nullptr;  // ncclComm_t
  int rank_ = 0, size_ = 1;
};

}  // namespace moesq::dist
