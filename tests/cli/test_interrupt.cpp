// Ctrl-C in the middle of `moesq compress`: the run exits 130, removes its own temporaries, keeps
// OUT.work with the committed layers and says that --resume continues there; the --resume run then
// finishes from the layers committed. (The handler itself, its temporaries and SIGTERM:
// tests/core/test_interrupt.cpp.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;

TEST(CliInterrupt, CompressKeepsItsWorkDirSaysResumeAndResumeFinishes) {
  moesq::test::TempDir dir("moesq_cli_interrupt");
  const std::string out = dir.file("out"), err = dir.file("stderr.txt");
  // Long enough per layer (≈ 1 s on the 2-core machine) to be interrupted after layer 0's commit.
  const std::string args = std::string("compress ") + MOESQ_DEFAULT_MODEL + " --out " + out +
                           " --method moesq --epochs 2 --calib-samples 8 --seq-len 128";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("MOESQ_QUIET", "1", 1);
    if (!std::freopen(err.c_str(), "w", stderr) || !std::freopen("/dev/null", "w", stdout)) ::_exit(90);
    const std::string cmd = std::string("exec '") + MOESQ_BINARY + "' " + args;
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(91);
  }
  const fs::path first = fs::path(out + ".work") / "layer_0000.rec";
  bool seen = false;
  for (int i = 0; i < 1200 && !seen; ++i) {  // ≤ 120 s
    seen = fs::exists(first);
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGINT);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(seen) << "layer 0 was never committed";
  const std::string e = moesq::test::slurp(err);
  ASSERT_TRUE(WIFEXITED(st)) << "killed by the signal instead of handling it: " << e;
  if (WEXITSTATUS(st) == 0) GTEST_SKIP() << "the run finished before the interrupt arrived";
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGINT) << e;
  EXPECT_NE(e.find("moesq: interrupted by SIGINT"), std::string::npos) << e;
  EXPECT_NE(e.find("moesq: compress: kept " + out + ".work ("), std::string::npos) << e;
  EXPECT_NE(e.find("run the same command with --resume to continue there"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::exists(first));
  for (const std::string& n : moesq::test::entries_with_prefix(dir.path, "out"))
    EXPECT_TRUE(n == "out.work") << n << " left behind by the interrupted run";

  const moesq::test::CliRun r = moesq::test::run_moesq(args + " --resume --json", dir.path.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_GE(nlohmann::json::parse(r.out)["resumed_layers"].get<int64_t>(), 1);
  EXPECT_TRUE(fs::exists(fs::path(out) / "report.json"));
  EXPECT_FALSE(fs::exists(out + ".work")) << "the work directory outlived the finished run";
}

}  // namespace
