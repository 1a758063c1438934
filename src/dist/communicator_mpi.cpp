// The MPI communicator (built when CMake finds MPI: MOESQ_HAVE_MPI). MPI errors return codes
// (MPI_ERRORS_RETURN) that become moesq::Error naming the call and the rank, so the CLI's
// run_or_abort_all prints them and aborts the job instead of MPI printing its own and hanging.
// Without MPI this file only says so (communicator_from_environment then refuses multi-rank runs).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

#if MOESQ_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#endif

namespace moesq::dist {

#if MOESQ_HAVE_MPI

bool built_with_mpi() { return true; }

namespace {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const CommOptions& opt) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MOESQ_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
                  "MPI_Init_thread failed (is this process started by mpirun / srun?)");
      owns_mpi_ = true;
    }
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    // The ranks that share this host (and its GPUs), ordered by world rank.
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type");
    check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank (host)");
    check(MPI_Comm_size(node, &local_size_), "MPI_Comm_size (host)");
    MPI_Comm_free(&node);
    // One round's counts and displacements are int: every rank's slice together stays below INT_MAX.
    chunk_ = std::max<size_t>(1, std::min<size_t>(opt.max_message_bytes, static_cast<size_t>(INT_MAX) / size_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  std::vector<std::string> allgather(const std::string& mine) override {
    const uint64_t n = mine.size();
    std::vector<uint64_t> sizes(static_cast<size_t>(size_));
    check(MPI_Allgather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), "MPI_Allgather");
    std::vector<std::string> all(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) all[static_cast<size_t>(r)].resize(sizes[static_cast<size_t>(r)]);
    const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
    // Round k moves bytes [k·chunk, (k+1)·chunk) of every rank's string (fewer, or none, for short ones).
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    std::vector<char> recv;
    for (uint64_t off = 0; off < largest; off += chunk_) {
      int total = 0;
      for (int r = 0; r < size_; ++r) {
        const uint64_t s = sizes[static_cast<size_t>(r)];
        counts[static_cast<size_t>(r)] = s > off ? static_cast<int>(std::min<uint64_t>(s - off, chunk_)) : 0;
        displs[static_cast<size_t>(r)] = total;
        total += counts[static_cast<size_t>(r)];
      }
      recv.resize(static_cast<size_t>(total));
      const int mine_count = counts[static_cast<size_t>(rank_)];
      check(MPI_Allgatherv(mine_count ? mine.data() + off : nullptr, mine_count, MPI_BYTE, recv.data(), counts.data(),
                           displs.data(), MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgatherv");
      for (int r = 0; r < size_; ++r)
        if (counts[static_cast<size_t>(r)] > 0)
          std::memcpy(all[static_cast<size_t>(r)].data() + off, recv.data() + displs[static_cast<size_t>(r)],
                      static_cast<size_t>(counts[static_cast<size_t>(r)]));
    }
    return all;
  }

  void broadcast(std::string& bytes, int root) override {
    MOESQ_CHECK(root >= 0 && root < size_, "broadcast: root rank ", root, " outside [0, ", size_, ")");
    uint64_t n = bytes.size();
    check(MPI_Bcast(&n, 1, MPI_UINT64_T, root, MPI_COMM_WORLD), "MPI_Bcast");
    if (rank_ != root) bytes.resize(n);
    for (uint64_t off = 0; off < n; off += chunk_)
      check(MPI_Bcast(bytes.data() + off, static_cast<int>(std::min<uint64_t>(n - off, chunk_)), MPI_BYTE, root,
                      MPI_COMM_WORLD),
            "MPI_Bcast");
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  [[noreturn]] void abort(int code) override {
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; if it did, still never continue
  }

 private:
  void check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    MOESQ_FAIL(call, " failed on rank ", rank_, " of ", size_, ": ", std::string(msg, static_cast<size_t>(len)));
  }

  int rank_ = 0, size_ = 1;
  int local_rank_ = 0, local_size_ = 1;
  size_t chunk_ = 1;
  bool owns_mpi_ = false;
};

}  // namespace

std::unique_ptr<Communicator> mpi_communicator(const CommOptions& opt) { return std::make_unique<MpiCommunicator>(opt); }

#else  // !MOESQ_HAVE_MPI

bool built_with_mpi() { return false; }

std::unique_ptr<Communicator> mpi_communicator(const CommOptions&) {
  MOESQ_FAIL("this moesq was built without MPI (install libopenmpi-dev, re-run cmake)");
}

#endif

}  // namespace moesq::dist
