// Atomic outputs: nothing half-written on failure.
// A file is written to `<path>.tmp.<pid>` and renamed over `path`; an output directory is built as a
// sibling `<dir>.tmp.<pid>` and renamed into place by commit(). If commit() is never reached (an
// exception), the destructor removes the temporary, so a failed run leaves no partial output.
// A run killed outright (kill -9) cannot clean up: the next run writing the same output removes the
// `.tmp.<pid>` (and `.tmp.<pid>.<suffix>`) siblings whose pid is dead (and puts back a `.old.<pid>`
// its commit had moved aside).
// Write errors (EFBIG under `ulimit -f`, ENOSPC, EIO) are Errors naming the path and strerror; the
// CLI ignores SIGXFSZ so that an oversized write fails with EFBIG instead of killing the process.
// Every temporary is registered with core/interrupt.h while it exists: SIGINT / SIGTERM remove it.
#pragma once
#include <string>
#include <vector>

#include "core/interrupt.h"

namespace moesq {

// Writes `bytes` to `path` atomically. Throws Error naming `path` on failure.
void write_file_atomic(const std::string& path, const std::string& bytes);

class AtomicDir {
 public:
  // Checks that the parent of `final_dir` is writable (Error naming the flag `flag` otherwise)
  // and creates the temporary directory. An existing `final_dir` is replaced only on commit(), and
  // only if it is empty or holds `marker` (a file every output of this kind has, e.g. report.json):
  // a directory of anything else is never deleted. `inputs` (checkpoint dirs, data files) must not
  // be `final_dir` or lie inside it, since commit() would delete them.
  AtomicDir(const std::string& final_dir, const std::string& flag = "--out", const std::string& marker = "",
            const std::vector<std::string>& inputs = {});
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::string& path() const { return tmp_; }  // write files here
  void commit();                                      // rename into final_dir

 private:
  std::string final_, tmp_;
  bool committed_ = false;
  OnInterrupt interrupt_;  // removes tmp_ on SIGINT / SIGTERM until commit()
};

}  // namespace moesq
