// The local communicator, launcher detection and the abort-on-error wrapper; the MPI communicator is
// in communicator_mpi.cpp.
#include "dist/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace moesq::dist {

std::unique_ptr<Communicator> mpi_communicator(const CommOptions& opt);  // communicator_mpi.cpp
bool built_with_mpi();                                                  // communicator_mpi.cpp

namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::vector<std::string> allgather(const std::string& mine) override { return {mine}; }
  void broadcast(std::string&, int root) override {
    MOESQ_CHECK(root == 0, "broadcast: root rank ", root, " outside [0, 1)");
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override {
    std::fflush(stderr);
    std::_Exit(code);
  }
};

// The number of ranks the launcher announced, 0 when it does not say.
long launcher_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* v = std::getenv(var)) return std::strtol(v, nullptr, 10);
  return 0;
}

}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
}

std::unique_ptr<Communicator> local_communicator() { return std::make_unique<LocalCommunicator>(); }

std::unique_ptr<Communicator> communicator_from_environment(const CommOptions& opt) {
  if (!launched_by_mpi()) return local_communicator();
  if (!built_with_mpi()) {
    MOESQ_CHECK(launcher_size() <= 1, "started by an MPI launcher with ", launcher_size(),
                " ranks, but this moesq was built without MPI (install libopenmpi-dev, re-run cmake; "
                "scripts/install-deps.sh)");
    return local_communicator();
  }
  return mpi_communicator(opt);
}

void allreduce_sum_u32(Communicator& comm, uint32_t* words, int64_t count) {
  MOESQ_CHECK(count >= 0, "allreduce_sum_u32: count ", count);
  if (comm.size() == 1) return;
  const size_t bytes = static_cast<size_t>(count) * sizeof(uint32_t);
  const std::vector<std::string> all = comm.allgather(std::string(reinterpret_cast<const char*>(words), bytes));
  for (size_t r = 0; r < all.size(); ++r)
    MOESQ_CHECK(all[r].size() == bytes, "allreduce_sum_u32: rank ", r, " passed ", all[r].size() / 4, " words, rank ",
                comm.rank(), " ", count);
  for (int64_t i = 0; i < count; ++i) {
    uint32_t sum = 0;
    for (const std::string& part : all) {
      uint32_t v;
      std::memcpy(&v, part.data() + 4 * i, 4);
      sum += v;
    }
    words[i] = sum;
  }
}

void run_or_abort_all(Communicator& comm, const std::function<void()>& fn) {
  if (comm.size() == 1) return fn();
  int code = 0;
  std::string what;
  try {
    fn();
    return;
  } catch (const Error& e) {
    code = 1;
    what = std::string("error (rank ") + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
           "): " + e.what();
  } catch (const std::exception& e) {
    code = 2;
    what = std::string("internal error (rank ") + std::to_string(comm.rank()) + " of " +
           std::to_string(comm.size()) + "): " + e.what();
  }
  std::fprintf(stderr, "moesq: %s\n", what.c_str());
  std::fflush(stderr);
  comm.abort(code);
}

}  // namespace moesq::dist
