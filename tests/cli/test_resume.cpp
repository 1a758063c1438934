// Crash-safe resume (docs/PARALLEL.md): `moesq compress` is killed with SIGKILL at random points —
// during a layer, during the final write, twice in a row, under mpirun with 2 ranks — and the same
// command with --resume must produce output byte-identical to an uninterrupted run (every file;
// report.json without its wall-clock fields), leaving no work dir or temporaries behind.
// A kill takes the whole session of the run (mpirun and its ranks), as a machine crash would.
// The random delays come from MOESQ_TEST_SEED when set (the seed is printed on failure).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/mpi_run.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kRunLimitSeconds = 300;  // one run longer than this is a hang

// Kills every process of session `sid` (the run's shell, mpirun, its ranks).
void kill_session(pid_t sid) {
  for (int pass = 0; pass < 5; ++pass) {
    int found = 0;
    for (const auto& d : fs::directory_iterator("/proc")) {
      const std::string name = d.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream f(d.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(f)), {});
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(stat.substr(close + 1));
      std::string state;
      long ppid = 0, pgrp = 0, session = 0;
      rest >> state >> ppid >> pgrp >> session;
      if (session == sid && state != "Z") {
        ::kill(static_cast<pid_t>(std::stol(name)), SIGKILL);
        ++found;
      }
    }
    if (!found) return;
    ::usleep(20000);
  }
}

struct Outcome {
  bool killed = false;  // false: the run ended before the kill time came
  int code = -1;        // exit status when not killed
  std::string err;      // its stderr (progress lines)
  double seconds = 0;   // wall time of the run
  // (seconds since the start, stderr bytes read then): when each progress line arrived
  std::vector<std::pair<double, std::string>> arrivals;
  // Seconds from the first arrival of `text` to the end of the run; -1 when it never appeared.
  double seconds_after(const std::string& text) const {
    std::string seen;
    for (const auto& [t, chunk] : arrivals) {
      seen += chunk;
      if (seen.find(text) != std::string::npos) return seconds - t;
    }
    return -1;
  }
};

// Runs `cmd` in a new session with progress on stderr; once a stderr line contains `trigger`, waits
// `delay_s` more and kills the session. An empty trigger never kills.
Outcome run_and_kill(const std::string& cmd, const std::string& trigger, double delay_s) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    ::unsetenv("MOESQ_QUIET");
    ::execl("/bin/sh", "sh", "-c", (cmd + " >/dev/null").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  Outcome o;
  const auto start = Clock::now();
  Clock::time_point kill_at = Clock::time_point::max();
  std::string line;
  bool eof = false;
  while (!eof) {
    const auto now = Clock::now();
    if (now >= kill_at || now - start > std::chrono::duration<double>(kRunLimitSeconds)) {
      kill_session(pid);
      o.killed = now >= kill_at;
      if (!o.killed) o.err += "\n[test] killed after " + std::to_string(kRunLimitSeconds) + " s: hung\n";
      break;
    }
    const auto wait = kill_at == Clock::time_point::max()
                          ? 1000
                          : std::max<long>(1, std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - now).count());
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long>(wait, 1000))) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) {
      eof = true;
      break;
    }
    o.err.append(buf, static_cast<size_t>(n));
    o.arrivals.emplace_back(std::chrono::duration<double>(Clock::now() - start).count(),
                            std::string(buf, static_cast<size_t>(n)));
    line.append(buf, static_cast<size_t>(n));
    if (kill_at == Clock::time_point::max() && !trigger.empty() && line.find(trigger) != std::string::npos)
      kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay_s));
    if (line.size() > 8192) line.erase(0, line.size() - 4096);
  }
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!o.killed) o.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

