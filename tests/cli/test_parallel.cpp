// `mpirun -np N moesq compress … --device cpu` (docs/PARALLEL.md): the output of N ranks is
// byte-identical to one process (every file; report.json without its wall-clock fields), ranks
// whose experts get no calibration tokens do not hang the others, and an error on one rank ends all
// ranks with its message. Skips only when mpirun is not on PATH.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "dist/partition.h"
#include "support/mpi_run.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

constexpr int kHangLimitSeconds = 300;  // a hung rank fails the test instead of stalling CI

struct CmdRun {
  int code = -1;
  std::string out, err;
};

class CliParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!moesq::test::have_mpirun()) GTEST_SKIP() << "mpirun not on PATH (Debian: apt install openmpi-bin)";
  }
  // `moesq compress` of the tiny fixture with `args`, under mpirun with `ranks` (0: the plain binary).
  CmdRun compress(int ranks, const fs::path& out, const std::string& args) {
    return moesq(ranks, std::string("compress ") + MOESQ_DEFAULT_MODEL + " --device cpu --out " + out.string() + " " +
                            args);
  }
  // `moesq ARGS` under mpirun with `ranks` (0: the plain binary).
  CmdRun moesq(int ranks, const std::string& args) {
    const std::string o = tmp_.file("stdout"), e = tmp_.file("stderr");
    const std::string cmd = "MOESQ_QUIET=1 timeout " + std::to_string(kHangLimitSeconds) + " env " +
                            (ranks > 0 ? moesq::test::mpirun(ranks) : std::string()) + MOESQ_BINARY + " " + args +
                            " >" + o + " 2>" + e;
    const int st = std::system(cmd.c_str());
    CmdRun r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    std::ifstream fo(o), fe(e);
    r.out.assign(std::istreambuf_iterator<char>(fo), {});
    r.err.assign(std::istreambuf_iterator<char>(fe), {});
    return r;
  }
  void expect_ranks_match_one_process(int ranks, const std::string& args) {
    const fs::path one = tmp_.path / "one", many = tmp_.path / "many";
    const CmdRun a = compress(0, one, args);
    ASSERT_EQ(a.code, 0) << a.err;
    const CmdRun b = compress(ranks, many, args + " --json");
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(nlohmann::json::parse(b.out)["ranks"], ranks) << "the run did not use " << ranks << " MPI ranks";
    const auto da = moesq::test::dir_digest(one), db = moesq::test::dir_digest(many);
    EXPECT_GE(da.size(), 4u) << "config.json, model.safetensors, report.json, loss_per_layer.csv at least";
    EXPECT_EQ(da, db) << ranks << " ranks vs one process, args: " << args;
    EXPECT_FALSE(fs::exists(many.string() + ".work")) << "the work dir is removed once OUT is written";
  }
  moesq::test::TempDir tmp_{"moesq_parallel"};
};

TEST_F(CliParallel, TwoRanksSgptqByteIdenticalToOneProcess) {
  expect_ranks_match_one_process(2, "--method sgptq --calib-samples 8 --seq-len 64");
}

TEST_F(CliParallel, TwoRanksMoesqByteIdenticalToOneProcess) {
  expect_ranks_match_one_process(2, "--method moesq --epochs 1 --calib-samples 8 --seq-len 32");
}

// 2 calibration tokens × top-4 reach at most 8 of the 32 experts per layer: with 4 ranks (8 experts
// each, e mod 4), some rank gets no token in some layer. It must still take part in every exchange.
TEST_F(CliParallel, RanksWhoseExpertsGetNoTokensDoNotHang) {
  constexpr int kRanks = 4;
  const std::string args = "--method sgptq --calib-samples 1 --seq-len 2";
  expect_ranks_match_one_process(kRanks, args);
  std::ifstream rf(tmp_.path / "one" / "report.json");
  const nlohmann::json rep = nlohmann::json::parse(rf);
  int idle = 0;  // (layer, rank) pairs whose experts got no token
  for (const auto& layer : rep["layers"]) {
    std::vector<int64_t> tokens(kRanks, 0);
    for (const auto& e : layer["experts"])
      tokens[static_cast<size_t>(moesq::dist::expert_owner(e["expert"].get<int64_t>(), kRanks))] +=
          e["tokens"].get<int64_t>();
    for (int64_t t : tokens) idle += t == 0;
  }
  EXPECT_GT(idle, 0) << "the fixture routed a token to every rank in every layer: this test no longer covers "
                        "a rank without tokens (choose a smaller calibration)";
}

TEST_F(CliParallel, ErrorOnOneRankEndsEveryRankWithItsMessage) {
  // Only rank 0 creates the work dir: make that fail while rank 1 waits for it.
  const fs::path out = tmp_.path / "out";
  tmp_.write("out.work", "a file where the work directory should go");
  const CmdRun r = compress(2, out, "--method sgptq --calib-samples 4 --seq-len 32");
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.code, 124) << "timed out: rank 1 hung after rank 0 failed\n" << r.err;
  EXPECT_NE(r.err.find("moesq: error (rank 0 of 2): cannot create the work directory " + out.string() + ".work"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out)) << "nothing written";
}

// `mpirun -np 2 moesq eval … --device cuda` is the expert-parallel GPU engine (cli/expert_parallel.h):
// on a machine without a GPU (or a build without CUDA) every rank ends with the reason, none hangs.
// (Its results on a GPU: tests/gpu/test_engine_expert_parallel.cu and the device script's `ep` step.)
TEST_F(CliParallel, ExpertParallelEvalWithoutAGpuEndsEveryRankWithTheReason) {
  tmp_.write("text.txt", "The quick brown fox jumps over the lazy dog. It was the best of times.\n");
  const CmdRun r = moesq(2, std::string("eval ") + MOESQ_DEFAULT_MODEL + " --data " + tmp_.file("text.txt") +
                                " --seq-len 16 --device cuda");
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.code, 124) << "timed out: a rank hung\n" << r.err;
  const bool named = r.err.find("CUDA") != std::string::npos || r.err.find("cuda") != std::string::npos;
  EXPECT_TRUE(named) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}

TEST_F(CliParallel, ExpertExchangeNcclWithoutAGpuEndsEveryRankWithTheReason) {
  tmp_.write("text.txt", "The quick brown fox jumps over the lazy dog. It was the best of times.\n");
  const CmdRun r = moesq(2, std::string("eval ") + MOESQ_DEFAULT_MODEL + " --data " + tmp_.file("text.txt") +
                                " --seq-len 16 --device cuda --expert-exchange nccl");
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.code, 124) << "timed out: a rank hung\n" << r.err;
  const bool named = r.err.find("CUDA") != std::string::npos || r.err.find("GPU") != std::string::npos ||
                     r.err.find("NCCL") != std::string::npos;
  EXPECT_TRUE(named) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}

TEST_F(CliParallel, AnUnknownExpertExchangeIsRefusedByName) {
  const CmdRun r = moesq(0, std::string("bench e2e --synthetic qwen3-30b-a3b --expert-exchange rdma"));
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--expert-exchange"), std::string::npos) << r.err;
}

}  // namespace
