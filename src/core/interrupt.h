// Clean interrupts: on SIGINT / SIGTERM the command removes its own temporaries (the `.tmp.<pid>`
// files and directories of core/atomic_file), prints what it removed and the notes registered at that
// moment (e.g. compress: "OUT.work is kept; --resume continues there"), and exits 128 + signal.
// The non-obvious decision: the signal handler only writes the signal number to a pipe (all a handler
// may safely do); a watcher thread started by install_interrupt_cleanup() does the removal with
// ordinary code. Whatever thread the signal lands on (OpenBLAS starts its own before main), the same
// handler runs. Registration is a mutex-guarded list; hold_interrupts() keeps the watcher out while a
// commit renames a temporary into place, so an interrupt never removes half of a commit.
// A run killed outright (kill -9) cannot clean up: atomic_file's orphan rule covers that.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace moesq {

// Installs the SIGINT / SIGTERM handlers and the watcher thread (once; later calls do nothing).
// Without it (library use, tests), registrations are kept but nothing happens on a signal.
void install_interrupt_cleanup();

// One registration, removed when this object is destroyed or dismiss()ed. Move-only.
class OnInterrupt {
 public:
  // Remove `path` (a file, or a directory with everything in it) if interrupted meanwhile.
  static OnInterrupt remove(const std::string& path);
  // Print the line note() returns (on stderr, after the removals) if interrupted meanwhile.
  static OnInterrupt say(std::function<std::string()> note);
  OnInterrupt() = default;
  OnInterrupt(OnInterrupt&& o) noexcept : id_(o.id_) { o.id_ = 0; }
  OnInterrupt& operator=(OnInterrupt&& o) noexcept;
  ~OnInterrupt() { dismiss(); }
  OnInterrupt(const OnInterrupt&) = delete;
  OnInterrupt& operator=(const OnInterrupt&) = delete;
  void dismiss();

 private:
  explicit OnInterrupt(int64_t id) : id_(id) {}
  int64_t id_ = 0;
};

// While the returned lock is held, an interrupt waits (its cleanup runs after the lock is released):
// for the renames of a commit, so that a temporary is never removed half renamed into place.
std::unique_lock<std::recursive_mutex> hold_interrupts();

// What the watcher does on signal `signo`, without exiting: removes the registered temporaries and
// returns the stderr text (the removals, then the notes). Exposed for tests.
std::string run_interrupt_cleanup(int signo);

}  // namespace moesq
