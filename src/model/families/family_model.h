// CPU forward of the hybrid families (qwen3_next, qwen3_5_moe_text), fp32 on weights decoded from
// bf16 (gpt_oss runs in the generic DecoderModel: model/mixers/sink_attention.h). One decoder skeleton — h += mixer(norm(h)); h += mlp(norm(h))
// — whose mixer is attention (mixers/attention.h) or Gated DeltaNet (mixers/gated_deltanet.h) per
// layer_types, and whose MLP is routed experts (routers/, experts/) plus an optional gated shared
// expert, or a dense SwiGLU. The tensor layouts are read by the loader in families/qwen3_next.cpp.
//
// Conventions as model/qwen3_moe.h: hidden states [T, H] of ONE sequence; routing on [n, H] rows.
#pragma once
#include <cstdint>
#include <vector>

#include "io/checkpoint.h"
#include "io/config_hybrid.h"
#include "model/experts/experts.h"
#include "model/mixers/gated_attention.h"
#include "model/mixers/gated_deltanet.h"
#include "model/qwen3_moe.h"

namespace moesq::model {

struct FamilyLayer {
  std::vector<float> input_norm, post_norm;  // [H] RMSNorm multipliers ((1 + w) for zero-centred norms)
  AttentionWeights attn;                     // full / sliding attention layers
  GdnWeights gdn;                            // linear_attention layers
  std::vector<float> router;                 // [E, H] (empty on dense layers)
  std::vector<ExpertWeights> experts;        // [E] SwiGLU experts
  ExpertWeights shared_expert;               // [Is, H] ×2, [H, Is]; empty = none
  std::vector<float> shared_expert_gate;     // [H]
  ExpertWeights dense_mlp;                   // non-MoE layers: [intermediate_size, H] ×2, [H, ·]
};

// Optional outputs of a full forward (parity tests): [L+1][T, H] (the last after the final norm),
// [L][T, E] router logits (empty on dense layers), [L] routes.
struct FamilyTrace {
  std::vector<std::vector<float>> hidden;
  std::vector<std::vector<float>> router_logits;
  std::vector<Routes> routes;
};

// Per-sequence decode state: a KV cache per attention layer, a conv + SSM state per GDN layer.
struct DecodeState {
  std::vector<KvCache> kv;    // [L] (unused on GDN layers)
  std::vector<GdnState> gdn;  // [L] (unused on attention layers)
  int64_t pos = 0;            // tokens consumed
};

// How a family checkpoint is loaded (per call).
struct FamilyLoadOptions {
  // RoPE inverse frequencies rounded to bf16 (io::HybridRopeSpec::inv_freq_bf16): matches transformers
  // run in fp32 after a bf16 round trip of the module, as the fixtures' references were. Measured on
  // tiny-qwen3.5-moe: logits max error 1.3e-1 exact vs < 1e-3 rounded (tests/model/test_qwen3_next.cpp).
  bool rope_inv_freq_bf16 = false;
};

class FamilyModel {
 public:
  // Loads a qwen3_next / qwen3_5_moe_text checkpoint; Error naming the tensor and the directory on
  // any missing tensor or wrong shape, or naming model_type for other families.
  explicit FamilyModel(const io::Checkpoint& ckpt, const FamilyLoadOptions& lo = {});

  const io::FamilySpec& family() const { return fam_; }
  const io::ModelSpec& spec() const { return fam_.base; }
  FamilyLayer& layer(int64_t l) { return layers_.at(l); }
  const FamilyLayer& layer(int64_t l) const { return layers_.at(l); }
  bool is_moe_layer(int64_t l) const { return !layers_.at(l).router.empty(); }
  AttentionShape attention_shape(int64_t l) const;
  GdnShape gdn_shape() const;

  std::vector<float> embed(const std::vector<int32_t>& tokens) const;  // [T] → [T, H]
  // h [T, H] in place: h += mixer_l(input_norm(h)). With a state, continues that sequence.
  void mixer_block(int64_t l, std::vector<float>& h, int64_t T, DecodeState* st = nullptr, int threads = 0) const;
  // Plain-loop twin of mixer_block for a fresh sequence (attention_forward_ref / gated_deltanet_forward_ref).
  void mixer_block_ref(int64_t l, std::vector<float>& h, int64_t T) const;
  std::vector<float> moe_input(int64_t l, const std::vector<float>& h, int64_t n) const;  // post-attention norm
  Routes route(int64_t l, const float* x, int64_t n) const;
  // Routed experts of layer l (weighted, combined) + the gated shared expert; dense MLP on dense
  // layers (routes ignored). x [n, H] → y [n, H].
  std::vector<float> mlp_block(int64_t l, const std::vector<float>& x, const Routes* r, int64_t n, int threads = 0) const;
  // Expert e of layer l on rows x [n, H] (the compression pipeline's per-expert forward).
  std::vector<float> expert_forward(int64_t l, int64_t e, const float* x, int64_t n) const;
  // One decoder layer on h [T, H] in place; returns its routes (empty on dense layers).
  Routes layer_forward(int64_t l, std::vector<float>& h, int64_t T, DecodeState* st = nullptr, int threads = 0) const;
  std::vector<float> final_norm(const std::vector<float>& h, int64_t T) const;
  std::vector<float> logits(const std::vector<float>& h, int64_t T) const;  // applies the final norm

  std::vector<float> forward(const std::vector<int32_t>& tokens, FamilyTrace* trace = nullptr, int threads = 0) const;
  DecodeState new_decode_state() const;
  // Appends tokens to the sequence in `st` (prefill when several) → logits [T, V] of those tokens.
  std::vector<float> decode(const std::vector<int32_t>& tokens, DecodeState& st, int threads = 0) const;
  // Mean NLL (nats) of tokens[t+1] under logits[t], t < T−1; *predicted = T − 1. T < 2: Error.
  double window_nll(const std::vector<int32_t>& tokens, int64_t* predicted = nullptr, int threads = 0) const;

  std::vector<float>& embed_weight() { return embed_; }            // [V, H]
  std::vector<float>& final_norm_weight() { return final_norm_; }  // [H] multiplier
  std::vector<float>& lm_head_weight() { return lm_head_; }        // [V, H]

 private:
  io::FamilySpec fam_;
  std::vector<float> embed_, final_norm_, lm_head_;
  std::vector<FamilyLayer> layers_;
};

// The mixer shapes of a family (shared by FamilyModel and the DecoderModel mixers, mixers/hybrid_mixer.h).
AttentionShape family_attention_shape(const io::FamilySpec& f, int64_t layer);
GdnShape family_gdn_shape(const io::FamilySpec& f);

// The loader (families/qwen3_next.cpp): fills every layer and the whole-model tensors of `m` from `ckpt`.
void load_qwen3_next_family(const io::Checkpoint& ckpt, const io::FamilySpec& f, FamilyModel& m);

}  // namespace moesq::model
