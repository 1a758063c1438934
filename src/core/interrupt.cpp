// SIGINT / SIGTERM cleanup (see the header): handler → pipe → watcher thread → remove, print, _exit.
#include "core/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

namespace moesq {

namespace {

struct Entry {
  std::string path;                   // non-empty: a temporary to remove
  std::function<std::string()> note;  // else: a note to print
};

std::recursive_mutex& registry_mutex() {
  static std::recursive_mutex mu;
  return mu;
}

std::map<int64_t, Entry>& registry() {  // id → entry, in registration order
  static std::map<int64_t, Entry> r;
  return r;
}

int64_t add(Entry e) {
  static int64_t next = 0;
  std::lock_guard<std::recursive_mutex> lk(registry_mutex());
  registry()[++next] = std::move(e);
  return next;
}

int g_pipe[2] = {-1, -1};

extern "C" void on_signal(int signo) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(signo);
  [[maybe_unused]] const ssize_t n = ::write(g_pipe[1], &b, 1);  // async-signal-safe; a full pipe drops it
  errno = saved;
}

void watch() {
  unsigned char b = 0;
  for (;;) {
    const ssize_t n = ::read(g_pipe[0], &b, 1);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    return;  // the pipe is gone: nothing to watch
  }
  const std::string text = run_interrupt_cleanup(b);
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  ::_exit(128 + b);
}

}  // namespace

void install_interrupt_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(g_pipe, O_CLOEXEC) != 0) return;  // no pipe: the default action (terminate) stays
    ::fcntl(g_pipe[1], F_SETFL, O_NONBLOCK);
    std::thread(watch).detach();
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // the other threads' system calls continue until the watcher exits
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
  });
}

OnInterrupt OnInterrupt::remove(const std::string& path) { return OnInterrupt(add({path, {}})); }

OnInterrupt OnInterrupt::say(std::function<std::string()> note) { return OnInterrupt(add({"", std::move(note)})); }

OnInterrupt& OnInterrupt::operator=(OnInterrupt&& o) noexcept {
  if (this != &o) {
    dismiss();
    id_ = o.id_;
    o.id_ = 0;
  }
  return *this;
}

void OnInterrupt::dismiss() {
  if (id_ == 0) return;
  std::lock_guard<std::recursive_mutex> lk(registry_mutex());
  registry().erase(id_);
  id_ = 0;
}

std::unique_lock<std::recursive_mutex> hold_interrupts() {
  return std::unique_lock<std::recursive_mutex>(registry_mutex());
}

std::string run_interrupt_cleanup(int signo) {
  std::lock_guard<std::recursive_mutex> lk(registry_mutex());
  const char* name = signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : "a signal";
  std::string removed, notes;
  for (const auto& [id, e] : registry()) {
    if (e.path.empty()) continue;
    std::error_code ec;
    if (std::filesystem::remove_all(e.path, ec) > 0 && !ec) removed += (removed.empty() ? "" : ", ") + e.path;
  }
  for (const auto& [id, e] : registry())
    if (e.path.empty() && e.note) notes += "moesq: " + e.note() + "\n";
  std::string text = std::string("moesq: interrupted by ") + name;
  text += removed.empty() ? std::string(": no temporaries to remove") : ": removed the temporaries " + removed;
  return text + "\n" + notes;
}

}  // namespace moesq
