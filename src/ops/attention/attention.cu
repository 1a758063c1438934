// Tensor-core causal GQA attention over the bf16 KV cache (attention.h). Two launch shapes share one
// per-chunk routine (chunk_partial) and one merge (merge_weights), so their rows are bitwise equal:
//  - split-KV (decode): one warp per (token, kv head, chunk of kAttnChunk keys) writes the chunk's
//    partial (m, l, o[hd]) of the group's query heads; a combine kernel merges a row's chunks in
//    ascending order. Many small CTAs keep HBM busy at batch 1 (keys stream once through cp.async).
//  - prefill: one CTA of 4 warps per (tile of consecutive tokens of one slot, kv head); the warps
//    share double-buffered K/V chunks in shared memory and merge each chunk's partial in registers.
// Warp tile: 16 query rows (G heads × 16/G tokens), rows r0 = lane/4 and r0 + 8 of mma m16n8k16.
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "core/env_switch.h"
#include "ops/attention/attention.h"

namespace moesq::ops {

namespace {

constexpr int kRows = 16;     // query rows per warp tile (mma M)
constexpr int kPad = 8;       // bf16 row padding of the shared tiles (16 B: conflict-free fragments)

__device__ __forceinline__ uint32_t pack_bf16(float lo_col, float hi_col) {
  const uint32_t a = __bfloat16_as_ushort(__float2bfloat16_rn(lo_col));
  const uint32_t b = __bfloat16_as_ushort(__float2bfloat16_rn(hi_col));
  return a | (b << 16);
}
__device__ __forceinline__ float bf16_residue(float x) { return __fsub_rn(x, __bfloat162float(__float2bfloat16_rn(x))); }

__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Merge weights of one chunk into a row's running (M, L): O ← O·wa + o_c·wb. Callers skip chunks
// with l == 0 (no valid key for the row): both launch shapes merge exactly the chunks c ≤ pos / 64.
__device__ __forceinline__ void merge_weights(float& M, float& L, float m, float l, float& wa, float& wb) {
  const float Mn = fmaxf(M, m);
  wa = L == 0.0f ? 0.0f : __expf(__fsub_rn(M, Mn));
  wb = __expf(__fsub_rn(m, Mn));
  L = __fmaf_rn(L, wa, __fmul_rn(l, wb));
  M = Mn;
}
__device__ __forceinline__ float merge_value(float O, float o, float wa, float wb) {
  return __fmaf_rn(O, wa, __fmul_rn(o, wb));
}
// A row's attention sink joins its denominator after the last chunk: L ← L·wa + exp(sink − M'),
// M' = max(M, sink); the caller scales O by the returned wa before the division. The one definition
// both launch shapes use (the twin: the same formula with std::exp).
__device__ __forceinline__ float fold_sink(float M, float& L, float sink) {
  const float Mn = fmaxf(M, sink);
  const float wa = __expf(__fsub_rn(M, Mn));
  L = __fmaf_rn(L, wa, __expf(__fsub_rn(sink, Mn)));
  return wa;
}
// The output value of a row: O / L, or (O·wa) / L after a sink fold.
__device__ __forceinline__ float finish(float O, float L, bool sink, float wa) {
  return sink ? __fdiv_rn(__fmul_rn(O, wa), L) : __fdiv_rn(O, L);
}

// One warp, one chunk: partial softmax state of its 16 rows over keys key0 .. key0 + 63 held in
// sK/sV [64][HD + pad] (keys past the slot's valid range zero-filled). sQh/sQl: the warp's 16 rows,
// bf16 hi/lo of q. pos[0/1]: positions of rows r0 / r0 + 8 (−1: padding row); lo[0/1]: their first
// visible key (attention_first_key: 0, or the sliding window's start). Outputs per lane:
// o [HD/8][4] (accumulator layout), m[2], l[2] of rows r0, r0 + 8 (l = 0: no visible key).
template <int HD>
__device__ __forceinline__ void chunk_partial(const uint16_t* sQh, const uint16_t* sQl, const uint16_t* sK,
                                              const uint16_t* sV, int key0, const int pos[2], const int lo[2],
                                              float scale, float o[HD / 8][4], float m[2], float l[2]) {
  constexpr int LD = HD + kPad, NT = kAttnChunk / 8;
  const int lane = threadIdx.x % 32, r = lane / 4, q4 = lane % 4;
  float s[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    const int c = ks * 16 + q4 * 2;
    uint32_t ah[4], al[4];
    ah[0] = *reinterpret_cast<const uint32_t*>(sQh + r * LD + c);
    ah[1] = *reinterpret_cast<const uint32_t*>(sQh + (r + 8) * LD + c);
    ah[2] = *reinterpret_cast<const uint32_t*>(sQh + r * LD + c + 8);
    ah[3] = *reinterpret_cast<const uint32_t*>(sQh + (r + 8) * LD + c + 8);
    al[0] = *reinterpret_cast<const uint32_t*>(sQl + r * LD + c);
    al[1] = *reinterpret_cast<const uint32_t*>(sQl + (r + 8) * LD + c);
    al[2] = *reinterpret_cast<const uint32_t*>(sQl + r * LD + c + 8);
    al[3] = *reinterpret_cast<const uint32_t*>(sQl + (r + 8) * LD + c + 8);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t b[2];
      b[0] = *reinterpret_cast<const uint32_t*>(sK + (nt * 8 + r) * LD + c);
      b[1] = *reinterpret_cast<const uint32_t*>(sK + (nt * 8 + r) * LD + c + 8);
      mma16816(s[nt], ah, b);
      mma16816(s[nt], al, b);
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = key0 + nt * 8 + q4 * 2 + (i & 1);
      const float v = key <= pos[i / 2] && key >= lo[i / 2] ? __fmul_rn(s[nt][i], scale) : -INFINITY;
      s[nt][i] = v;
      mx[i / 2] = fmaxf(mx[i / 2], v);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float p = mx[i / 2] == -INFINITY ? 0.0f : __expf(__fsub_rn(s[nt][i], mx[i / 2]));
      s[nt][i] = p;
      sum[i / 2] = __fadd_rn(sum[i / 2], p);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] = __fadd_rn(sum[h], __shfl_xor_sync(0xffffffffu, sum[h], 1));
    sum[h] = __fadd_rn(sum[h], __shfl_xor_sync(0xffffffffu, sum[h], 2));
    m[h] = mx[h], l[h] = sum[h];
  }
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kAttnChunk / 16; ++kk) {
    const float* s0 = s[2 * kk];
    const float* s1 = s[2 * kk + 1];
    uint32_t ph[4], pl[4];
    ph[0] = pack_bf16(s0[0], s0[1]), ph[1] = pack_bf16(s0[2], s0[3]);
    ph[2] = pack_bf16(s1[0], s1[1]), ph[3] = pack_bf16(s1[2], s1[3]);
    pl[0] = pack_bf16(bf16_residue(s0[0]), bf16_residue(s0[1]));
    pl[1] = pack_bf16(bf16_residue(s0[2]), bf16_residue(s0[3]));
    pl[2] = pack_bf16(bf16_residue(s1[0]), bf16_residue(s1[1]));
    pl[3] = pack_bf16(bf16_residue(s1[2]), bf16_residue(s1[3]));
    const uint16_t* v0 = sV + (kk * 16 + q4 * 2) * LD + r;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      uint32_t b[2];
      b[0] = static_cast<uint32_t>(v0[nt * 8]) | (static_cast<uint32_t>(v0[LD + nt * 8]) << 16);
      b[1] = static_cast<uint32_t>(v0[8 * LD + nt * 8]) | (static_cast<uint32_t>(v0[9 * LD + nt * 8]) << 16);
      mma16816(o[nt], ph, b);
      mma16816(o[nt], pl, b);
    }
  }
}

