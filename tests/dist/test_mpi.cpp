// The MPI communicator on real processes: each test, run plainly, launches this very binary under
// `mpirun -np 3` restricted to itself; under mpirun (launched_by_mpi) the same test body is the
// rank's side. Skips only when mpirun is not on PATH.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "support/mpi_run.h"

namespace moesq::dist {
namespace {

constexpr int kRanks = 3;
constexpr int kHangLimitSeconds = 120;  // a hung collective is a failure, not a stuck CI job

struct Launch {
  int code = -1;
  std::string output;
};

// Runs the current test in kRanks processes; returns mpirun's exit status and merged output.
Launch launch_self() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string(info->test_suite_name()) + "." + info->name();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string log = (std::filesystem::temp_directory_path() / ("moesq_mpi_" + std::to_string(::getpid()))).string();
  const std::string cmd = "timeout " + std::to_string(kHangLimitSeconds) + " env " + moesq::test::mpirun(kRanks) + self +
                          " --gtest_filter=" + filter + " >" + log + " 2>&1";
  const int st = std::system(cmd.c_str());
  Launch r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(log);
  r.output.assign(std::istreambuf_iterator<char>(f), {});
  std::filesystem::remove(log);
  return r;
}

// Rank r's bytes: a length that needs several rounds of 1000 bytes, an EMPTY one (a rank with
// nothing to contribute, like a rank whose experts got no tokens), and one byte.
std::string bytes_of(int r) {
  const size_t n = r == 0 ? 2500 : r == 1 ? 0 : 1;
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + static_cast<size_t>(r) * 7 + 1) & 0xff);
  return s;
}

TEST(MpiCommunicator, AllgatherInRoundsAndBroadcastAcrossRanks) {
  if (!launched_by_mpi()) {
    if (!moesq::test::have_mpirun()) GTEST_SKIP() << "mpirun not on PATH (Debian: apt install openmpi-bin)";
    const Launch r = launch_self();
    ASSERT_EQ(r.code, 0) << r.output;
    return;
  }
  CommOptions opt;
  opt.max_message_bytes = 1000;
  const auto comm = communicator_from_environment(opt);
  ASSERT_STREQ(comm->backend(), "mpi") << "this test needs a build with MPI";
  ASSERT_EQ(comm->size(), kRanks);
  // One host: the host-local ranks are the world ranks (MPI_COMM_TYPE_SHARED keeps the world order).
  EXPECT_EQ(comm->local_size(), kRanks);
  EXPECT_EQ(comm->local_rank(), comm->rank());
  const std::vector<std::string> all = comm->allgather(bytes_of(comm->rank()));
  ASSERT_EQ(all.size(), static_cast<size_t>(kRanks));
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(all[static_cast<size_t>(r)], bytes_of(r)) << "rank " << r << "'s bytes";
  std::string b = comm->rank() == 2 ? std::string(3001, 'q') + "end" : "stale";
  comm->broadcast(b, 2);
  EXPECT_EQ(b, std::string(3001, 'q') + "end");
  comm->barrier();
}

// The expert-parallel exchange's sum: each rank owns every third word (the others zero), and every rank
// gets the owners' bits, the all-ones and −0 (0x8000'0000) patterns included; a wrap is an integer sum.
TEST(MpiCommunicator, AllreduceSumU32DeliversEachOwnersBits) {
  if (!launched_by_mpi()) {
    if (!moesq::test::have_mpirun()) GTEST_SKIP() << "mpirun not on PATH (Debian: apt install openmpi-bin)";
    const Launch r = launch_self();
    ASSERT_EQ(r.code, 0) << r.output;
    return;
  }
  const auto comm = communicator_from_environment();
  ASSERT_EQ(comm->size(), kRanks);
  const int64_t n = 301;
  auto word = [](int64_t i) { return i == 0 ? 0xffffffffu : i == 1 ? 0x80000000u : static_cast<uint32_t>(i * 2654435761u); };
  std::vector<uint32_t> w(n);
  for (int64_t i = 0; i < n; ++i) w[i] = i % kRanks == comm->rank() ? word(i) : 0u;
  allreduce_sum_u32(*comm, w.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[i], word(i)) << "word " << i;
  std::vector<uint32_t> wrap = {0x80000000u};
  allreduce_sum_u32(*comm, wrap.data(), 1);
  EXPECT_EQ(wrap[0], 0x80000000u * kRanks);
}

TEST(MpiCommunicator, ErrorOnOneRankAbortsEveryRank) {
  if (!launched_by_mpi()) {
    if (!moesq::test::have_mpirun()) GTEST_SKIP() << "mpirun not on PATH (Debian: apt install openmpi-bin)";
    const Launch r = launch_self();
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.code, 124) << "timed out: the ranks waiting in the barrier hung\n" << r.output;
    EXPECT_NE(r.output.find("moesq: error (rank 1 of 3): injected failure on rank 1"), std::string::npos) << r.output;
    return;
  }
  const auto comm = communicator_from_environment();
  run_or_abort_all(*comm, [&] {
    MOESQ_CHECK(comm->rank() != 1, "injected failure on rank 1");
    comm->barrier();  // ranks 0 and 2 wait here for rank 1, which never comes
  });
  ADD_FAILURE() << "rank " << comm->rank() << " passed the barrier";
}

}  // namespace
}  // namespace moesq::dist
