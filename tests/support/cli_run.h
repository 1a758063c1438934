// Runs the built `moesq` binary (MOESQ_BINARY) from an end-to-end test: exit status, stdout, stderr.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace moesq::test {

struct CliRun {
  int rc = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `moesq ARGS` with MOESQ_QUIET=1; stdout/stderr go through files in `scratch_dir`.
inline CliRun run_moesq(const std::string& args, const std::string& scratch_dir) {
  const std::string out = scratch_dir + "/stdout.txt", err = scratch_dir + "/stderr.txt";
  const std::string cmd = "MOESQ_QUIET=1 '" + std::string(MOESQ_BINARY) + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out), slurp(err)};
}

}  // namespace moesq::test
