// Kernel of the gather_f32 launcher (gather_f32.h): one CTA per output row.
#include <algorithm>

#include "core/cuda/check.cuh"
#include "ops/gather_f32/gather_f32.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

constexpr int kMaxGathers = 8;
struct Gathers {
  GatherF32Args a[kMaxGathers];
};

// Block (i, j): output row i of gather j.
__global__ void __launch_bounds__(kThreads) gather_kernel(Gathers g) {
  const GatherF32Args& a = g.a[blockIdx.y];
  const int64_t i = blockIdx.x;
  if (i >= a.m) return;
  const int64_t r = a.idx[i];
  const bool in = r >= 0 && r < a.src_rows;
  float* out = a.out + i * a.C;
  const float* src = a.src + (in ? r : 0) * a.C;
  for (int64_t c = threadIdx.x; c < a.C; c += kThreads) out[c] = in ? src[c] : 0.0f;
}

}  // namespace

void gather_f32(const GatherF32Args* a, int n, cudaStream_t stream) {
  MOESQ_CHECK(n >= 1 && n <= kMaxGathers, "gather_f32: ", n, " gathers in one launch (1 to ", kMaxGathers, ")");
  Gathers g;
  int64_t m = 0;
  for (int j = 0; j < n; ++j) {
    gather_f32_check(a[j]);
    g.a[j] = a[j];
    m = std::max(m, a[j].m);
  }
  if (m == 0) return;
  MOESQ_CHECK(m <= 0x7fffffff, "gather_f32: ", m, " rows exceed the grid");
  gather_kernel<<<dim3(static_cast<unsigned>(m), static_cast<unsigned>(n)), kThreads, 0, stream>>>(g);
  MOESQ_CUDA_LAUNCH_CHECK("gather_f32");
}
void gather_f32(const GatherF32Args& a, cudaStream_t stream) { gather_f32(&a, 1, stream); }

}  // namespace moesq::ops
