// Running the built `moesq` binary from an end-to-end test: its exit code, stdout and stderr, with
// MOESQ_QUIET=1 (no progress lines). `scratch` holds the captured streams. Also small file helpers
// the CLI tests share.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace moesq::test {

struct CliRun {
  int rc = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `binary args` through the shell (quote paths in `args` yourself).
inline CliRun run_cli(const std::string& binary, const std::string& args, const std::filesystem::path& scratch) {
  const std::filesystem::path out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  const std::string cmd = "MOESQ_QUIET=1 '" + binary + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int st = std::system(cmd.c_str());
  CliRun r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Names of the entries of `dir` that start with `prefix`.
inline std::vector<std::string> entries_with_prefix(const std::filesystem::path& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  return out;
}

#ifdef MOESQ_BINARY
// `moesq ARGS` (the built binary, MOESQ_BINARY); stdout/stderr go through files in `scratch_dir`.
inline CliRun run_moesq(const std::string& args, const std::string& scratch_dir) {
  return run_cli(MOESQ_BINARY, args, scratch_dir);
}
#endif

}  // namespace moesq::test
