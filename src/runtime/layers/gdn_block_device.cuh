// The Gated DeltaNet block of one decoder layer on the GPU (gdn_block.h): the layer's weights and its
// per-slot state (conv window and S, fp32) on the device, and the launch sequence runtime::Engine runs
// per linear_attention layer: rmsnorm → [qkv | z | b | a] GEMM → gdn_conv → gdn_recurrence →
// out_proj (+= h). The per-call descriptors come from the caller (GdnCall: the runs of the call's
// tokens per slot, the activation buffers); the block sets only the layer's pointers.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/dev_buf.cuh"
#include "ops/gated_deltanet/gated_deltanet.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "runtime/layers/attention_block_device.cuh"
#include "runtime/layers/gdn_block.h"

namespace moesq::runtime {

struct DeviceGdnLayer {
  DevBuf<float> input_norm;            // [H]
  DevBuf<uint16_t> in_proj, out_proj;  // HostGdn's, bf16
  DevBuf<float> conv1d, dt_bias, A_log, norm;
  DevBuf<float> window;                // [slots, C, Kc−1] the last Kc−1 conv inputs of each slot (0 at start)
  DevBuf<float> S;                     // [slots, nv, dk, dv] the recurrent state of each slot (0 at start)
  int64_t window_per_slot = 0, S_per_slot = 0;

  void upload(const HostGdn& host);  // synchronous, to the current device
  // Synthetic weights (`bench e2e --synthetic`): norms 1, the projections bf16 noise of std ≈ scale, a
  // small conv, decays A = exp(A_log) in [1, 16] and dt_bias 0 (seeds: in_proj, out_proj, then the rest).
  void synthesize(const GdnBlockDims& d, const SeedFn& next_seed, float scale, cudaStream_t stream);
  // The states of `slots` sequences, zeroed (synchronous).
  void alloc_state(const GdnBlockDims& d, int slots);
  // Zeroes slot `slot`'s state (every slot when slot < 0) on `stream`: a new sequence starts from 0.
  void reset(int slot, cudaStream_t stream);
  size_t weight_bytes() const;
  size_t state_bytes() const { return window.bytes() + S.bytes(); }
};

// The per-call descriptors of one Gated DeltaNet block call (every layer's the same); the block fills in
// norm.w, proj.w, conv.{w, window}, rec.{A_log, dt_bias, norm, S} and out_proj.w.
struct GdnCall {
  ops::RmsNormArgs norm;        // x = h [T, H] → y, y_lo bf16
  ops::GemmBf16Args proj;       // norm.y, y_lo → y_f32 [T, proj_cols]
  ops::GdnConvArgs conv;        // x = proj.y_f32 → out [T, C]; runs
  ops::GdnRecurrenceArgs rec;   // qkv = conv.out, z | b | a = proj.y_f32 columns → out_hi, out_lo [T, nv·dv]
  ops::GemmBf16Args out_proj;   // rec.out_hi, out_lo → h (accumulate)
};

// One layer's block on `stream`; `linear` runs the two GEMMs. update_state false: the states are read,
// not moved on (the engine's eager step before a decode-graph capture). Marks as attention_block's:
// after the projection GEMM and after the recurrence. Errors: the launchers'.
void gdn_block(const DeviceGdnLayer& L, const GdnCall& call, const LinearFn& linear, cudaStream_t stream,
               bool update_state, const AttentionMarks& marks = {});

}  // namespace moesq::runtime