// Stages rows [0, kRows·warps) of q (fp32) as bf16 hi/lo; row R → q row q_row(R) or zeros (< 0).
template <int HD, typename RowFn>
__device__ __forceinline__ void stage_q(const float* q, uint16_t* sQh, uint16_t* sQl, int rows, RowFn q_row,
                                        int tid, int nthreads) {
  constexpr int LD = HD + kPad;
  for (int i = tid; i < rows * HD / 4; i += nthreads) {
    const int R = i / (HD / 4), e = (i % (HD / 4)) * 4;
    const int64_t qr = q_row(R);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (qr >= 0) v = *reinterpret_cast<const float4*>(q + qr * HD + e);
    uint2 hi, lo;
    hi.x = pack_bf16(v.x, v.y), hi.y = pack_bf16(v.z, v.w);
    lo.x = pack_bf16(bf16_residue(v.x), bf16_residue(v.y)), lo.y = pack_bf16(bf16_residue(v.z), bf16_residue(v.w));
    *reinterpret_cast<uint2*>(sQh + R * LD + e) = hi;
    *reinterpret_cast<uint2*>(sQl + R * LD + e) = lo;
  }
}

// Async copy of keys [key0, key0 + 64) of (slot, kv) into sK/sV; keys > last are zero-filled.
template <int HD>
__device__ __forceinline__ void load_kv(const AttentionArgs& a, int64_t slot, int kv, int key0, int last, uint16_t* sK,
                                        uint16_t* sV, int tid, int nthreads) {
  constexpr int LD = HD + kPad, VEC = HD / 8;  // 16-byte vectors per key row
  const int64_t row_stride = static_cast<int64_t>(a.nkv) * HD;
  const int64_t base = (kv_row(a.block_table, a.max_len, slot, key0) * a.nkv + kv) * HD;  // key0: a block's first
  for (int i = tid; i < kAttnChunk * VEC; i += nthreads) {
    const int j = i / VEC, e = (i % VEC) * 8;
    const bool valid = key0 + j <= last;
    const int64_t off = valid ? base + j * row_stride + e : 0;
    cp_async16(sK + j * LD + e, a.k_cache + off, valid);
    cp_async16(sV + j * LD + e, a.v_cache + off, valid);
  }
}

