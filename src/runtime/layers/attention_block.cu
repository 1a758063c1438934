// The attention block on the GPU (attention_block_device.cuh).
#include "core/cuda/check.cuh"
#include "ops/row_bias/row_bias.h"
#include "ops/synth_pack/synth_pack.h"
#include "runtime/layers/attention_block_device.cuh"

namespace moesq::runtime {

void DeviceAttentionLayer::upload(const HostAttention& h) {
  input_norm.upload(h.input_norm);
  if (!h.q_norm.empty()) q_norm.upload(h.q_norm), k_norm.upload(h.k_norm);
  if (!h.qkv_bias.empty()) qkv_bias.upload(h.qkv_bias);
  qkv.upload(h.qkv);
  o.upload(h.o);
  if (!h.o_bias.empty()) o_bias.upload(h.o_bias);
  if (!h.sinks.empty()) sinks.upload(h.sinks);
  window = h.window;
}

void DeviceAttentionLayer::synthesize(const io::ModelSpec& s, const SeedFn& next_seed, float scale,
                                      cudaStream_t stream, bool output_gate) {
  const int64_t H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  input_norm.upload(std::vector<float>(H, 1.0f));
  q_norm.upload(std::vector<float>(hd, 1.0f));
  k_norm.upload(std::vector<float>(hd, 1.0f));
  auto draw = [&](DevBuf<uint16_t>& d, size_t n) {
    d.alloc(n);
    ops::SynthBf16Args a;
    a.out = d.p, a.n = static_cast<int64_t>(n), a.seed = next_seed(), a.scale = scale;
    ops::synth_bf16(a, stream);
  };
  draw(qkv, ((output_gate ? 2 * nh : nh) + 2 * nkv) * hd * H);
  draw(o, H * nh * hd);
}

void DeviceAttentionLayer::alloc_kv(size_t elements) {
  k_cache.alloc(elements);
  v_cache.alloc(elements);
}

size_t DeviceAttentionLayer::weight_bytes() const {
  return input_norm.bytes() + q_norm.bytes() + k_norm.bytes() + qkv_bias.bytes() + qkv.bytes() + o.bytes() +
         o_bias.bytes() + sinks.bytes();
}

void attention_block(const DeviceAttentionLayer& L, const AttentionCall& call, const LinearFn& linear,
                     cudaStream_t stream, const AttentionMarks& marks) {
  if (!call.norm_done) {
    ops::RmsNormArgs rn = call.norm;
    rn.w = L.input_norm.p;
    ops::rmsnorm(rn, stream);
  }
  ops::GemmBf16Args g = call.qkv;
  g.w = L.qkv.p;
  linear(g);
  if (marks.after_qkv) MOESQ_CUDA_CHECK(cudaEventRecord(marks.after_qkv, stream));
  ops::QkRopeArgs qr = call.rope;
  qr.q_norm = L.q_norm.p, qr.k_norm = L.k_norm.p, qr.k_cache = L.k_cache.p, qr.v_cache = L.v_cache.p;
  qr.qkv_bias = L.qkv_bias.p;  // nullptr where the family has none
  ops::qk_rope(qr, stream);
  ops::AttentionArgs at = call.attn;
  at.k_cache = L.k_cache.p, at.v_cache = L.v_cache.p, at.window = L.window, at.sinks = L.sinks.p;
  ops::attention(at, stream);
  if (marks.after_attention) MOESQ_CUDA_CHECK(cudaEventRecord(marks.after_attention, stream));
  g = call.o_proj;
  g.w = L.o.p;
  linear(g);
  if (L.o_bias.p) {  // h += o_proj(x), then + b (the CPU adds b to o_proj(x) first: a rounding apart)
    ops::RowBiasArgs rb;
    rb.y = g.y_f32, rb.bias = L.o_bias.p, rb.rows = g.M, rb.cols = g.N;
    ops::row_bias(rb, stream);
  }
}

}  // namespace moesq::runtime
