#include "core/threads.h"

#include <sched.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace moesq {

namespace {
std::atomic<int> g_threads{0};
}

int num_threads() {
  int t = g_threads.load();
  if (t > 0) return t;
  // The CPUs this process may run on: under `mpirun` each rank is bound to its own cores, and one
  // thread per machine core there would oversubscribe them.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  unsigned hc = std::thread::hardware_concurrency();
  return hc ? static_cast<int>(hc) : 1;
}

void set_num_threads(int n) { g_threads.store(n > 0 ? n : 0); }

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn, int threads) {
  if (n <= 0) return;
  int t = threads > 0 ? threads : num_threads();
  if (t > n) t = static_cast<int>(n);
  if (t <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr err;
  std::mutex err_mu;
  auto worker = [&] {
    for (;;) {
      int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (!err) err = std::current_exception();
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int k = 1; k < t; ++k) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace moesq