// σ(gate) of output row out_row = t·nh + h, column col (AttentionArgs::gate), as the CPU's sigmoid.
__device__ __forceinline__ float gate_of(const AttentionArgs& a, int64_t out_row, int col) {
  const float g = a.gate[(out_row / a.nh) * a.gate_ld + (out_row % a.nh) * a.gate_head_ld + col];
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
}

template <int HD>
__device__ __forceinline__ void write_row_pair(const AttentionArgs& a, int64_t out_row, int col, float x0, float x1) {
  if (a.gate) x0 = __fmul_rn(x0, gate_of(a, out_row, col)), x1 = __fmul_rn(x1, gate_of(a, out_row, col + 1));
  const int64_t o = out_row * HD + col;
  *reinterpret_cast<uint32_t*>(a.out + o) = pack_bf16(x0, x1);
  if (a.out_lo) *reinterpret_cast<uint32_t*>(a.out_lo + o) = pack_bf16(bf16_residue(x0), bf16_residue(x1));
}

// Split-KV: grid (chunks, nkv, T), one warp. Partial layout per (token·nh + head, chunk):
// o [hd] then (m, l).
template <int HD, int G>
__global__ void __launch_bounds__(32) attn_split_kernel(AttentionArgs a, int chunks) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr int LD = HD + kPad;
  uint16_t* sQh = smem;
  uint16_t* sQl = sQh + kRows * LD;
  uint16_t* sK = sQl + kRows * LD;
  uint16_t* sV = sK + kAttnChunk * LD;
  const int c = blockIdx.x, kv = blockIdx.y;
  const int64_t t = blockIdx.z;
  const int pos = a.tok_pos[t];
  const int64_t slot = a.tok_slot[t];
  const int lo = static_cast<int>(attention_first_key(pos, a.window));
  // Chunks wholly before the window are neither read nor written (the combine starts after them).
  if (pos < 0 || pos >= a.max_len || c * kAttnChunk > pos || (c + 1) * kAttnChunk <= lo) return;
  const int lane = threadIdx.x;
  load_kv<HD>(a, slot, kv, c * kAttnChunk, pos, sK, sV, lane, 32);
  cp_async_commit();
  stage_q<HD>(a.q, sQh, sQl, kRows, [&](int R) -> int64_t { return R < G ? t * a.nh + kv * G + R : -1; }, lane, 32);
  cp_async_wait<0>();
  __syncthreads();
  const int r0 = lane / 4, q4 = lane % 4;
  const int pr[2] = {r0 < G ? pos : -1, r0 + 8 < G ? pos : -1}, plo[2] = {lo, lo};
  float o[HD / 8][4], m[2], l[2];
  chunk_partial<HD>(sQh, sQl, sK, sV, c * kAttnChunk, pr, plo, a.scale, o, m, l);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = r0 + 8 * h;
    if (R >= G) continue;
    float* p = a.partial + ((t * a.nh + kv * G + R) * chunks + c) * (HD + 2);
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt)
      *reinterpret_cast<float2*>(p + nt * 8 + q4 * 2) = make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
    if (q4 == 0) p[HD] = m[h], p[HD + 1] = l[h];
  }
}

