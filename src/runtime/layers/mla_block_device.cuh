// The MLA block of one decoder layer on the GPU (mla_block.h): the layer's weights and latent KV
// cache on the device, and the launch sequence runtime::Engine runs per MLA layer. As for the GQA
// block (attention_block_device.cuh), the per-call descriptors come from the caller (MlaCall); the
// block sets only the layer's pointers.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/dev_buf.cuh"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/mla/mla.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "runtime/layers/attention_block_device.cuh"
#include "runtime/layers/mla_block.h"
#include "runtime/layers/moe_block.h"

namespace moesq::runtime {

struct DeviceMlaLayer {
  DevBuf<float> input_norm, q_a_norm, kv_a_norm;  // HostMla's (q_a_norm unallocated without a q LoRA)
  DevBuf<uint16_t> a_proj, q_b, w_uk_t, w_uv, o;  // HostMla's layouts, bf16
  DevBuf<uint16_t> cache;                         // [kv_blocks, 64, r_kv + rope] bf16 latent rows

  void upload(const HostMla& host);  // synchronous, to the current device
  // Norm weights 1, projections bf16 noise of std ≈ scale (seeds: a_proj, q_b, w_uk_t, w_uv, o).
  void synthesize(const MlaBlockDims& d, const SeedFn& next_seed, float scale, cudaStream_t stream);
  void alloc_kv(size_t elements) { cache.alloc(elements); }
  size_t weight_bytes() const;
  size_t kv_bytes() const { return cache.bytes(); }
};

// Per-call descriptors (every MLA layer's the same); the block fills in norm.w, a.w, prep.{q_a_norm,
// kv_a_norm, kv.cache}, q_b.w, uk.w, attn.kv.cache, uv.w and o_proj.w. q_b is skipped (and mla_q reads
// the fused GEMM's output) without a q LoRA.
struct MlaCall {
  ops::RmsNormArgs norm;      // h → x, x_lo [T, H] bf16
  ops::GemmBf16Args a;        // x → a [T, a_cols] fp32
  ops::MlaPrepArgs prep;      // a → qa hi/lo [T, r_q], latent cache append
  ops::GemmBf16Args q_b;      // qa → q [T, nh·d_qk] fp32
  ops::MlaQArgs q;            // q → q_nope hi/lo [nh, T, nope], q_att[:, :, r_kv:]
  ops::GemmBf16Args uk;       // q_nope → q_att[:, :, :r_kv] (groups nh)
  ops::MlaAttentionArgs attn; // q_att → o_lat hi/lo [nh, T, r_kv]
  ops::GemmBf16Args uv;       // o_lat → o_heads [nh, T, v] fp32 (groups nh)
  ops::MlaHeadsToRowsArgs rows;  // o_heads → attn rows hi/lo [T, nh·v]
  ops::GemmBf16Args o_proj;   // attn rows → h (accumulate)
};

// One layer's block on `stream`; `linear` runs the five GEMMs. Errors: the launchers'.
void mla_block(const DeviceMlaLayer& L, const MlaCall& call, const LinearFn& linear, cudaStream_t stream,
               const AttentionMarks& marks = {});

}  // namespace moesq::runtime
