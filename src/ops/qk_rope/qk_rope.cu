// q/k head norm + RoPE + KV-cache append kernel (qk_rope.h): one warp per (token, head).
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/qk_rope/qk_rope.h"

namespace moesq::ops {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxHd = 256;

__device__ __forceinline__ uint16_t to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

__global__ void __launch_bounds__(kWarps * 32) qk_rope_kernel(QkRopeArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  __shared__ float s_v[kWarps][kMaxHd];  // normalized head vector of each warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int heads = a.nh + 2 * a.nkv, rot = a.rotary_dims(), half = rot / 2;
  const int64_t qs = a.q_gate ? 2 * a.hd : a.hd;  // a q head's stride in the row (query | gate)
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= a.T * heads) return;
  const int64_t t = item / heads;
  const int j = static_cast<int>(item % heads);
  const int64_t pos = a.tok_pos[t], slot = a.k_out ? 0 : a.tok_slot[t];
  if (pos < 0 || pos >= a.max_len) return;  // caller's bug; the host twin reports it
  const bool is_q = j < a.nh, is_k = !is_q && j < a.nh + a.nkv;
  const int64_t kv = is_q ? 0 : (is_k ? j - a.nh : j - a.nh - a.nkv);
  const int64_t cache_off = a.k_out ? 0 : (kv_row(a.block_table, a.max_len, slot, pos) * a.nkv + kv) * a.hd;
  const int64_t out_off = (t * a.nkv + kv) * a.hd;  // k_out / v_out row of the head
  const float* row = a.qkv + t * a.row_width();     // the token's q|k|v projection
  // Element i of head jj of the token's projection, its bias added (fp32, as add_bias_rows).
  const auto val = [&](int jj, int i) {
    const float x = row[(jj < a.nh ? jj * qs : a.nh * qs + (jj - a.nh) * a.hd) + i];
    return a.qkv_bias ? __fadd_rn(x, a.qkv_bias[jj * a.hd + i]) : x;
  };
  if (!is_q && !is_k) {
    for (int i = lane; i < a.hd; i += 32) {
      if (a.v_out) a.v_out[out_off + i] = val(j, i);
      else a.v_cache[cache_off + i] = to_bf16(val(j, i));
    }
    return;
  }
  const float* w = is_q ? a.q_norm : a.k_norm;
  if (w) {
    // The norm's span: this head, or (whole_qk_norm) every head of the token's q or k projection.
    const int j0 = a.whole_qk_norm ? (is_q ? 0 : a.nh) : j;
    const int n = a.whole_qk_norm ? (is_q ? a.nh : a.nkv) * a.hd : a.hd;
    double s = 0.0;
    for (int i = lane; i < n; i += 32) {
      const double v = static_cast<double>(val(j0 + i / a.hd, i % a.hd));
      s = __dadd_rn(s, __dmul_rn(v, v));
    }
    for (int h = 1; h < 32; h *= 2) s = __dadd_rn(s, __shfl_xor_sync(0xffffffffu, s, h));
    const float inv = static_cast<float>(1.0 / sqrt(s / static_cast<double>(n) + a.eps));
    const int64_t w0 = a.whole_qk_norm ? static_cast<int64_t>(j - j0) * a.hd : 0;
    for (int i = lane; i < a.hd; i += 32) s_v[warp][i] = __fmul_rn(w[w0 + i], __fmul_rn(val(j, i), inv));
  } else {
    for (int i = lane; i < a.hd; i += 32) s_v[warp][i] = val(j, i);
  }
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
  for (int i = rot + lane; i < a.hd; i += 32) {  // partial RoPE: the dims past rot pass unchanged
    const float x = s_v[warp][i];
    if (is_q) a.q_out[(t * a.nh + j) * a.hd + i] = x;
    else if (a.k_out) a.k_out[out_off + i] = x;
    else a.k_cache[cache_off + i] = to_bf16(x);
  }
}

}  // namespace

void qk_rope(const QkRopeArgs& a, cudaStream_t stream) {
  qk_rope_check(a);
  const int64_t items = a.T * (a.nh + 2 * a.nkv);
  if (items == 0) return;
  launch_pdl("qk_rope_kernel", qk_rope_kernel, dim3(static_cast<unsigned>((items + kWarps - 1) / kWarps)),
             dim3(kWarps * 32), 0, stream, a);
}

}  // namespace moesq::ops
