// SIGINT / SIGTERM cleanup (core/interrupt.h) in a forked child that installs the handlers, as the CLI
// does: registered temporaries — an AtomicDir's `.tmp.<pid>` with files in it, a plain file — are removed,
// a dismissed registration is not, the notes are printed after the removals, and the exit status is
// 128 + signal. Also the registry alone (run_interrupt_cleanup) in this process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/atomic_file.h"
#include "core/interrupt.h"
#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;

struct ChildResult {
  int exit_code = -1;  // -1: not a normal exit
  std::string err;
};

// Runs `body` in a child whose stderr goes to DIR/stderr.txt, then raises `signo` in it.
ChildResult interrupt_child(const moesq::test::TempDir& dir, int signo, const std::function<void()>& body) {
  const std::string err = dir.file("stderr.txt");
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE* f = std::freopen(err.c_str(), "w", stderr);
    if (!f) ::_exit(90);
    moesq::install_interrupt_cleanup();
    try {
      body();
    } catch (...) {
      ::_exit(91);
    }
    ::raise(signo);
    for (int i = 0; i < 500; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::_exit(92);  // the watcher never exited
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ChildResult r;
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = moesq::test::slurp(err);
  return r;
}

TEST(CoreInterrupt, SigintRemovesTheRegisteredTemporariesAndPrintsTheNotes) {
  moesq::test::TempDir dir("moesq_interrupt");
  const std::string out = dir.file("out"), kept = dir.file("kept.txt"), loose = dir.file("loose.tmp");
  const ChildResult r = interrupt_child(dir, SIGINT, [&] {
    static moesq::AtomicDir atomic(out, "--out");  // static: alive when the signal comes
    std::ofstream(fs::path(atomic.path()) / "model.safetensors") << std::string(4096, 'x');
    std::ofstream(loose) << "partial";
    static moesq::OnInterrupt loose_rule = moesq::OnInterrupt::remove(loose);
    std::ofstream(kept) << "committed";
    moesq::OnInterrupt dismissed = moesq::OnInterrupt::remove(kept);
    dismissed.dismiss();
    static moesq::OnInterrupt note = moesq::OnInterrupt::say([] { return std::string("OUT.work is kept"); });
  });
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_EQ(moesq::test::entries_with_prefix(dir.path, "out"), std::vector<std::string>{})
      << "the AtomicDir temporary (out.tmp.<pid>) is left";
  EXPECT_FALSE(fs::exists(loose));
  EXPECT_TRUE(fs::exists(kept)) << "a dismissed registration was removed";
  EXPECT_NE(r.err.find("moesq: interrupted by SIGINT: removed the temporaries " + out + ".tmp."), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(loose), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\nmoesq: OUT.work is kept\n"), std::string::npos) << r.err;
}

TEST(CoreInterrupt, SigtermExitsWith143AndACommittedDirStays) {
  moesq::test::TempDir dir("moesq_interrupt");
  const std::string out = dir.file("out");
  const ChildResult r = interrupt_child(dir, SIGTERM, [&] {
    moesq::AtomicDir atomic(out, "--out");
    std::ofstream(fs::path(atomic.path()) / "report.json") << "{}";
    atomic.commit();
    moesq::write_file_atomic(dir.file("side.json"), "{}");
  });
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(fs::exists(fs::path(out) / "report.json")) << "a committed output was removed";
  EXPECT_TRUE(fs::exists(dir.file("side.json")));
  EXPECT_NE(r.err.find("moesq: interrupted by SIGTERM: no temporaries to remove"), std::string::npos) << r.err;
}

// Without install_interrupt_cleanup nothing watches; the registry itself still works.
TEST(CoreInterrupt, RegistryRemovesOnlyWhatIsRegistered) {
  moesq::test::TempDir dir("moesq_interrupt");
  const std::string a = dir.file("a"), b = dir.file("b");
  std::ofstream(a) << "a";
  std::ofstream(b) << "b";
  {
    moesq::OnInterrupt ra = moesq::OnInterrupt::remove(a);
    moesq::OnInterrupt rb = moesq::OnInterrupt::remove(b);
    rb = moesq::OnInterrupt();  // move-assigned away: b no longer registered
    const std::string text = moesq::run_interrupt_cleanup(SIGINT);
    EXPECT_FALSE(fs::exists(a));
    EXPECT_TRUE(fs::exists(b));
    EXPECT_NE(text.find("removed the temporaries " + a), std::string::npos) << text;
  }
  std::ofstream(a) << "a";
  EXPECT_EQ(moesq::run_interrupt_cleanup(SIGINT).find(a), std::string::npos) << "a registration outlived its scope";
  EXPECT_TRUE(fs::exists(a));
}

}  // namespace
