// Build identity recorded by every audit run and checked by the scorer: the source commit and the
// SHA-256 of the running binary.
#pragma once
#include <string>

namespace moesq::audit {

struct BuildIdentity {
  std::string git_commit;     // source commit (+ "-dirty" when the tree had local changes), or "unknown"
  std::string binary_sha256;  // SHA-256 of the running executable
};
// Cached per process (a long study must not see later commits).
BuildIdentity current_build_identity();

// HEAD of the git work tree at `source_dir` (+ "-dirty" with local changes to tracked files), or
// "unknown" when the directory is missing, git is not installed or the directory is not a work tree.
std::string source_commit(const std::string& source_dir);

}  // namespace moesq::audit
