// Build identity of the running binary (build_identity.h). Non-obvious: the source directory is the one
// CMake configured (MOESQ_SOURCE_DIR, a compile definition of moesq_audit), never guessed from another
// path; without git, or outside a work tree, the commit is "unknown" rather than an error.
#include "audit/build_identity.h"

#include <cctype>
#include <cstdio>
#include <filesystem>

#include "core/hash.h"

namespace moesq::audit {

namespace {

std::string run_cmd(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

bool is_commit_hash(const std::string& s) {
  if (s.size() < 40) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

std::string source_commit(const std::string& source_dir) {
  std::error_code ec;
  if (source_dir.empty() || !std::filesystem::is_directory(source_dir, ec)) return "unknown";
  const std::string git = "git -C '" + source_dir + "' ";
  std::string commit = run_cmd(git + "rev-parse --verify -q HEAD 2>/dev/null");
  if (!is_commit_hash(commit)) return "unknown";  // no git, not a work tree, or an unexpected answer
  if (!run_cmd(git + "status --porcelain --untracked-files=no 2>/dev/null").empty()) commit += "-dirty";
  return commit;
}

BuildIdentity current_build_identity() {
  // Computed once per process: the source tree may move (other commits) while a long study runs.
  static const BuildIdentity cached = [] {
    BuildIdentity id;
    id.git_commit = source_commit(MOESQ_SOURCE_DIR);
    id.binary_sha256 = sha256_file("/proc/self/exe");
    return id;
  }();
  return cached;
}

}  // namespace moesq::audit
