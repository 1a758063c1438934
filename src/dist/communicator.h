// The processes of one run and the collectives the compress pipeline needs, on HOST bytes
// (docs/PARALLEL.md). Two implementations: the local one (one process: the plain binary) and MPI
// (one process per rank, started by mpirun / mpiexec / srun). Everything above this interface — the
// pipeline, the resume work dir — is written once for both.
// Decision: the collectives move opaque byte strings and return them INDEXED BY RANK, so the caller
// (compress/layer_record.h) decodes them in a fixed rank/expert order and the result never depends
// on which rank finished first. Device buffers (the GPU path: one process per GPU, NCCL) get a
// separate device-collectives object bootstrapped through broadcast() (the ncclUniqueId of rank 0);
// this interface stays the process/bootstrap layer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace moesq::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;            // in [0, size())
  virtual int size() const = 0;            // number of ranks, >= 1
  virtual const char* backend() const = 0;  // "local" | "mpi"
  // This rank among the ranks of its own host (MPI_COMM_TYPE_SHARED), in [0, local_size()): what picks
  // its GPU (gpu_for_local_rank). One process: 0 of 1.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  // Collective: every rank passes its bytes (any size, 0 included: a rank with nothing to say
  // still takes part) and every rank gets all of them, [size()] indexed by rank.
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;
  // Collective: `bytes` of rank `root` replace `bytes` on every other rank.
  virtual void broadcast(std::string& bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the run with exit status `code` (MPI_Abort); never returns.
  [[noreturn]] virtual void abort(int code) = 0;
};

struct CommOptions {
  // Largest message one MPI call carries; bigger collectives are split into rounds (MPI counts are
  // int: 2 GiB per call). Tests set it small to exercise the rounds.
  size_t max_message_bytes = size_t(1) << 30;
};

// True when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK set).
bool launched_by_mpi();

// The one-process communicator (rank 0 of 1).
std::unique_ptr<Communicator> local_communicator();

// MPI (MPI_Init_thread, FUNNELED: only the calling thread communicates) when launched_by_mpi(), else
// the local communicator: the plain binary never initializes MPI. Error when the launcher asks for
// more than one rank and this build has no MPI (N copies would each compress the whole model and
// race to write the same output).
std::unique_ptr<Communicator> communicator_from_environment(const CommOptions& opt = {});

// Collective: words[0, count) on every rank become their sum over the ranks as uint32 (wrapping), in
// rank order: an integer sum, exact, the same bits on every rank. What the expert-parallel engine's
// host-staged exchange calls (runtime::host_staged_exchange, docs/PARALLEL.md): each rank's routes are
// zero words on every other rank, so the sum delivers the owner's bits. Every rank passes the same
// count (Error otherwise, naming both).
void allreduce_sum_u32(Communicator& comm, uint32_t* words, int64_t count);

// Runs `fn`. With one rank exceptions propagate unchanged (the CLI prints them). With several, an
// exception on ANY rank prints "moesq: error (rank r of N): <what>" on stderr and aborts every rank
// (exit 1 for moesq::Error, 2 for anything else): no rank waits forever in a collective for a peer
// that failed.
void run_or_abort_all(Communicator& comm, const std::function<void()>& fn);

}  // namespace moesq::dist
