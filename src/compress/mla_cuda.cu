// Multi-head latent attention in compression's fp32 layer forward on the GPU (compress/attention_cuda.h
// mla_rows_cuda): the naive form of model::mla_forward (model/mixers/mla.h), which is what the CPU
// compression path runs, over packed calibration sequences.
//
// Non-obvious decision: the naive form, not the engine's absorbed one (runtime/layers/mla_block): the
// routing input must be the CPU forward's to fp32 accuracy (per-head keys and values are expanded in
// fp32; the engine keeps a bf16 latent cache), and a compression forward attends over whole sequences
// once, so the absorbed form's saving (no per-head K/V for a long-lived cache) does not apply.
#include <algorithm>
#include <vector>

#include "compress/attention_cuda.h"
#include "compress/cuda_context.cuh"
#include "ops/causal_attention_f32/causal_attention_f32.h"
#include "ops/mla_f32/mla_f32.h"
#include "ops/rmsnorm/rmsnorm.h"

namespace moesq::compress {

namespace {

using gpu::Scratch;

constexpr size_t kChunkBytes = size_t{4} << 30;  // activations of one pass (bounds device memory)

struct MlaContext {
  gpu::ThreadContext& t = gpu::thread_context();
  Scratch<float> w_qa, w_qb, w_kva, w_kvb, w_o, in_norm, post_norm, qa_norm, kva_norm, cos, sin;
  Scratch<float> xn, qa, q, ckv, latent, k_pe, kv, k, v, attn;
  Scratch<int32_t> pos;
  Scratch<int64_t> start;
  gpu::SplitOperand qa_s, qb_s, kva_s, kvb_s, o_s, a_s;
};
MlaContext& context() {
  thread_local MlaContext ctx;
  return ctx;
}

// Uploads w (host) and splits it into TF32 parts.
void upload_split(MlaContext& g, Scratch<float>& buf, gpu::SplitOperand& split, const std::vector<float>& w) {
  float* d = buf.get(w.size());
  g.t.h2d(d, w.data(), sizeof(float) * w.size());
  split.split(g.t, d, w.size());
}

float* upload(MlaContext& g, Scratch<float>& buf, const std::vector<float>& w) {
  float* d = buf.get(w.size());
  g.t.h2d(d, w.data(), sizeof(float) * w.size());
  return d;
}

}  // namespace

void mla_rows_cuda(const io::ModelSpec& spec, const model::MlaMixer& mla, const model::LayerWeights& L, float* dh,
                   float* dX, const std::vector<int64_t>& offset) {
  const model::MlaDims& d = mla.dims();
  const model::MlaWeights& w = mla.weights();
  const int64_t H = spec.hidden_size, nh = d.num_heads, r_q = d.q_lora_rank, r_kv = d.kv_lora_rank;
  const int64_t nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim, dv = d.v_head_dim, dqk = d.qk_head_dim();
  const size_t S = offset.size() - 1;
  if (offset[S] == 0) return;
  int64_t max_T = 1;
  for (size_t i = 0; i < S; ++i) max_T = std::max(max_T, offset[i + 1] - offset[i]);
  MlaContext& g = context();
  const cudaStream_t s = g.t.stream;
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(g.t.blas, CUBLAS_PEDANTIC_MATH));
  if (r_q > 0) {
    upload_split(g, g.w_qa, g.qa_s, w.q_a_proj);  // [r_q, H]
    upload_split(g, g.w_qb, g.qb_s, w.q_b_proj);  // [nh·d_qk, r_q]
  } else {
    upload_split(g, g.w_qa, g.qa_s, w.q_proj);    // [nh·d_qk, H]
  }
  upload_split(g, g.w_kva, g.kva_s, w.kv_a_proj);  // [r_kv + rope, H]
  upload_split(g, g.w_kvb, g.kvb_s, w.kv_b_proj);  // [nh·(nope + v), r_kv]
  upload_split(g, g.w_o, g.o_s, w.o_proj);         // [H, nh·v]
  const float* in_norm = upload(g, g.in_norm, L.input_norm);
  const float* post_norm = upload(g, g.post_norm, L.post_norm);
  const float* qa_norm = r_q > 0 ? upload(g, g.qa_norm, w.q_a_norm) : nullptr;
  const float* kva_norm = upload(g, g.kva_norm, w.kv_a_norm);
  const model::RopeTables tables = mla.tables(max_T, false);  // the CPU forward's tables
  const float* cos_d = upload(g, g.cos, tables.cos);
  const float* sin_d = upload(g, g.sin, tables.sin);