// Combine: one CTA of HD threads per (token, head); chunks c0 .. pos/64 merged in ascending order.
// The partials are loaded kCombineBatch chunks at a time (independent loads in flight; every chunk in
// the range was written by the split kernel), then merged one by one in registers: the same merge
// sequence as loading each just before its merge, without a dependent global load per chunk.
// kCombineBatch 1 is session 31's kernel (MOESQ_ATTN_COMBINE_BATCH=0: the same-run peer).
template <int HD, int kCombineBatch>
__global__ void __launch_bounds__(HD) attn_combine_kernel(AttentionArgs a, int chunks) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  const int64_t row = blockIdx.x, t = row / a.nh;
  const int pos = a.tok_pos[t];
  if (pos < 0 || pos >= a.max_len) return;
  const int e = threadIdx.x, c0 = static_cast<int>(attention_first_key(pos, a.window) / kAttnChunk);
  const int c_last = pos / kAttnChunk;
  const float* p = a.partial + (row * chunks + c0) * (HD + 2);
  float M = -INFINITY, L = 0.0f, O = 0.0f;
  for (int cb = c0; cb <= c_last; cb += kCombineBatch, p += kCombineBatch * (HD + 2)) {
    float mb[kCombineBatch], lb[kCombineBatch], ob[kCombineBatch];
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const bool in = cb + j <= c_last;
      const float* q = p + j * (HD + 2);
      mb[j] = in ? q[HD] : 0.0f, lb[j] = in ? q[HD + 1] : 0.0f, ob[j] = in ? q[e] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      if (lb[j] == 0.0f) continue;  // also the chunks past c_last
      float wa, wb;
      merge_weights(M, L, mb[j], lb[j], wa, wb);
      O = merge_value(O, ob[j], wa, wb);
    }
  }
  const float wa = a.sinks ? fold_sink(M, L, a.sinks[row % a.nh]) : 1.0f;
  float x = finish(O, L, a.sinks != nullptr, wa);
  if (a.gate) x = __fmul_rn(x, gate_of(a, row, e));
  const int64_t o = row * HD + e;
  a.out[o] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
  if (a.out_lo) a.out_lo[o] = __bfloat16_as_ushort(__float2bfloat16_rn(bf16_residue(x)));
}

// Prefill: grid (n_tiles, nkv), 4 warps; warp w owns CTA rows [16w, 16w + 16), row R = token
// (R / G) of the tile, head kv·G + R % G. K/V chunks double-buffered through cp.async.
template <int HD, int G>
__global__ void __launch_bounds__(128, 2) attn_prefill_kernel(AttentionArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr int LD = HD + kPad, ROWS = kAttnTileRows;
  uint16_t* sQh = smem;
  uint16_t* sQl = sQh + ROWS * LD;
  uint16_t* sKV = sQl + ROWS * LD;  // [2 buffers][K, V][64][LD]
  const int kv = blockIdx.y;
  const int64_t t0 = a.tiles[2 * blockIdx.x];
  const int n = a.tiles[2 * blockIdx.x + 1];
  const int pos0 = a.tok_pos[t0];
  const int64_t slot = a.tok_slot[t0];
  const int last = pos0 + n - 1;  // the tile's largest position
  if (pos0 < 0 || last >= a.max_len) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r0 = lane / 4, q4 = lane % 4;
  const int chunks = last / kAttnChunk + 1;
  // The tile's first row sees the earliest key: chunks before its window start are not read.
  const int c_first = static_cast<int>(attention_first_key(pos0, a.window) / kAttnChunk);
  {
    uint16_t* fb = sKV + (c_first & 1) * 2 * kAttnChunk * LD;
    load_kv<HD>(a, slot, kv, c_first * kAttnChunk, last, fb, fb + kAttnChunk * LD, tid, 128);
  }
  cp_async_commit();
  stage_q<HD>(a.q, sQh, sQl, ROWS, [&](int R) -> int64_t { return R / G < n ? (t0 + R / G) * a.nh + kv * G + R % G : -1; },
              tid, 128);
  int pr[2], plo[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = warp * kRows + r0 + 8 * h;
    pr[h] = R / G < n ? pos0 + R / G : -1;
    plo[h] = pr[h] < 0 ? 0 : static_cast<int>(attention_first_key(pr[h], a.window));
  }
  const int warp_last = min(n - 1, (warp * kRows + kRows - 1) / G);  // the warp's last valid token
  const int warp_pos = warp * kRows / G < n ? pos0 + warp_last : -1;
  // The warp's first row sees the warp's earliest key: chunks ending before it give l = 0 to every row.
  const int warp_lo = warp_pos < 0 ? 0 : static_cast<int>(attention_first_key(pos0 + warp * kRows / G, a.window));
  float O[HD / 8][4], M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) O[nt][0] = O[nt][1] = O[nt][2] = O[nt][3] = 0.0f;
  for (int c = c_first; c < chunks; ++c) {
    if (c + 1 < chunks) {
      uint16_t* nb = sKV + ((c + 1) & 1) * 2 * kAttnChunk * LD;
      load_kv<HD>(a, slot, kv, (c + 1) * kAttnChunk, last, nb, nb + kAttnChunk * LD, tid, 128);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* sK = sKV + (c & 1) * 2 * kAttnChunk * LD;
    if (c * kAttnChunk <= warp_pos && (c + 1) * kAttnChunk > warp_lo) {  // warp-uniform: some row sees this chunk
      float o[HD / 8][4], m[2], l[2];
      chunk_partial<HD>(sQh + warp * kRows * LD, sQl + warp * kRows * LD, sK, sK + kAttnChunk * LD, c * kAttnChunk, pr,
                        plo, a.scale, o, m, l);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (l[h] == 0.0f) continue;
        float wa, wb;
        merge_weights(M[h], L[h], m[h], l[h], wa, wb);
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt) {
          O[nt][2 * h] = merge_value(O[nt][2 * h], o[nt][2 * h], wa, wb);
          O[nt][2 * h + 1] = merge_value(O[nt][2 * h + 1], o[nt][2 * h + 1], wa, wb);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = warp * kRows + r0 + 8 * h;
    if (pr[h] < 0) continue;
    const int64_t out_row = (t0 + R / G) * a.nh + kv * G + R % G;
    const float wa = a.sinks ? fold_sink(M[h], L[h], a.sinks[kv * G + R % G]) : 1.0f;
    const bool sink = a.sinks != nullptr;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt)
      write_row_pair<HD>(a, out_row, nt * 8 + q4 * 2, finish(O[nt][2 * h], L[h], sink, wa),
                         finish(O[nt][2 * h + 1], L[h], sink, wa));
  }
}

