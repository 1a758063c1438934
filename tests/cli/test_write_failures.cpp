// Write failures end to end (docs/RELIABILITY.md "write failures"): `moesq export` and
// `moesq compress` whose output filesystem is full (ENOSPC, on a small tmpfs mounted for the test) and
// an export killed with SIGKILL in the middle. Each must leave OUT exactly as it was (absent, or the
// earlier output) and no stale OUT.tmp.* of its own, and the next run must clean the orphan a killed
// run left. Ownership of an orphan: its name carries the pid of the run that made it
// (OUT.tmp.<pid>); it is removed only when kill(pid, 0) says that process no longer exists
// (core/atomic_file.h).
// The ENOSPC tests mount a tmpfs and so need root (CAP_SYS_ADMIN); elsewhere they are skipped with
// the reason.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/hash.h"
#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

using moesq::test::CliRun;
using moesq::test::entries_with_prefix;
using moesq::test::slurp;

// File name → SHA-256 of its bytes, for every file of `dir`: "as it was" means this map is unchanged.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::directory_iterator(dir)) m[e.path().filename().string()] = moesq::sha256_file(e.path().string());
  return m;
}

// A tmpfs of `bytes` mounted on `dir` for the lifetime of the object (root only).
struct SmallFs {
  fs::path dir;
  std::string why_not;  // non-empty: not mounted, and why
  SmallFs(const fs::path& d, size_t bytes) : dir(d) {
    fs::create_directories(dir);
    if (::geteuid() != 0) {
      why_not = "not root: cannot mount a small tmpfs to make ENOSPC";
      return;
    }
    const std::string opts = "size=" + std::to_string(bytes) + ",mode=0755";
    if (::mount("moesq_enospc", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0)
      why_not = std::string("mount -t tmpfs failed (") + std::strerror(errno) + "): cannot make ENOSPC here";
  }
  ~SmallFs() {
    if (why_not.empty()) ::umount2(dir.c_str(), MNT_DETACH);
  }
  bool mounted() const { return why_not.empty(); }
};

class WriteFailures : public ::testing::Test {
 protected:
  moesq::test::TempDir tmp_{"moesq_test_write_failures"};

  fs::path dir() const { return tmp_.path; }

  CliRun run(const std::string& args) { return moesq::test::run_cli(MOESQ_BINARY, args, dir()); }

  std::string compress_args(const fs::path& out) {
    const fs::path calib = dir() / "calib.txt";
    if (!fs::exists(calib)) {
      std::ofstream t(calib);
      for (int i = 0; i < 100; ++i) t << "def f" << i << "(x):\n    return x * " << i << "\n";
    }
    return "compress '" + std::string(MOESQ_DEFAULT_MODEL) + "' --method rtn-nvfp4 --out '" + out.string() +
           "' --calib '" + calib.string() + "' --calib-samples 4 --seq-len 64";
  }

  // A moesq checkpoint (rtn-nvfp4 of the embedded model, ~9 MB) to export from.
  fs::path compressed() {
    const fs::path c = dir() / "compressed";
    if (!fs::exists(c)) {
      const CliRun r = run(compress_args(c));
      EXPECT_EQ(r.rc, 0) << r.err;
    }
    return c;
  }
};

// The export (~9 MB) does not fit in a 1 MiB filesystem: exit 1 with an error naming the file and
// strerror(ENOSPC); the earlier output OUT (here one export.json, the marker) is untouched, and no
// OUT.tmp.* is left to fill the disk further.
TEST_F(WriteFailures, ExportOnAFullFilesystemFailsCleanly) {
  const fs::path src = compressed();
  SmallFs small(dir() / "small", size_t(1) << 20);
  if (!small.mounted()) GTEST_SKIP() << small.why_not;
  const fs::path out = small.dir / "out";
  fs::create_directories(out);
  std::ofstream(out / "export.json") << "{\"earlier\": true}\n";
  const auto before = snapshot(out);
  const auto free_before = fs::space(small.dir).available;

  const CliRun r = run("export '" + src.string() + "' --format compressed-tensors --out '" + out.string() + "'");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(out.string()), std::string::npos) << "error does not name the output: " << r.err;
  EXPECT_EQ(snapshot(out), before) << "the earlier OUT changed";
  EXPECT_EQ(entries_with_prefix(small.dir, "out."), std::vector<std::string>{}) << "stale temporaries left";
  EXPECT_EQ(fs::space(small.dir).available, free_before) << "bytes still allocated (an unlinked partial file?)";
}

// The same for compress: no OUT at all before, none after, nothing else on the filesystem.
TEST_F(WriteFailures, CompressOnAFullFilesystemFailsCleanly) {
  SmallFs small(dir() / "small", size_t(1) << 20);
  if (!small.mounted()) GTEST_SKIP() << small.why_not;
  const fs::path out = small.dir / "out";
  const CliRun r = run(compress_args(out));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(out.string()), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(small.dir)) << "left behind: " << ::testing::PrintToString(entries_with_prefix(small.dir, ""));
}

