// Scoped single-threaded BLAS. moesq parallelizes over experts / windows / sequences itself; letting
// OpenBLAS spawn its own threads inside each of those tasks oversubscribes the cores (measured on the
// 2-core CI machine: 128 SGPTQ experts took 12.3–14.1 s with OpenBLAS threading vs 2.7–6.3 s without).
#pragma once
#include <cblas.h>

namespace moesq {

struct ScopedBlasSingleThread {
#ifdef OPENBLAS_VERSION
  int saved = openblas_get_num_threads();
  ScopedBlasSingleThread() { openblas_set_num_threads(1); }
  ~ScopedBlasSingleThread() { openblas_set_num_threads(saved); }
#endif
};

}  // namespace moesq
