// The attention block of one decoder layer on the GPU (attention_block.h): the layer's weights and KV
// cache on the device, and the launch sequence runtime::Engine runs per layer:
// rmsnorm → q|k|v GEMM → q/k head norm + RoPE + KV append → causal GQA attention (the layer's window
// and sinks) → o_proj (+= h) (+ its bias).
// The per-call descriptors come from the caller (AttentionCall: token slots, positions, tiles or
// split-KV partials, and whatever else the ops take); the block sets only the layer's pointers, so a
// new per-call field of an op reaches it without touching the block.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/dev_buf.cuh"
#include "ops/attention/attention.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/qk_rope/qk_rope.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "runtime/layers/attention_block.h"
#include "runtime/layers/moe_block.h"

namespace moesq::runtime {

struct DeviceAttentionLayer {
  DevBuf<float> input_norm;         // [H]
  DevBuf<float> q_norm, k_norm;     // HostAttention's (unallocated when the family has no q/k norm)
  DevBuf<float> qkv_bias;           // [(nh + 2·nkv)·hd], or unallocated
  DevBuf<uint16_t> qkv;             // [(nh + 2·nkv)·hd, H] bf16
  DevBuf<uint16_t> o;               // [H, nh·hd] bf16
  DevBuf<float> o_bias;             // [H] (gpt-oss), or unallocated
  DevBuf<float> sinks;              // [nh] attention sink logits (gpt-oss), or unallocated
  int64_t window = 0;               // > 0: this layer's sliding window (ops::AttentionArgs::window)
  DevBuf<uint16_t> k_cache, v_cache;  // [kv_blocks, 64, nkv, hd] bf16 (paged: ops/attention/kv_layout.h)

  void upload(const HostAttention& host);  // synchronous, to the current device
  // Norm weights 1, q|k|v and o_proj bf16 noise of std ≈ scale (seeds: q|k|v, then o_proj); output_gate:
  // the q heads are [query | gate] (QkRopeArgs::q_gate), twice the q rows.
  void synthesize(const io::ModelSpec& spec, const SeedFn& next_seed, float scale, cudaStream_t stream,
                  bool output_gate = false);
  void alloc_kv(size_t elements);  // k_cache and v_cache of `elements` each
  size_t weight_bytes() const;
  size_t kv_bytes() const { return k_cache.bytes() + v_cache.bytes(); }
};

// The per-call descriptors of one attention block call (every layer's the same); the block fills in
// norm.w, qkv.w, rope.{q_norm, k_norm, qkv_bias, k_cache, v_cache}, attn.{k_cache, v_cache, window,
// sinks} and o_proj.w
// (the caller sets rope.whole_qk_norm for the family).
struct AttentionCall {
  ops::RmsNormArgs norm;     // x = h [T, H] fp32 → y, y_lo [T, H] bf16
  ops::GemmBf16Args qkv;     // x, x_lo = norm.y, y_lo → y_f32 [T, (nh + 2·nkv)·hd]
  ops::QkRopeArgs rope;      // qkv → q_out, KV append
  ops::AttentionArgs attn;   // q → out, out_lo [T, nh·hd] bf16
  ops::GemmBf16Args o_proj;  // attn.out, out_lo → h (accumulate)
  // norm's outputs already hold h's rows normalized with this layer's input_norm (the previous MoE
  // block's combine ran it: moe_block's next_norm): the block starts at the q|k|v GEMM.
  bool norm_done = false;
};

// Events recorded inside the block (engine timing), or nullptr.
struct AttentionMarks {
  cudaEvent_t after_qkv = nullptr;        // after the q|k|v GEMM
  cudaEvent_t after_attention = nullptr;  // after the attention kernel
};

// One layer's block on `stream`; `linear` runs the q|k|v and o_proj GEMMs. Errors: the launchers'.
void attention_block(const DeviceAttentionLayer& L, const AttentionCall& call, const LinearFn& linear,
                     cudaStream_t stream, const AttentionMarks& marks = {});

}  // namespace moesq::runtime
