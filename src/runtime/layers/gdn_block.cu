// The Gated DeltaNet block on the GPU (gdn_block_device.cuh).
#include <random>
#include <vector>

#include "core/cuda/check.cuh"
#include "ops/synth_pack/synth_pack.h"
#include "runtime/layers/gdn_block_device.cuh"

namespace moesq::runtime {

void DeviceGdnLayer::upload(const HostGdn& h) {
  input_norm.upload(h.input_norm);
  in_proj.upload(h.in_proj);
  out_proj.upload(h.out_proj);
  conv1d.upload(h.conv1d);
  dt_bias.upload(h.dt_bias);
  A_log.upload(h.A_log);
  norm.upload(h.norm);
}

void DeviceGdnLayer::synthesize(const GdnBlockDims& d, const SeedFn& next_seed, float scale, cudaStream_t stream) {
  input_norm.upload(std::vector<float>(d.H, 1.0f));
  auto draw = [&](DevBuf<uint16_t>& buf, size_t n) {
    buf.alloc(n);
    ops::SynthBf16Args a;
    a.out = buf.p, a.n = static_cast<int64_t>(n), a.seed = next_seed(), a.scale = scale;
    ops::synth_bf16(a, stream);
  };
  draw(in_proj, static_cast<size_t>(d.proj_cols() * d.H));
  draw(out_proj, static_cast<size_t>(d.H * d.value_dim()));
  std::mt19937_64 g(next_seed());
  std::uniform_real_distribution<float> u(-0.5f, 0.5f), decay(0.0f, 2.7725887f);  // A_log in [0, ln 16]
  std::vector<float> conv(static_cast<size_t>(d.conv_dim() * d.Kc)), a_log(d.nv);
  for (float& x : conv) x = u(g);
  for (float& x : a_log) x = decay(g);
  conv1d.upload(conv);
  A_log.upload(a_log);
  dt_bias.upload(std::vector<float>(d.nv, 0.0f));
  norm.upload(std::vector<float>(d.dv, 1.0f));
}

void DeviceGdnLayer::alloc_state(const GdnBlockDims& d, int slots) {
  window_per_slot = d.window_floats(), S_per_slot = d.state_floats();
  window.alloc(static_cast<size_t>(std::max<int64_t>(slots * window_per_slot, 1)));
  S.alloc(static_cast<size_t>(slots * S_per_slot));
  MOESQ_CUDA_CHECK(cudaMemset(window.p, 0, window.bytes()));
  MOESQ_CUDA_CHECK(cudaMemset(S.p, 0, S.bytes()));
}

void DeviceGdnLayer::reset(int slot, cudaStream_t stream) {
  if (slot < 0) {
    MOESQ_CUDA_CHECK(cudaMemsetAsync(window.p, 0, window.bytes(), stream));
    MOESQ_CUDA_CHECK(cudaMemsetAsync(S.p, 0, S.bytes(), stream));
    return;
  }
  if (window_per_slot > 0)
    MOESQ_CUDA_CHECK(cudaMemsetAsync(window.p + slot * window_per_slot, 0, window_per_slot * sizeof(float), stream));
  MOESQ_CUDA_CHECK(cudaMemsetAsync(S.p + slot * S_per_slot, 0, S_per_slot * sizeof(float), stream));
}

size_t DeviceGdnLayer::weight_bytes() const {
  return input_norm.bytes() + in_proj.bytes() + out_proj.bytes() + conv1d.bytes() + dt_bias.bytes() + A_log.bytes() +
         norm.bytes();
}

void gdn_block(const DeviceGdnLayer& L, const GdnCall& call, const LinearFn& linear, cudaStream_t stream,
               bool update_state, const AttentionMarks& marks) {
  ops::RmsNormArgs rn = call.norm;
  rn.w = L.input_norm.p;
  ops::rmsnorm(rn, stream);
  ops::GemmBf16Args g = call.proj;
  g.w = L.in_proj.p;
  linear(g);
  if (marks.after_qkv) MOESQ_CUDA_CHECK(cudaEventRecord(marks.after_qkv, stream));
  ops::GdnConvArgs cv = call.conv;
  cv.w = L.conv1d.p, cv.window = L.window.p, cv.update_state = update_state;
  ops::gdn_conv(cv, stream);
  ops::GdnRecurrenceArgs r = call.rec;
  r.A_log = L.A_log.p, r.dt_bias = L.dt_bias.p, r.norm = L.norm.p, r.S = L.S.p, r.update_state = update_state;
  ops::gdn_recurrence(r, stream);
  if (marks.after_attention) MOESQ_CUDA_CHECK(cudaEventRecord(marks.after_attention, stream));
  g = call.out_proj;
  g.w = L.out_proj.p;
  linear(g);
}

}  // namespace moesq::runtime
