#include "dist/device_collectives.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/error.h"

#ifdef MOESQ_HAVE_NCCL
#include <nccl.h>
#endif

namespace moesq::dist {

bool nccl_built() {
#ifdef MOESQ_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

#ifdef MOESQ_HAVE_NCCL
namespace {

std::string nccl_reason(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += std::string(": ") + last;
  return s;
}

}  // namespace
#endif

std::unique_ptr<DeviceCollectives> DeviceCollectives::create(Communicator& comm, int device) {
#ifndef MOESQ_HAVE_NCCL
  (void)comm, (void)device;
  MOESQ_FAIL("the NCCL exchange: this moesq was built without NCCL (nccl.h and libnccl were not found by CMake)");
#else
  std::unique_ptr<DeviceCollectives> d(new DeviceCollectives());
  d->rank_ = comm.rank(), d->size_ = comm.size();
  MOESQ_CUDA_CHECK(cudaSetDevice(device));
  std::string id(sizeof(ncclUniqueId), '\0');
  std::string failed;  // this rank's reason, "" when it joined
  if (comm.rank() == 0) {
    ncclUniqueId u;
    const ncclResult_t r = ncclGetUniqueId(&u);
    if (r == ncclSuccess) std::memcpy(id.data(), &u, sizeof u);
    else failed = std::string("ncclGetUniqueId: ") + nccl_reason(r, nullptr);
  }
  // Rank 0's id, or its failure (an empty string), reaches every rank.
  if (!failed.empty()) id.clear();
  comm.broadcast(id, 0);
  if (id.size() != sizeof(ncclUniqueId)) {
    if (failed.empty()) failed = "rank 0 could not make the NCCL unique id";
  } else {
    ncclUniqueId u;
    std::memcpy(&u, id.data(), sizeof u);
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRank(&c, comm.size(), u, comm.rank());
    if (r == ncclSuccess) d->comm_ = c;
    else failed = std::string("ncclCommInitRank on GPU ") + std::to_string(device) + ": " + nccl_reason(r, c);
  }
  // Every rank learns whether all joined: a failure ends every rank with the first reason.
  const std::vector<std::string> all = comm.allgather(failed);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty())
      MOESQ_FAIL("the NCCL exchange over ", comm.size(), " ranks: rank ", r, ": ", all[r],
                 " (NCCL needs one GPU per rank; ranks that share a GPU use the host-staged exchange)");
  return d;
#endif
}

DeviceCollectives::~DeviceCollectives() {
#ifdef MOESQ_HAVE_NCCL
  if (comm_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
#endif
}

void DeviceCollectives::allreduce_sum_u32(uint32_t* words, int64_t count, cudaStream_t stream) {
  MOESQ_CHECK(count >= 0, "DeviceCollectives::allreduce_sum_u32: count ", count, " < 0");
#ifdef MOESQ_HAVE_NCCL
  if (count == 0) return;
  const ncclResult_t r = ncclAllReduce(words, words, static_cast<size_t>(count), ncclUint32, ncclSum,
                                       static_cast<ncclComm_t>(comm_), stream);
  MOESQ_CHECK(r == ncclSuccess, "the NCCL exchange: ncclAllReduce of ", count, " words on rank ", rank_, " of ", size_,
              ": ", nccl_reason(r, static_cast<ncclComm_t>(comm_)));
#else
  (void)words, (void)stream;
  MOESQ_FAIL("the NCCL exchange: this moesq was built without NCCL");
#endif
}

}  // namespace moesq::dist
