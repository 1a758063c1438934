// The multi-head latent attention block of one decoder layer on the GPU (DeepSeek-V3, Kimi-K2 /
// K2.5: model/mixers/mla.h is the CPU mixer), host side: which specs it runs, one layer's weights in
// the layouts the kernels read, and mla_block_ref, the whole block evaluated on the CPU by the ops'
// twins in the GPU's order. The device block (mla_block_device.cuh) is, with ops/mla/mla.h:
//
//   rmsnorm(h) → [q_a | kv_a] GEMM → mla_prep (q_a norm; latent norm + k_pe RoPE → latent cache)
//   → q_b GEMM → mla_q (q_nope rows per head; rotated q_pe) → W_UKᵀ grouped GEMM (q_lat)
//   → mla_attention (latent cache) → W_UV grouped GEMM → mla_heads_to_rows → o_proj (h +=).
//
// Non-obvious decisions:
//  - the absorbed form everywhere (model/mixers/mla_decode.cpp), prefill included: one arithmetic for
//    a token whether it arrives in a prompt or a decode step, so decode = prefill bitwise and the cache
//    is the latent (r_kv + rope values per token for all heads) — the reason MLA exists;
//  - q_a_proj (or q_proj) and kv_a_proj_with_mqa are one GEMM over the same normed rows;
//  - W_UK is stored transposed per head ([nh, r_kv, nope]) so the absorption is a grouped GEMM in the
//    engine's x · Wᵀ layout; W_UV ([nh, v, r_kv]) is kv_b_proj's rows as they are.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "ops/mla/mla.h"

namespace moesq::runtime {

// Why the block cannot run `spec` ("" when it can): MLA dims outside what ops/mla builds (naming
// them), projection biases (attention_bias), zero-centred norms. Not MLA at all: says so.
std::string mla_block_refusal(const io::ModelSpec& spec);

// The block's shapes, from spec.mla.
struct MlaBlockDims {
  int64_t H = 0, nh = 0;
  int64_t r_q = 0;     // q_lora_rank (0: q_proj)
  int64_t q_cols = 0;  // the q part of the fused GEMM: r_q, or nh·d_qk without a q LoRA
  int64_t r_kv = 0, rope = 0, nope = 0, v = 0;
  bool rope_interleave = true;
  float scale = 1.0f;  // softmax scale
  double eps = 1e-6;   // the layer's input RMSNorm eps (the latent norms use model::kMlaLatentNormEps)
  int64_t d_qk() const { return nope + rope; }
  int64_t a_cols() const { return q_cols + r_kv + rope; }  // the fused [q_a | kv_a] GEMM's N
  int64_t latent_row() const { return r_kv + rope; }      // cache values per token
};
MlaBlockDims mla_block_dims(const io::ModelSpec& spec);

// The MLA RoPE tables of positions 0..max_len−1 ([max_len, rope/2] each, YaRN attention factor
// folded in: model::rope_tables of model::rope_frequencies(spec.mla.rope, …)).
void mla_rope_tables(const io::ModelSpec& spec, int64_t max_len, std::vector<float>& cos, std::vector<float>& sin);

struct HostMla {
  std::vector<float> input_norm;  // [H]
  std::vector<float> q_a_norm;    // [r_q], empty without a q LoRA
  std::vector<float> kv_a_norm;   // [r_kv]
  std::vector<uint16_t> a_proj;   // [q_cols + r_kv + rope, H] bf16: q_a_proj (or q_proj) rows, then kv_a_proj_with_mqa
  std::vector<uint16_t> q_b;      // [nh·d_qk, r_q] bf16, empty without a q LoRA
  std::vector<uint16_t> w_uk_t;   // [nh, r_kv, nope] bf16: W_UK[h]ᵀ (kv_b_proj's k rows of head h, transposed)
  std::vector<uint16_t> w_uv;     // [nh, v, r_kv] bf16: kv_b_proj's v rows of head h
  std::vector<uint16_t> o;        // [H, nh·v] bf16
};
// Layer `layer`'s input norm and MLA weights (model::load_mla_mixer reads and checks them). Errors name
// the tensor and the directory.
HostMla load_host_mla(const io::Checkpoint& ckpt, int64_t layer);

// The block on the CPU as the GPU runs it (ops twins: rmsnorm_ref, gemm_bf16_ref, mla_*_ref), for
// tests: h [T, H] fp32 += o_proj(MLA(rmsnorm(h))) for tokens at (tok_slot, tok_pos), appending their
// latent rows to `kv` (host cache) first. cos/sin: mla_rope_tables of kv.max_len positions.
void mla_block_ref(const MlaBlockDims& d, const HostMla& w, const float* cos, const float* sin,
                   const ops::MlaCacheArgs& kv, const int32_t* tok_slot, const int32_t* tok_pos, int64_t T, float* h);

}  // namespace moesq::runtime
