// The Gated DeltaNet block of one decoder layer on the GPU (Qwen3-Next / Qwen3.5 linear_attention
// layers; model/mixers/gated_deltanet.h is the CPU mixer), host side: its shapes, one layer's weights in
// the layouts the kernels read, and gdn_block_ref, the whole block on the CPU by the ops' twins in the
// GPU's order. The device block (gdn_block_device.cuh) is, with ops/gated_deltanet:
//
//   rmsnorm(h) → [qkv | z | b | a] GEMM → gdn_conv (the slot's conv window) → gdn_recurrence (the slot's
//   S, the gated RMSNorm, bf16 hi + lo out) → out_proj (h +=).
//
// Non-obvious decisions:
//  - the four input projections are one GEMM over the same normed rows (Qwen3-Next's fused
//    in_proj_qkvz / in_proj_ba are re-laid out as the separate Qwen3.5 ones first: unfuse_qkvz_ba);
//  - the per-slot state (conv window [Kc−1, C] and S [nv, dk, dv], fp32) is the layer's "cache": its size
//    does not grow with the sequence, so it lives beside the KV blocks, one per slot, zeroed by reset(slot).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config_hybrid.h"
#include "ops/gated_deltanet/gated_deltanet.h"

namespace moesq::runtime {

// The block's shapes (io::FamilySpec's linear_* keys).
struct GdnBlockDims {
  int64_t H = 0;
  int64_t nk = 0, dk = 0, nv = 0, dv = 0, Kc = 0;
  double eps = 1e-6;  // the layer's input RMSNorm and the gated RMSNorm (rms_norm_eps)
  int64_t key_dim() const { return nk * dk; }
  int64_t value_dim() const { return nv * dv; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }     // C
  int64_t proj_cols() const { return conv_dim() + value_dim() + 2 * nv; }  // the fused GEMM's N
  int64_t window_floats() const { return conv_dim() * (Kc - 1); }       // per slot
  int64_t state_floats() const { return nv * dk * dv; }                 // S per slot
};
GdnBlockDims gdn_block_dims(const io::FamilySpec& f);

// Why the block cannot run `f`'s linear_attention layers ("" when it can): head dims or conv kernel
// outside what ops/gated_deltanet builds (naming them).
std::string gdn_block_refusal(const io::FamilySpec& f);

struct HostGdn {
  std::vector<float> input_norm;  // [H] (1 + w where the family's norms are zero-centred)
  std::vector<uint16_t> in_proj;  // [C + nv·dv + 2·nv, H] bf16: in_proj_qkv rows, then z, b, a rows
  std::vector<float> conv1d;      // [C, Kc]
  std::vector<float> dt_bias;     // [nv]
  std::vector<float> A_log;       // [nv]
  std::vector<float> norm;        // [dv] gated-RMSNorm weight (w as stored)
  std::vector<uint16_t> out_proj; // [H, nv·dv] bf16
};
// Layer `layer`'s input norm and Gated DeltaNet weights (model::family_load::load_gdn reads and checks
// them). Errors name the tensor and the directory.
HostGdn load_host_gdn(const io::Checkpoint& ckpt, const io::FamilySpec& f, int64_t layer);

// The block on the CPU as the GPU runs it (ops twins: rmsnorm_ref, gemm_bf16_ref, gdn_conv_ref,
// gdn_recurrence_ref), for tests: h [T, H] fp32 += out_proj(GDN(rmsnorm(h))) for the runs of `runs`
// (host arrays), continuing each run's slot in window [slots, C, Kc−1] and S [slots, nv, dk, dv].
void gdn_block_ref(const GdnBlockDims& d, const HostGdn& w, const ops::GdnRuns& runs, float* window, float* S,
                   int64_t T, float* h);

}  // namespace moesq::runtime