template <int HD, int G>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  constexpr int LD = HD + kPad;
  if (a.tiles) {
    const size_t smem = (2 * kAttnTileRows + 4 * kAttnChunk) * LD * sizeof(uint16_t);
    static bool attr = false;  // set once per instantiation (not a stream operation: capture-safe)
    if (!attr) {
      MOESQ_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<HD, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
      attr = true;
    }
    MOESQ_CHECK(a.n_tiles <= 0x7fffffff, "attention: ", a.n_tiles, " tiles too many for the grid");
    launch_pdl("attn_prefill_kernel", attn_prefill_kernel<HD, G>, dim3(static_cast<unsigned>(a.n_tiles), a.nkv),
               dim3(128), smem, stream, a);
    return;
  }
  const int chunks = static_cast<int>((a.max_len + kAttnChunk - 1) / kAttnChunk);
  MOESQ_CHECK(a.T <= 65535, "attention: split-KV path takes at most 65535 tokens per call, got ", a.T);
  const size_t smem = (2 * kRows + 2 * kAttnChunk) * LD * sizeof(uint16_t);
  static bool attr = false;
  if (!attr) {
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(attn_split_kernel<HD, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    attr = true;
  }
  launch_pdl("attn_split_kernel", attn_split_kernel<HD, G>, dim3(chunks, a.nkv, static_cast<unsigned>(a.T)), dim3(32),
             smem, stream, a, chunks);
  static const bool batched = env_switch_on("MOESQ_ATTN_COMBINE_BATCH");
  launch_pdl("attn_combine_kernel", batched ? attn_combine_kernel<HD, 8> : attn_combine_kernel<HD, 1>,
             dim3(static_cast<unsigned>(a.T * a.nh)), dim3(HD), 0, stream, a, chunks);
}

template <int HD>
void launch_hd(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.nh / a.nkv) {
    case 1: return launch<HD, 1>(a, stream);
    case 2: return launch<HD, 2>(a, stream);
    case 4: return launch<HD, 4>(a, stream);
    case 8: return launch<HD, 8>(a, stream);
    case 16: return launch<HD, 16>(a, stream);
    default: MOESQ_FAIL("attention: ", a.nh / a.nkv, " query heads per kv head not built (built: 1, 2, 4, 8, 16)");
  }
}

}  // namespace

void attention(const AttentionArgs& a, cudaStream_t stream) {
  attention_check(a);
  MOESQ_CHECK((a.tiles != nullptr) != (a.partial != nullptr),
              "attention: give exactly one of tiles (prefill) and partial (split-KV)");
  if (a.T == 0 || (a.tiles && a.n_tiles == 0)) return;
  if (a.hd == 32) return launch_hd<32>(a, stream);
  if (a.hd == 64) return launch_hd<64>(a, stream);
  if (a.hd == 128) return launch_hd<128>(a, stream);
  return launch_hd<256>(a, stream);
}

}  // namespace moesq::ops
