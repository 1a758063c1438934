// A small fork-join helper: parallel_for over [0, n) on T std::threads with a shared counter.
// Why not OpenMP: the thread count is a run-time CLI option (--threads) and experts are uneven
// work items, so dynamic claiming by an atomic counter balances them without a dependency.
#pragma once
#include <cstdint>
#include <functional>

namespace moesq {

// Number of worker threads used by parallel_for (default: the CPUs of this process's affinity mask,
// i.e. hardware concurrency unless a launcher such as mpirun bound it to fewer).
int num_threads();
void set_num_threads(int n);  // n <= 0 restores the default

// Runs fn(i) for i in [0, n); the first exception thrown by any fn is rethrown here.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn, int threads = 0);

}  // namespace moesq