// The library call under the CLI: write_file_atomic on a full filesystem throws an Error naming the
// path and ENOSPC and removes its `.tmp.<pid>`; an AtomicDir never committed removes its directory.
TEST_F(WriteFailures, AtomicWritesOnAFullFilesystemLeaveNothing) {
  SmallFs small(dir() / "small", size_t(64) << 10);
  if (!small.mounted()) GTEST_SKIP() << small.why_not;
  const std::string path = (small.dir / "big.bin").string();
  try {
    moesq::write_file_atomic(path, std::string(size_t(1) << 20, 'x'));
    ADD_FAILURE() << "a 1 MiB write into 64 KiB succeeded";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOSPC)), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(small.dir));
  {
    moesq::AtomicDir d((small.dir / "outdir").string());
    EXPECT_THROW(moesq::write_file_atomic(d.path() + "/model.safetensors", std::string(size_t(1) << 20, 'y')),
                 moesq::Error);
  }  // no commit(): the destructor removes the temporary directory
  EXPECT_TRUE(fs::is_empty(small.dir));
}

// `kill -9` in the middle of `moesq export` (the moment its OUT.tmp.<pid> appears, seen through
// inotify): OUT — an earlier export — is byte for byte as it was, the killed run's OUT.tmp.<pid> is
// left (nothing can remove it), and the next export to OUT removes that orphan (its pid is dead) and
// commits.
TEST_F(WriteFailures, ExportKilledMidwayLeavesOutAsItWasAndTheNextRunCleansUp) {
  const fs::path src = compressed();
  const fs::path out = dir() / "out";
  const CliRun first = run("export '" + src.string() + "' --format compressed-tensors --out '" + out.string() + "'");
  ASSERT_EQ(first.rc, 0) << first.err;
  const auto before = snapshot(out);

  const int in = ::inotify_init1(IN_CLOEXEC);
  ASSERT_GE(in, 0) << std::strerror(errno);
  ASSERT_GE(::inotify_add_watch(in, dir().c_str(), IN_CREATE), 0) << std::strerror(errno);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setenv("MOESQ_QUIET", "1", 1);
    const std::string bin = MOESQ_BINARY, s = src.string(), o = out.string();
    ::execl(bin.c_str(), bin.c_str(), "export", s.c_str(), "--format", "moesq", "--out", o.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const std::string tmp_name = "out.tmp." + std::to_string(child);
  bool seen = false;
  alignas(struct inotify_event) char buf[4096];
  // Waits at most 120 s (an export that fails before making its temporary must not hang the test).
  for (int waited_ms = 0; !seen && waited_ms < 120000; waited_ms += 100) {
    struct pollfd pfd = {in, POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    const ssize_t n = ::read(in, buf, sizeof(buf));
    if (n <= 0) break;
    for (char* p = buf; p < buf + n;) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(p);
      if (ev->len && tmp_name == ev->name) seen = true;
      p += sizeof(struct inotify_event) + ev->len;
    }
  }
  ::kill(child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
  ::close(in);
  ASSERT_TRUE(seen);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "the export finished before the kill";

  EXPECT_EQ(snapshot(out), before) << "OUT changed under a killed export";
  EXPECT_TRUE(fs::exists(dir() / tmp_name)) << "expected the killed run's orphan";

  const CliRun next = run("export '" + src.string() + "' --format moesq --out '" + out.string() + "' --json");
  ASSERT_EQ(next.rc, 0) << next.err;
  EXPECT_FALSE(fs::exists(dir() / tmp_name)) << "the orphan of the dead run was not removed";
  EXPECT_EQ(entries_with_prefix(dir(), "out."), std::vector<std::string>{});
  EXPECT_NE(slurp(out / "export.json").find("\"moesq\""), std::string::npos) << slurp(out / "export.json");
  EXPECT_NE(snapshot(out), before);
}

// compress --export-format writes a moesq checkpoint to a temporary sibling (OUT.tmp.<pid>.moesq), then
// exports it into OUT: on a full filesystem neither OUT nor that sibling is left, and the error names OUT.
TEST_F(WriteFailures, CompressWithExportFormatOnAFullFilesystemFailsCleanly) {
  SmallFs small(dir() / "small", size_t(1) << 20);
  if (!small.mounted()) GTEST_SKIP() << small.why_not;
  const fs::path out = small.dir / "out";
  const CliRun r = run(compress_args(out) + " --export-format compressed-tensors");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(out.string()), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(small.dir)) << "left behind: " << ::testing::PrintToString(entries_with_prefix(small.dir, ""));
}

// What a kill -9 of `compress --export-format` leaves (its moesq intermediate OUT.tmp.<pid>.moesq, the
// pid dead; made here by hand from a child that has exited, so the test needs no race with the kill):
// the next compress into OUT removes it and commits.
TEST_F(WriteFailures, OrphanedExportIntermediateOfAKilledCompressIsCleanedByTheNextRun) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int st = 0;
  ::waitpid(child, &st, 0);  // its pid is dead from here on
  const fs::path out = dir() / "out";
  const fs::path orphan = dir() / ("out.tmp." + std::to_string(child) + ".moesq");
  fs::create_directories(orphan);
  std::ofstream(orphan / "model.safetensors") << std::string(4096, 'x');
  const CliRun r = run(compress_args(out) + " --export-format compressed-tensors --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(fs::exists(orphan)) << "the killed run's intermediate was not removed";
  EXPECT_EQ(entries_with_prefix(dir(), "out."), std::vector<std::string>{});
  EXPECT_TRUE(fs::exists(out / "config.json"));
}

}  // namespace
