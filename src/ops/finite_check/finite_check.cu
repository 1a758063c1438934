// Non-finite check kernel (finite_check.h): one CTA of 256 threads per row (grouped: per slot, the
// slots past the expert's count return at once); each thread scans a strided slice of the row's
// columns keeping the smallest non-finite class, a shared atomicMin reduces the CTA, and one global
// atomicMin per CTA that found something folds its key into the record.
#include <cuda_runtime.h>

#include "core/cuda/check.cuh"
#include "ops/finite_check/finite_check.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void finite_check_kernel(FiniteCheckArgs a) {
  using ull = unsigned long long;
  __shared__ int s_best;    // the smallest class in the row; 3 = none
  __shared__ bool s_beaten;  // an earlier site already holds the record
  if (threadIdx.x == 0) {
    s_best = 3;
    s_beaten = *reinterpret_cast<volatile uint64_t*>(a.record) < finite_key(a.site, 0, 0, FiniteKind::kNan);
  }
  __syncthreads();
  if (s_beaten) return;  // one read for the whole CTA, so every thread leaves together
  int64_t row = blockIdx.x, group = 0, id = row;
  if (a.groups > 0) {
    group = row / a.capacity;
    const int64_t s = row % a.capacity;
    if (s >= a.counts[group]) return;  // a stale slot (the same for every thread of the CTA)
    id = s;
    if (a.row_ids) {
      const int64_t r = a.row_ids[row];
      if (r >= 0) id = r / a.row_div;
    }
  }
  int best = 3;
  const int64_t base = row * a.ld;
  if (a.x_bf16) {
    for (int64_t c = threadIdx.x; c < a.cols; c += kThreads) {
      const int k = finite_class_bf16(a.x_bf16[base + c]);
      if (k >= 0 && k < best) best = k;
    }
  } else {
    for (int64_t c = threadIdx.x; c < a.cols; c += kThreads) {
      const int k = finite_class_f32(__float_as_uint(a.x_f32[base + c]));
      if (k >= 0 && k < best) best = k;
    }
  }
  if (best < 3) atomicMin(&s_best, best);
  __syncthreads();
  if (threadIdx.x == 0 && s_best < 3) {
    const uint64_t key = finite_key(a.site, static_cast<uint32_t>(group + a.group0), static_cast<uint32_t>(id + a.row0),
                                    static_cast<FiniteKind>(s_best));
    atomicMin(reinterpret_cast<ull*>(a.record), static_cast<ull>(key));
  }
}

}  // namespace

void finite_check(const FiniteCheckArgs& a, cudaStream_t stream) {
  finite_check_check(a);
  const int64_t rows = a.groups > 0 ? a.groups * a.capacity : a.rows;
  if (rows == 0) return;
  MOESQ_CHECK(rows <= 0x7fffffff, "finite_check: ", rows, " rows exceed one grid");
  finite_check_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("finite_check_kernel");
}

}  // namespace moesq::ops
