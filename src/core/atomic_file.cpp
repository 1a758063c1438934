#include "core/atomic_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace fs = std::filesystem;

namespace moesq {

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MOESQ_CHECK(out, "cannot write ", path, " (cannot create ", tmp, ")");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      out.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      MOESQ_FAIL("short write to ", path, " (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    MOESQ_FAIL("cannot rename ", tmp, " to ", path, ": ", ec.message());
  }
}

AtomicDir::AtomicDir(const std::string& final_dir, const std::string& flag, const std::string& marker,
                     const std::vector<std::string>& inputs)
    : final_(final_dir) {
  MOESQ_CHECK(!final_dir.empty(), flag, ": empty output path");
  fs::path p = fs::absolute(fs::path(final_dir)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  final_ = p.string();
  const fs::path parent = p.parent_path();
  MOESQ_CHECK(!fs::exists(parent) || fs::is_directory(parent), flag, " ", final_dir, ": ", parent.string(),
              " exists but is not a directory");
  MOESQ_CHECK(fs::is_directory(parent), flag, " ", final_dir, ": parent directory ", parent.string(),
              " does not exist");
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::path q = fs::weakly_canonical(fs::absolute(in), ec).lexically_normal();
    const fs::path o = fs::weakly_canonical(p, ec).lexically_normal();
    const std::string qs = q.string(), os = o.string();
    MOESQ_CHECK(!(qs == os || (qs.size() > os.size() && qs.compare(0, os.size(), os) == 0 && qs[os.size()] == '/')),
                flag, " ", final_dir, " is or contains the input ", in,
                ": writing there would delete it; choose another output directory");
  }
  MOESQ_CHECK(::access(parent.c_str(), W_OK) == 0, flag, " ", final_dir, ": parent directory ",
              parent.string(), " is not writable");
  if (fs::exists(p)) {
    MOESQ_CHECK(fs::is_directory(p), flag, " ", final_dir, " exists and is not a directory");
    MOESQ_CHECK(::access(p.c_str(), W_OK) == 0, flag, " ", final_dir, " is not writable");
    MOESQ_CHECK(fs::is_empty(p) || (!marker.empty() && fs::exists(p / marker)), flag, " ", final_dir,
                " exists and is not an earlier output (no ", marker.empty() ? "marker" : marker,
                "): refusing to replace it; choose a new directory or remove it yourself");
  }
  tmp_ = final_ + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  fs::create_directory(tmp_, ec);
  MOESQ_CHECK(!ec, flag, " ", final_dir, ": cannot create ", tmp_, ": ", ec.message());
}

AtomicDir::~AtomicDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

void AtomicDir::commit() {
  std::error_code ec;
  const std::string old = final_ + ".old." + std::to_string(::getpid());
  const bool had = fs::exists(final_);
  if (had) {
    fs::rename(final_, old, ec);
    MOESQ_CHECK(!ec, "cannot move existing ", final_, " aside: ", ec.message());
  }
  fs::rename(tmp_, final_, ec);
  if (ec) {
    if (had) fs::rename(old, final_, ec);
    MOESQ_FAIL("cannot rename ", tmp_, " to ", final_);
  }
  committed_ = true;
  if (had) fs::remove_all(old, ec);
}

}  // namespace moesq
