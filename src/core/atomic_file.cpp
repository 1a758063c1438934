#include "core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace fs = std::filesystem;

namespace moesq {

namespace {

// A temporary `<final>.tmp.<pid>` / `<final>.old.<pid>` left by a run that died (kill -9, power
// loss): its pid no longer exists (kill(pid, 0) fails with ESRCH; EPERM: alive), or it is a zombie
// (state Z/X in /proc/<pid>/stat: dead, but not reaped — containers whose PID 1 does not reap keep
// killed processes as zombies).
bool pid_is_dead(const std::string& digits) {
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  const long pid = std::stol(digits);
  if (pid <= 0 || pid == ::getpid()) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + digits + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces and parentheses
  return close != std::string::npos && close + 2 < line.size() && (line[close + 2] == 'Z' || line[close + 2] == 'X');
}

// Removes the orphaned temporaries of `final_path` (siblings named `<name>.tmp.<dead pid>` or
// `<name>.tmp.<dead pid>.<suffix>`). With a
// `marker` (AtomicDir), a `<name>.old.<dead pid>` holding it is the previous output moved aside by
// a commit killed before its second rename: put back when `final_path` is missing, removed
// otherwise; an `.old.` sibling without the marker is someone else's and is left alone.
void clean_orphans(const fs::path& final_path, const std::string& marker) {
  std::error_code ec;
  const fs::path parent = final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  const std::string name = final_path.filename().string();
  for (const char* kind : {".tmp.", ".old."}) {
    if (std::string(kind) == ".old." && marker.empty()) continue;
    const std::string prefix = name + kind;
    for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string fn = it->path().filename().string();
      if (fn.size() <= prefix.size() || fn.compare(0, prefix.size(), prefix) != 0) continue;
      // `.tmp.<pid>` may carry a suffix (`.tmp.<pid>.<what>`: a run's other temporaries of this
      // output, e.g. compress --export-format's intermediate moesq checkpoint); the pid is the
      // digits up to the next dot.
      std::string pid = fn.substr(prefix.size());
      if (std::string(kind) == ".tmp.") pid = pid.substr(0, pid.find('.'));
      if (!pid_is_dead(pid)) continue;
      std::error_code rm;
      if (std::string(kind) == ".old." && !fs::exists(it->path() / marker, rm)) continue;
      if (std::string(kind) == ".old." && !fs::exists(final_path, rm)) {
        fs::rename(it->path(), final_path, rm);
      } else {
        fs::remove_all(it->path(), rm);
      }
    }
  }
}

// write(2) all of `bytes` to a new file `tmp`; false with errno set on any failure (EFBIG, ENOSPC,
// EIO ...). fsync so that a rename after it publishes complete data.
bool write_all(const std::string& tmp, const std::string& bytes) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      const int err = errno;
      ::close(fd);
      errno = err;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return false;
  }
  return ::close(fd) == 0;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  clean_orphans(fs::path(path), "");
  OnInterrupt interrupt = OnInterrupt::remove(tmp);
  if (!write_all(tmp, bytes)) {
    const int err = errno;
    std::error_code ec;
    fs::remove(tmp, ec);
    MOESQ_FAIL("cannot write ", path, " (", bytes.size(), " bytes via ", tmp, "): ", std::strerror(err));
  }
  std::error_code ec;
  {
    const auto hold = hold_interrupts();  // renamed or not, never removed halfway
    fs::rename(tmp, path, ec);
    if (!ec) interrupt.dismiss();
  }
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
  clean_orphans(p, marker);
  tmp_ = final_ + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  interrupt_ = OnInterrupt::remove(tmp_);
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
  // An interrupt waits for both renames (it would otherwise leave OUT moved aside), then finds the
  // previous output at .old.<pid> registered for removal, and tmp_ no longer registered.
  auto hold = hold_interrupts();
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
  interrupt_ = had ? OnInterrupt::remove(old) : OnInterrupt();
  hold.unlock();
  if (had) fs::remove_all(old, ec);
  interrupt_.dismiss();
}

}  // namespace moesq
