// The MLA block on the GPU (mla_block_device.cuh).
#include "core/cuda/check.cuh"
#include "ops/synth_pack/synth_pack.h"
#include "runtime/layers/mla_block_device.cuh"

namespace moesq::runtime {

void DeviceMlaLayer::upload(const HostMla& h) {
  input_norm.upload(h.input_norm);
  if (!h.q_a_norm.empty()) q_a_norm.upload(h.q_a_norm);
  kv_a_norm.upload(h.kv_a_norm);
  a_proj.upload(h.a_proj);
  if (!h.q_b.empty()) q_b.upload(h.q_b);
  w_uk_t.upload(h.w_uk_t);
  w_uv.upload(h.w_uv);
  o.upload(h.o);
}

void DeviceMlaLayer::synthesize(const MlaBlockDims& d, const SeedFn& next_seed, float scale, cudaStream_t stream) {
  input_norm.upload(std::vector<float>(d.H, 1.0f));
  if (d.r_q > 0) q_a_norm.upload(std::vector<float>(d.r_q, 1.0f));
  kv_a_norm.upload(std::vector<float>(d.r_kv, 1.0f));
  auto draw = [&](DevBuf<uint16_t>& buf, size_t n) {
    buf.alloc(n);
    ops::SynthBf16Args a;
    a.out = buf.p, a.n = static_cast<int64_t>(n), a.seed = next_seed(), a.scale = scale;
    ops::synth_bf16(a, stream);
  };
  draw(a_proj, d.a_cols() * d.H);
  if (d.r_q > 0) draw(q_b, d.nh * d.d_qk() * d.r_q);
  draw(w_uk_t, d.nh * d.r_kv * d.nope);
  draw(w_uv, d.nh * d.v * d.r_kv);
  draw(o, d.H * d.nh * d.v);
}

size_t DeviceMlaLayer::weight_bytes() const {
  return input_norm.bytes() + q_a_norm.bytes() + kv_a_norm.bytes() + a_proj.bytes() + q_b.bytes() + w_uk_t.bytes() +
         w_uv.bytes() + o.bytes();
}

void mla_block(const DeviceMlaLayer& L, const MlaCall& call, const LinearFn& linear, cudaStream_t stream,
               const AttentionMarks& marks) {
  const auto gemm = [&](ops::GemmBf16Args g, const DevBuf<uint16_t>& w) {  // the call's GEMM on this layer's w
    g.w = w.p;
    linear(g);
  };
  ops::RmsNormArgs rn = call.norm;
  rn.w = L.input_norm.p;
  ops::rmsnorm(rn, stream);
  gemm(call.a, L.a_proj);
  ops::MlaPrepArgs pr = call.prep;
  pr.q_a_norm = L.q_a_norm.p, pr.kv_a_norm = L.kv_a_norm.p, pr.kv.cache = L.cache.p;
  ops::mla_prep(pr, stream);
  if (pr.r_q > 0) gemm(call.q_b, L.q_b);
  ops::mla_q(call.q, stream);
  gemm(call.uk, L.w_uk_t);
  if (marks.after_qkv) MOESQ_CUDA_CHECK(cudaEventRecord(marks.after_qkv, stream));
  ops::MlaAttentionArgs at = call.attn;
  at.kv.cache = L.cache.p;
  ops::mla_attention(at, stream);
  if (marks.after_attention) MOESQ_CUDA_CHECK(cudaEventRecord(marks.after_attention, stream));
  gemm(call.uv, L.w_uv);
  ops::mla_heads_to_rows(call.rows, stream);
  gemm(call.o_proj, L.o);
}

}  // namespace moesq::runtime