class CliResume : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* s = std::getenv("MOESQ_TEST_SEED");
    seed_ = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    rng_.seed(seed_);
  }
  // The compress command line for `out`; ranks > 0: under mpirun.
  std::string command(const fs::path& out, int ranks, bool resume) const {
    return "timeout " + std::to_string(int(kRunLimitSeconds)) + " env " +
           (ranks > 0 ? moesq::test::mpirun(ranks) : std::string()) + MOESQ_BINARY + " compress " + MOESQ_DEFAULT_MODEL +
           " --device cpu --out " + out.string() + " " + args_ + (resume ? " --resume" : "");
  }
  double uniform(double hi) { return std::uniform_real_distribution<double>(0.0, hi)(rng_); }
  // The uninterrupted run everything is compared with.
  void reference() {
    const Outcome o = run_and_kill(command(tmp_.path / "reference", 0, false), "", 0);
    ASSERT_EQ(o.code, 0) << o.err;
    reference_run_ = o;
    ref_ = moesq::test::dir_digest(tmp_.path / "reference");
  }
  // Kills a run of `out` (fresh or resumed) once `trigger` shows up plus a random delay below
  // `max_delay_s`, and below 60 % of what the uninterrupted run took after `trigger` (machines differ
  // by an order of magnitude in speed: a fixed delay outlasts the run on a fast one).
  void kill_once(const fs::path& out, int ranks, bool resume, const std::string& trigger, double max_delay_s) {
    const double left = reference_run_.seconds_after(trigger);
    const double delay = uniform(left > 0 ? std::min(max_delay_s, 0.6 * left) : max_delay_s);
    const Outcome o = run_and_kill(command(out, ranks, resume), trigger, delay);
    EXPECT_TRUE(o.killed) << "the run ended before the kill (" << trigger << " + " << delay << " s): " << o.err;
  }
  // Resumes `out` to the end; checks the output and returns how many layers were resumed.
  int64_t resume_and_compare(const fs::path& out, int ranks) {
    const Outcome o = run_and_kill(command(out, ranks, true), "", 0);
    EXPECT_EQ(o.code, 0) << o.err;
    EXPECT_EQ(moesq::test::dir_digest(out), ref_) << "resumed output differs from the uninterrupted run";
    EXPECT_FALSE(fs::exists(out.string() + ".work")) << "work dir left behind";
    for (const auto& f : fs::directory_iterator(tmp_.path))
      EXPECT_EQ(f.path().filename().string().find(".tmp."), std::string::npos) << "temporary left behind: " << f.path();
    const size_t at = o.err.find("[resume] layers 1-");
    return at == std::string::npos ? 0 : std::stoll(o.err.substr(at + 18));
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string args_ = "--method sgptq --calib-samples 8 --seq-len 32";
  std::map<std::string, std::string> ref_;
  Outcome reference_run_;
  moesq::test::TempDir tmp_{"moesq_resume"};
};

TEST_F(CliResume, KilledAtRandomPointsResumesByteIdentical) {
  SCOPED_TRACE("MOESQ_TEST_SEED=" + std::to_string(seed_));
  reference();
  // 1. during layer 1 (or somewhat later): nothing or little committed.
  kill_once(tmp_.path / "t1", 0, false, "layer 1/4: attention", 1.5);
  resume_and_compare(tmp_.path / "t1", 0);
  // 2. during layer 3: layers 1-2 are committed.
  kill_once(tmp_.path / "t2", 0, false, "layer 3/4: attention", 0.3);
  EXPECT_GE(resume_and_compare(tmp_.path / "t2", 0), 2);
  // 3. during the final write: every layer is committed, OUT half-written in its temporary.
  kill_once(tmp_.path / "t3", 0, false, "[export] writing", 0.02);
  EXPECT_EQ(resume_and_compare(tmp_.path / "t3", 0), 4);
  // 4. killed twice: in layer 2, then the resumed run in layer 4.
  kill_once(tmp_.path / "t4", 0, false, "layer 2/4: attention", 0.5);
  // (layer 4 alone takes ~0.25 s on an idle core: the delay stays well inside it)
  kill_once(tmp_.path / "t4", 0, true, "layer 4/4: attention", 0.05);
  EXPECT_GE(resume_and_compare(tmp_.path / "t4", 0), 3);
}

TEST_F(CliResume, TwoRanksKilledResumeOnOneRankByteIdentical) {
  if (!moesq::test::have_mpirun()) GTEST_SKIP() << "mpirun not on PATH (Debian: apt install openmpi-bin)";
  SCOPED_TRACE("MOESQ_TEST_SEED=" + std::to_string(seed_));
  reference();
  // 5. 2 ranks killed during layer 2 (mpirun and both ranks), resumed by one process.
  kill_once(tmp_.path / "t5", 2, false, "layer 2/4: attention", 0.5);
  EXPECT_GE(resume_and_compare(tmp_.path / "t5", 0), 1);
}

TEST_F(CliResume, MoesqKilledDuringRefinementResumesByteIdentical) {
  SCOPED_TRACE("MOESQ_TEST_SEED=" + std::to_string(seed_));
  args_ = "--method moesq --epochs 1 --calib-samples 8 --seq-len 32";
  reference();
  // 6. during the refinement of layer 2's experts.
  kill_once(tmp_.path / "t6", 0, false, "layer 2/4: 8/32 experts", 1.0);
  EXPECT_GE(resume_and_compare(tmp_.path / "t6", 0), 1);
}

}  // namespace
