// q/k head norm + RoPE + KV-cache append kernel (qk_rope.h): one warp per (token, head).
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "ops/qk_rope/qk_rope.h"

namespace moesq::ops {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxHd = 256;

__device__ __forceinline__ uint16_t to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

__global__ void __launch_bounds__(kWarps * 32) qk_rope_kernel(QkRopeArgs a) {
  __shared__ float s_v[kWarps][kMaxHd];  // normalized head vector of each warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int heads = a.nh + 2 * a.nkv, half = a.hd / 2;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= a.T * heads) return;
  const int64_t t = item / heads;
  const int j = static_cast<int>(item % heads);
  const int64_t pos = a.tok_pos[t], slot = a.k_out ? 0 : a.tok_slot[t];
  if (pos < 0 || pos >= a.max_len) return;  // caller's bug; the host twin reports it
  const float* x = a.qkv + item * a.hd;
  const bool is_q = j < a.nh, is_k = !is_q && j < a.nh + a.nkv;
  const int64_t kv = is_q ? 0 : (is_k ? j - a.nh : j - a.nh - a.nkv);
  const int64_t cache_off = a.k_out ? 0 : (kv_row(a.block_table, a.max_len, slot, pos) * a.nkv + kv) * a.hd;
  const int64_t out_off = (t * a.nkv + kv) * a.hd;  // k_out / v_out row of the head
  if (!is_q && !is_k) {
    for (int i = lane; i < a.hd; i += 32) {
      if (a.v_out) a.v_out[out_off + i] = x[i];
      else a.v_cache[cache_off + i] = to_bf16(x[i]);
    }
    return;
  }
  double s = 0.0;
  for (int i = lane; i < a.hd; i += 32) s = __dadd_rn(s, __dmul_rn(static_cast<double>(x[i]), static_cast<double>(x[i])));
  for (int h = 1; h < 32; h *= 2) s = __dadd_rn(s, __shfl_xor_sync(0xffffffffu, s, h));
  const float inv = static_cast<float>(1.0 / sqrt(s / static_cast<double>(a.hd) + a.eps));
  const float* w = is_q ? a.q_norm : a.k_norm;
  for (int i = lane; i < a.hd; i += 32) s_v[warp][i] = __fmul_rn(w[i], __fmul_rn(x[i], inv));
  __syncwarp();
  const float* c = a.cos + pos * half;
  const float* sn = a.sin + pos * half;
  for (int i = lane; i < half; i += 32) {
    const float lo = s_v[warp][i], hi = s_v[warp][i + half];
    const float r0 = __fsub_rn(__fmul_rn(lo, c[i]), __fmul_rn(hi, sn[i]));
    const float r1 = __fadd_rn(__fmul_rn(hi, c[i]), __fmul_rn(lo, sn[i]));
    if (is_q) {
      a.q_out[(t * a.nh + j) * a.hd + i] = r0;
      a.q_out[(t * a.nh + j) * a.hd + i + half] = r1;
    } else if (a.k_out) {
      a.k_out[out_off + i] = r0;
      a.k_out[out_off + i + half] = r1;
    } else {
      a.k_cache[cache_off + i] = to_bf16(r0);
      a.k_cache[cache_off + i + half] = to_bf16(r1);
    }
  }
}

}  // namespace

void qk_rope(const QkRopeArgs& a, cudaStream_t stream) {
  qk_rope_check(a);
  const int64_t items = a.T * (a.nh + 2 * a.nkv);
  if (items == 0) return;
  qk_rope_kernel<<<static_cast<unsigned>((items + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("qk_rope_kernel");
}

}  // namespace moesq::ops