  // Floats per row of the pass's activations, to size the chunk.
  const int64_t row_floats = H + std::max<int64_t>(r_q, 0) + nh * dqk * 2 + (r_kv + rope) + r_kv + rope +
                             nh * (nope + dv) + nh * dv * 2;
  const int64_t max_rows = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / sizeof(float)) / row_floats);
  for (size_t a = 0; a < S;) {
    size_t b = a + 1;  // sequences [a, b) of ≤ max_rows rows (a longer sequence alone)
    while (b < S && offset[b + 1] - offset[a] <= max_rows) ++b;
    const int64_t r0 = offset[a], n = offset[b] - r0;
    float* h = dh + r0 * H;
    std::vector<int32_t> pos;
    std::vector<int64_t> start;
    chunk_rows(offset, a, b, pos, start);
    int32_t* dpos = g.pos.get(pos.size());
    int64_t* dstart = g.start.get(start.size());
    g.t.h2d(dpos, pos.data(), sizeof(int32_t) * pos.size());
    g.t.h2d(dstart, start.data(), sizeof(int64_t) * start.size());
    float* xn = g.xn.get(static_cast<size_t>(n * H));
    float* q = g.q.get(static_cast<size_t>(n * nh * dqk));
    float* ckv = g.ckv.get(static_cast<size_t>(n * (r_kv + rope)));
    float* latent = g.latent.get(static_cast<size_t>(n * r_kv));
    float* k_pe = g.k_pe.get(static_cast<size_t>(n * rope));
    float* kv = g.kv.get(static_cast<size_t>(n * nh * (nope + dv)));
    float* k = g.k.get(static_cast<size_t>(n * nh * dqk));
    float* v = g.v.get(static_cast<size_t>(n * nh * dv));
    float* attn = g.attn.get(static_cast<size_t>(n * nh * dv));
    ops::rmsnorm({.x = h, .w = in_norm, .y = nullptr, .y_lo = nullptr, .y_f32 = xn, .n = n, .D = H,
                  .eps = spec.rms_norm_eps},
                 s);
    if (r_q > 0) {
      float* qa = g.qa.get(static_cast<size_t>(n * r_q));
      gpu::sgemm_rows_nt(g.t, g.a_s, xn, n, H, g.qa_s, r_q, qa, 0.0f);
      ops::rmsnorm({.x = qa, .w = qa_norm, .y = nullptr, .y_lo = nullptr, .y_f32 = qa, .n = n, .D = r_q,
                    .eps = model::kMlaLatentNormEps},
                   s);
      gpu::sgemm_rows_nt(g.t, g.a_s, qa, n, r_q, g.qb_s, nh * dqk, q, 0.0f);
    } else {
      gpu::sgemm_rows_nt(g.t, g.a_s, xn, n, H, g.qa_s, nh * dqk, q, 0.0f);
    }
    gpu::sgemm_rows_nt(g.t, g.a_s, xn, n, H, g.kva_s, r_kv + rope, ckv, 0.0f);
    ops::mla_split_rope_f32({.ckv = ckv, .q = q, .cos = cos_d, .sin = sin_d, .tok_pos = dpos, .latent = latent,
                             .k_pe = k_pe, .n = n, .max_len = max_T, .nh = static_cast<int>(nh),
                             .r_kv = static_cast<int>(r_kv), .nope = static_cast<int>(nope),
                             .rope = static_cast<int>(rope), .interleave = d.rope_interleave},
                            s);
    ops::rmsnorm({.x = latent, .w = kva_norm, .y = nullptr, .y_lo = nullptr, .y_f32 = latent, .n = n, .D = r_kv,
                  .eps = model::kMlaLatentNormEps},
                 s);
    gpu::sgemm_rows_nt(g.t, g.a_s, latent, n, r_kv, g.kvb_s, nh * (nope + dv), kv, 0.0f);
    ops::mla_expand_kv_f32({.kv = kv, .k_pe = k_pe, .k = k, .v = v, .n = n, .nh = static_cast<int>(nh),
                            .nope = static_cast<int>(nope), .rope = static_cast<int>(rope),
                            .v_dim = static_cast<int>(dv)},
                           s);
    ops::causal_attention_f32({.q = q, .k = k, .v = v, .row_start = dstart, .out = attn, .n = n,
                               .nh = static_cast<int>(nh), .nkv = static_cast<int>(nh), .hd = static_cast<int>(dqk),
                               .window = 0, .scale = d.softmax_scale, .hd_v = static_cast<int>(dv)},
                              s);
    gpu::sgemm_rows_nt(g.t, g.a_s, attn, n, nh * dv, g.o_s, H, h, 1.0f);  // h += o_proj(attention)
    ops::rmsnorm({.x = h, .w = post_norm, .y = nullptr, .y_lo = nullptr, .y_f32 = dX + r0 * H, .n = n, .D = H,
                  .eps = spec.rms_norm_eps},
                 s);
    a = b;
  }
}

}  // namespace moesq::compress
