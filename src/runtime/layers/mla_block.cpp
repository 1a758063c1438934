// Host side of the MLA block (mla_block.h).
#include "runtime/layers/mla_block.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "io/tensor_names.h"
#include "model/mixers/mla_mixer.h"
#include "model/rope.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/rmsnorm/rmsnorm.h"

namespace moesq::runtime {

std::string mla_block_refusal(const io::ModelSpec& s) {
  const io::MlaSpec& m = s.mla;
  if (m.kv_lora_rank <= 0) return "its token mixer is not multi-head latent attention";
  std::string why;
  auto no = [&](bool bad, const std::string& what) {
    if (bad) why += (why.empty() ? "" : ", ") + what;
  };
  no(s.attention_bias, "its MLA projections have biases (attention_bias)");
  no(m.kv_lora_rank % 32 != 0 || m.kv_lora_rank > ops::kMlaMaxLatent,
     "its kv_lora_rank " + std::to_string(m.kv_lora_rank) + " is not a multiple of 32 up to " +
         std::to_string(ops::kMlaMaxLatent));
  no(m.qk_rope_head_dim <= 0 || m.qk_rope_head_dim % 2 != 0 || m.qk_rope_head_dim > ops::kMlaMaxRope ||
         (m.kv_lora_rank + m.qk_rope_head_dim) % 8 != 0,
     "its qk_rope_head_dim " + std::to_string(m.qk_rope_head_dim) + " is not even, at most " +
         std::to_string(ops::kMlaMaxRope) + ", with kv_lora_rank + qk_rope_head_dim a multiple of 8");
  no(m.qk_nope_head_dim <= 0 || m.qk_nope_head_dim % 8 != 0,
     "its qk_nope_head_dim " + std::to_string(m.qk_nope_head_dim) + " is not a positive multiple of 8");
  no(m.v_head_dim <= 0 || m.v_head_dim % 8 != 0, "its v_head_dim " + std::to_string(m.v_head_dim) +
                                                     " is not a positive multiple of 8");
  no(m.q_lora_rank % 8 != 0, "its q_lora_rank " + std::to_string(m.q_lora_rank) + " is not a multiple of 8");
  no(s.hidden_size % 8 != 0, "its hidden_size is not a multiple of 8");
  no(s.rms_norm_unit_offset, "its RMSNorm weights are zero-centred");
  no(s.has_sliding_window(), "it uses sliding-window attention");
  return why;
}

MlaBlockDims mla_block_dims(const io::ModelSpec& s) {
  const io::MlaSpec& m = s.mla;
  MlaBlockDims d;
  d.H = s.hidden_size, d.nh = s.num_heads;
  d.r_q = m.q_lora_rank, d.r_kv = m.kv_lora_rank, d.rope = m.qk_rope_head_dim;
  d.nope = m.qk_nope_head_dim, d.v = m.v_head_dim;
  d.q_cols = d.r_q > 0 ? d.r_q : d.nh * d.d_qk();
  d.rope_interleave = m.rope_interleave;
  d.scale = static_cast<float>(m.softmax_scale);
  d.eps = s.rms_norm_eps;
  return d;
}

void mla_rope_tables(const io::ModelSpec& s, int64_t max_len, std::vector<float>& cos, std::vector<float>& sin) {
  model::rope_tables(max_len, model::rope_frequencies(s.mla.rope, s.mla.qk_rope_head_dim, s.max_position_embeddings),
                     cos, sin);
}

HostMla load_host_mla(const io::Checkpoint& ckpt, int64_t layer) {
  const io::ModelSpec& s = ckpt.spec();
  const MlaBlockDims d = mla_block_dims(s);
  const std::unique_ptr<model::MlaMixer> mixer = model::load_mla_mixer(ckpt, layer);
  const model::MlaWeights& w = mixer->weights();
  auto append = [](std::vector<uint16_t>& dst, const std::vector<float>& v) {
    for (float f : v) dst.push_back(f32_to_bf16(f));
  };
  HostMla h;
  h.input_norm = ckpt.get_f32(io::layer_tensor(layer, io::kInputNorm), {d.H});
  h.q_a_norm = w.q_a_norm;
  h.kv_a_norm = w.kv_a_norm;
  append(h.a_proj, d.r_q > 0 ? w.q_a_proj : w.q_proj);
  append(h.a_proj, w.kv_a_proj);
  if (d.r_q > 0) append(h.q_b, w.q_b_proj);
  const int64_t kv_w = d.nope + d.v;  // kv_b_proj rows per head: nope k rows, then v rows
  h.w_uk_t.resize(d.nh * d.r_kv * d.nope);
  h.w_uv.resize(d.nh * d.v * d.r_kv);
  for (int64_t hh = 0; hh < d.nh; ++hh) {
    const float* uk = &w.kv_b_proj[hh * kv_w * d.r_kv];  // [nope, r_kv]
    for (int64_t i = 0; i < d.nope; ++i)
      for (int64_t r = 0; r < d.r_kv; ++r) h.w_uk_t[(hh * d.r_kv + r) * d.nope + i] = f32_to_bf16(uk[i * d.r_kv + r]);
    const float* uv = uk + d.nope * d.r_kv;  // [v, r_kv]
    for (int64_t j = 0; j < d.v * d.r_kv; ++j) h.w_uv[hh * d.v * d.r_kv + j] = f32_to_bf16(uv[j]);
  }
  append(h.o, w.o_proj);
  return h;
}

void mla_block_ref(const MlaBlockDims& d, const HostMla& w, const float* cos, const float* sin,
                   const ops::MlaCacheArgs& kv, const int32_t* tok_slot, const int32_t* tok_pos, int64_t T, float* h) {
  if (T == 0) return;
  const int64_t H = d.H, nh = d.nh, D = d.latent_row();
  std::vector<uint16_t> xb(T * H), xb_lo(T * H);
  ops::RmsNormArgs rn;
  rn.x = h, rn.w = w.input_norm.data(), rn.y = xb.data(), rn.y_lo = xb_lo.data(), rn.n = T, rn.D = H, rn.eps = d.eps;
  ops::rmsnorm_ref(rn);
  auto gemm = [](const uint16_t* x, const uint16_t* x_lo, const uint16_t* w_, float* y, int groups, int64_t M,
                 int64_t N, int64_t K, int64_t ldy, bool acc) {
    ops::GemmBf16Args g;
    g.x = x, g.x_lo = x_lo, g.w = w_, g.y_f32 = y, g.groups = groups, g.M = M, g.N = N, g.K = K, g.ldy = ldy;
    g.accumulate = acc;
    ops::gemm_bf16_ref(g);
  };
  std::vector<float> a(T * d.a_cols());
  gemm(xb.data(), xb_lo.data(), w.a_proj.data(), a.data(), 1, T, d.a_cols(), H, d.a_cols(), false);
  std::vector<uint16_t> qa(T * d.r_q), qa_lo(T * d.r_q);
  ops::MlaPrepArgs pa;
  pa.a = a.data(), pa.lda = d.a_cols(), pa.q_cols = d.q_cols, pa.r_q = static_cast<int>(d.r_q);
  pa.q_a_norm = w.q_a_norm.data(), pa.qa_out = qa.data(), pa.qa_out_lo = qa_lo.data();
  pa.kv_a_norm = w.kv_a_norm.data(), pa.r_kv = static_cast<int>(d.r_kv), pa.rope = static_cast<int>(d.rope);
  pa.rope_interleave = d.rope_interleave, pa.cos = cos, pa.sin = sin, pa.tok_slot = tok_slot, pa.tok_pos = tok_pos;
  pa.kv = kv, pa.T = T, pa.eps = model::kMlaLatentNormEps;
  ops::mla_prep_ref(pa);
  std::vector<float> qfull;
  const float* q = a.data();
  int64_t ldq = d.a_cols();
  if (d.r_q > 0) {
    qfull.resize(T * nh * d.d_qk());
    gemm(qa.data(), qa_lo.data(), w.q_b.data(), qfull.data(), 1, T, nh * d.d_qk(), d.r_q, nh * d.d_qk(), false);
    q = qfull.data(), ldq = nh * d.d_qk();
  }
  std::vector<uint16_t> qn(nh * T * d.nope), qn_lo(nh * T * d.nope);
  std::vector<float> q_att(nh * T * D);
  ops::MlaQArgs qa_args;
  qa_args.q = q, qa_args.ldq = ldq, qa_args.q_nope = qn.data(), qa_args.q_nope_lo = qn_lo.data();
  qa_args.q_att = q_att.data(), qa_args.nh = static_cast<int>(nh), qa_args.nope = static_cast<int>(d.nope);
  qa_args.rope = static_cast<int>(d.rope), qa_args.r_kv = static_cast<int>(d.r_kv);
  qa_args.rope_interleave = d.rope_interleave, qa_args.cos = cos, qa_args.sin = sin, qa_args.tok_pos = tok_pos;
  qa_args.max_len = kv.max_len, qa_args.T = T;
  ops::mla_q_ref(qa_args);
  gemm(qn.data(), qn_lo.data(), w.w_uk_t.data(), q_att.data(), static_cast<int>(nh), T, d.r_kv, d.nope, D, false);
  std::vector<uint16_t> ol(nh * T * d.r_kv), ol_lo(nh * T * d.r_kv);
  ops::MlaAttentionArgs at;
  at.q = q_att.data(), at.kv = kv, at.tok_slot = tok_slot, at.tok_pos = tok_pos;
  at.out = ol.data(), at.out_lo = ol_lo.data(), at.nh = static_cast<int>(nh), at.r_kv = static_cast<int>(d.r_kv);
  at.rope = static_cast<int>(d.rope), at.scale = d.scale, at.T = T;
  ops::mla_attention_ref(at);
  std::vector<float> oh(nh * T * d.v);
  gemm(ol.data(), ol_lo.data(), w.w_uv.data(), oh.data(), static_cast<int>(nh), T, d.v, d.r_kv, d.v, false);
  std::vector<uint16_t> rows(T * nh * d.v), rows_lo(T * nh * d.v);
  ops::MlaHeadsToRowsArgs hr;
  hr.x = oh.data(), hr.y = rows.data(), hr.y_lo = rows_lo.data(), hr.nh = static_cast<int>(nh);
  hr.v = static_cast<int>(d.v), hr.T = T;
  ops::mla_heads_to_rows_ref(hr);
  gemm(rows.data(), rows_lo.data(), w.o.data(), h, 1, T, H, nh * d.v, H, true);
}

}  // namespace moesq::runtime
