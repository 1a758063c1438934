// The routing's input on the GPU (compress/attention_cuda.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "compress/attention_cuda.h"
#include "compress/cuda_context.cuh"
#include "model/mixers/mla_mixer.h"
#include "model/rope.h"
#include "ops/causal_attention_f32/causal_attention_f32.h"
#include "ops/qk_rope/qk_rope.h"
#include "ops/rmsnorm/rmsnorm.h"

namespace moesq::compress {

namespace {

using gpu::Scratch;

constexpr int64_t kChunkRows = 65536;  // rows of whole sequences per pass (bounds the device buffers)

struct Context {
  gpu::ThreadContext& t = gpu::thread_context();
  Scratch<float> w_qkv, w_o, in_norm, post_norm, q_norm, k_norm, cos, sin;
  Scratch<float> h, xn, qkv, q, k, v, attn, X;
  Scratch<int32_t> pos;
  Scratch<int64_t> start;
  gpu::SplitOperand w_qkv_s, w_o_s, a_s;  // the TF32 parts of the projections' operands
};
Context& context() {
  thread_local Context ctx;
  return ctx;
}

void sgemm_nt(Context& g, const float* A, int64_t m, int64_t K, const gpu::SplitOperand& B, int64_t N, float* C,
              float beta) {
  gpu::sgemm_rows_nt(g.t, g.a_s, A, m, K, B, N, C, beta);
}

}  // namespace

void chunk_rows(const std::vector<int64_t>& offset, size_t a, size_t b, std::vector<int32_t>& pos,
                std::vector<int64_t>& start) {
  const int64_t r0 = offset[a], n = offset[b] - r0;
  pos.resize(static_cast<size_t>(n));
  start.resize(static_cast<size_t>(n));
  for (size_t i = a; i < b; ++i)
    for (int64_t r = offset[i]; r < offset[i + 1]; ++r) {
      pos[static_cast<size_t>(r - r0)] = static_cast<int32_t>(r - offset[i]);
      start[static_cast<size_t>(r - r0)] = offset[i] - r0;
    }
}

void attention_rows_cuda(const io::ModelSpec& spec, const model::LayerWeights& L, float* dh, float* dX,
                         const std::vector<int64_t>& offset) {
  if (const auto* mla = dynamic_cast<const model::MlaMixer*>(L.mixer.get()))
    return mla_rows_cuda(spec, *mla, L, dh, dX, offset);
  const int64_t H = spec.hidden_size, hd = spec.head_dim, nh = spec.num_heads, nkv = spec.num_kv_heads;
  const int64_t qw = nh * hd, kw = nkv * hd, qkv_w = qw + 2 * kw;
  const size_t S = offset.size() - 1;
  int64_t max_T = 1;
  for (size_t i = 0; i < S; ++i) max_T = std::max(max_T, offset[i + 1] - offset[i]);
  if (offset[S] == 0) return;
  Context& g = context();
  const cudaStream_t s = g.t.stream;
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(g.t.blas, CUBLAS_PEDANTIC_MATH));
  // The layer's weights: q|k|v fused [(nh + 2·nkv)·hd, H] (q rows, k rows, v rows), o [H, nh·hd], norms.
  float* w_qkv = g.w_qkv.get(static_cast<size_t>(qkv_w * H));
  g.t.h2d(w_qkv, L.q_proj.data(), sizeof(float) * qw * H);
  g.t.h2d(w_qkv + qw * H, L.k_proj.data(), sizeof(float) * kw * H);
  g.t.h2d(w_qkv + (qw + kw) * H, L.v_proj.data(), sizeof(float) * kw * H);
  float* w_o = g.w_o.get(static_cast<size_t>(H * qw));
  g.t.h2d(w_o, L.o_proj.data(), sizeof(float) * H * qw);
  g.w_qkv_s.split(g.t, w_qkv, static_cast<size_t>(qkv_w * H));
  g.w_o_s.split(g.t, w_o, static_cast<size_t>(H * qw));
  float* in_norm = g.in_norm.get(static_cast<size_t>(H));
  float* post_norm = g.post_norm.get(static_cast<size_t>(H));
  float* q_norm = g.q_norm.get(static_cast<size_t>(hd));
  float* k_norm = g.k_norm.get(static_cast<size_t>(hd));
  g.t.h2d(in_norm, L.input_norm.data(), sizeof(float) * H);
  g.t.h2d(post_norm, L.post_norm.data(), sizeof(float) * H);
  g.t.h2d(q_norm, L.q_norm.data(), sizeof(float) * hd);
  g.t.h2d(k_norm, L.k_norm.data(), sizeof(float) * hd);
  // RoPE tables of positions 0..max_T-1, the CPU attention's own (model::rope_tables).
  std::vector<float> cos_t, sin_t;
  model::rope_tables(max_T, hd, spec.rope_theta, cos_t, sin_t, false);
  float* cos_d = g.cos.get(cos_t.size());
  float* sin_d = g.sin.get(sin_t.size());
  g.t.h2d(cos_d, cos_t.data(), sizeof(float) * cos_t.size());
  g.t.h2d(sin_d, sin_t.data(), sizeof(float) * sin_t.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (size_t a = 0; a < S;) {
    // The chunk: sequences [a, b) of ≤ kChunkRows rows (a longer sequence alone).
    size_t b = a + 1;
    while (b < S && offset[b + 1] - offset[a] <= kChunkRows) ++b;
    const int64_t r0 = offset[a], n = offset[b] - r0;
    float* h = dh + r0 * H;
    float* xn = g.xn.get(static_cast<size_t>(n * H));
    float* qkv = g.qkv.get(static_cast<size_t>(n * qkv_w));
    float* q = g.q.get(static_cast<size_t>(n * qw));
    float* k = g.k.get(static_cast<size_t>(n * kw));
    float* v = g.v.get(static_cast<size_t>(n * kw));
    float* attn = g.attn.get(static_cast<size_t>(n * qw));
    std::vector<int32_t> pos;
    std::vector<int64_t> start;
    chunk_rows(offset, a, b, pos, start);
    int32_t* dpos = g.pos.get(pos.size());
    int64_t* dstart = g.start.get(start.size());
    g.t.h2d(dpos, pos.data(), sizeof(int32_t) * pos.size());
    g.t.h2d(dstart, start.data(), sizeof(int64_t) * start.size());
    ops::rmsnorm({.x = h, .w = in_norm, .y = nullptr, .y_lo = nullptr, .y_f32 = xn, .n = n, .D = H,
                  .eps = spec.rms_norm_eps},
                 s);
    sgemm_nt(g, xn, n, H, g.w_qkv_s, qkv_w, qkv, 0.0f);
    ops::QkRopeArgs rope;
    rope.qkv = qkv;
    rope.q_norm = q_norm;
    rope.k_norm = k_norm;
    rope.cos = cos_d;
    rope.sin = sin_d;
    rope.tok_pos = dpos;
    rope.q_out = q;
    rope.k_out = k;
    rope.v_out = v;
    rope.T = n;
    rope.nh = static_cast<int>(nh);
    rope.nkv = static_cast<int>(nkv);
    rope.hd = static_cast<int>(hd);
    rope.max_len = max_T;
    rope.eps = spec.rms_norm_eps;
    ops::qk_rope(rope, s);
    ops::causal_attention_f32({.q = q, .k = k, .v = v, .row_start = dstart, .out = attn, .n = n,
                               .nh = static_cast<int>(nh), .nkv = static_cast<int>(nkv), .hd = static_cast<int>(hd),
                               .window = L.attention_window, .scale = scale},
                              s);
    sgemm_nt(g, attn, n, qw, g.w_o_s, H, h, 1.0f);  // h += o_proj(attention)
    ops::rmsnorm({.x = h, .w = post_norm, .y = nullptr, .y_lo = nullptr, .y_f32 = dX + r0 * H, .n = n, .D = H,
                  .eps = spec.rms_norm_eps},
                 s);
    a = b;
    // The next chunk's host-side pos/start vectors are rebuilt while this one runs; its uploads wait
    // for the staging buffers (ThreadContext::h2d), so this chunk's inputs are never overwritten early.
  }
}

std::vector<float> moe_inputs_cuda(const io::ModelSpec& spec, const model::LayerWeights& L,
                                   std::vector<std::vector<float>>& h) {
  const int64_t H = spec.hidden_size;
  const size_t S = h.size();
  std::vector<int64_t> offset(S + 1, 0);
  for (size_t i = 0; i < S; ++i) {
    const int64_t T = static_cast<int64_t>(h[i].size()) / H;
    MOESQ_CHECK(T * H == static_cast<int64_t>(h[i].size()), "attention on the GPU: sequence ", i, " holds ",
                h[i].size(), " values, not a multiple of H = ", H);
    offset[i + 1] = offset[i] + T;
  }
  const int64_t n = offset[S];
  std::vector<float> X(static_cast<size_t>(n * H));
  if (n == 0) return X;
  Context& g = context();
  float* dh = g.h.get(static_cast<size_t>(n * H));
  float* dX = g.X.get(static_cast<size_t>(n * H));
  for (size_t i = 0; i < S; ++i) g.t.h2d(dh + offset[i] * H, h[i].data(), sizeof(float) * h[i].size());
  attention_rows_cuda(spec, L, dh, dX, offset);
  for (size_t i = 0; i < S; ++i) g.t.d2h(h[i].data(), dh + offset[i] * H, sizeof(float) * h[i].size());
  g.t.d2h(X.data(), dX, sizeof(float) * n * H);
  return X;
}

}  // namespace moesq::compress
