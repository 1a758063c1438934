// The DeepSeek-V3 / Kimi-K2 family (transformers' DeepseekV3ForCausalLM) on the CPU, fp32: weights
// from a checkpoint through io's name table, and the per-layer blocks a decoder steps through:
//
//   h += MLA(input_layernorm(h))                                  attention_block  (mixers/mla.h)
//   x  = post_attention_layernorm(h)                              moe_input
//   l <  first_k_dense_replace:  h += SwiGLU_dense(x)            dense_mlp
//   l >= first_k_dense_replace:  h += Σ_routed w·E_e(x) + Σ_shared S(x)
//        routes from the sigmoid grouped top-k router (routers/sigmoid_grouped_topk.h), shared
//        experts added unweighted (one SwiGLU of width I · n_shared_experts)  moe_block
//
// Hidden states are [T, H] row-major for ONE causal sequence; routing and experts act on any rows.
#pragma once
#include <cstdint>
#include <vector>

#include "io/checkpoint.h"
#include "io/config_deepseek_v3.h"
#include "model/mixers/mla.h"
#include "model/qwen3_moe.h"  // ExpertWeights, Routes, ForwardOptions
#include "model/routers/sigmoid_grouped_topk.h"

namespace moesq::model {

struct DeepseekV3Layer {
  std::vector<float> input_norm;  // [H]
  MlaWeights attn;
  std::vector<float> post_norm;  // [H]
  // MoE layers (l >= first_k_dense_replace); empty on dense layers.
  std::vector<float> router;           // [E, H]
  std::vector<float> correction_bias;  // [E] e_score_correction_bias (selection only)
  std::vector<ExpertWeights> experts;  // [E]: gate/up [I, H], down [H, I]
  ExpertWeights shared;                // gate/up [I·n_shared, H], down [H, I·n_shared]; empty if none
  // Dense layers: gate/up [intermediate_size, H], down [H, intermediate_size]; empty on MoE layers.
  ExpertWeights dense_mlp;
};

class DeepseekV3 {
 public:
  // Reads a deepseek_v3 / kimi_k2 checkpoint with bf16/f16/f32 weights. Errors name the tensor and
  // directory; FP8 (F8_E4M3 + weight_scale_inv) and compressed (.weight_packed) experts are refused
  // by name (not implemented for this family yet).
  explicit DeepseekV3(const io::Checkpoint& ckpt);
  // All weights allocated with their shapes, zero (tests and synthetic models fill them).
  explicit DeepseekV3(io::DeepseekV3Spec spec);

  const io::DeepseekV3Spec& spec() const { return spec_; }
  MlaDims mla_dims() const;
  GroupedTopkParams router_params() const;
  DeepseekV3Layer& layer(int64_t l) { return layers_.at(l); }
  const DeepseekV3Layer& layer(int64_t l) const { return layers_.at(l); }
  std::vector<float>& embed_weight() { return embed_; }          // [V, H]
  std::vector<float>& final_norm_weight() { return final_norm_; }  // [H]
  std::vector<float>& lm_head_weight() { return lm_head_; }      // [V, H]

  // tokens [T] → h [T, H]; Error for an id outside the vocabulary.
  std::vector<float> embed(const std::vector<int32_t>& tokens) const;
  // cos/sin of the rope dims for positions 0..T-1 (default or YaRN RoPE of the config).
  RopeTables rope_tables(int64_t T) const;
  // h [T, H] in place: h += MLA(input_layernorm(h)). rope: rope_tables(>= T).
  void attention_block(int64_t l, std::vector<float>& h, int64_t T, const RopeTables& rope,
                       const ForwardOptions& fo) const;
  void attention_block_ref(int64_t l, std::vector<float>& h, int64_t T, const RopeTables& rope) const;
  // post_attention_layernorm: h [n, H] → x [n, H].
  std::vector<float> moe_input(int64_t l, const std::vector<float>& h, int64_t n) const;
  // Router of a MoE layer on x [n, H] (logits = x · W_gᵀ in fp32, then grouped top-k).
  Routes route(int64_t l, const std::vector<float>& x, int64_t n) const;
  Routes route_ref(int64_t l, const std::vector<float>& x, int64_t n) const;
  // Routed experts (weighted, fo's activation quantization) + shared experts (unweighted, never
  // quantized: they stay bf16 in a compressed checkpoint): y [n, H], not added to h.
  std::vector<float> moe_block(int64_t l, const std::vector<float>& x, const Routes& r, const ForwardOptions& fo) const;
  std::vector<float> moe_block_ref(int64_t l, const std::vector<float>& x, const Routes& r,
                                   const ForwardOptions& fo) const;
  // Shared experts alone on x [n, H] → [n, H] (zeros when n_shared_experts = 0).
  std::vector<float> shared_experts(int64_t l, const std::vector<float>& x, int64_t n) const;
  // Dense SwiGLU MLP of a layer < first_k_dense_replace: x [n, H] → [n, H].
  std::vector<float> dense_mlp(int64_t l, const std::vector<float>& x, int64_t n) const;
  // h [T, H] in place: h += FFN_l(post_attention_layernorm(h)) (dense or MoE); `routes`, if given,
  // receives the routes of a MoE layer (n = 0 on a dense layer).
  void ffn_block(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo, Routes* routes = nullptr) const;
  // model.norm: h [T, H] → [T, H];  logits: h [T, H] → [T, V] (applies the final norm).
  std::vector<float> final_norm(const std::vector<float>& h, int64_t T) const;
  std::vector<float> logits(const std::vector<float>& h, int64_t T) const;

 private:
  io::DeepseekV3Spec spec_;
  std::vector<float> embed_;  // [V, H]
  std::vector<DeepseekV3Layer> layers_;
  std::vector<float> final_norm_;  // [H]
  std::vector<float> lm_head_;     // [V, H]
  void load(const io::Checkpoint& ckpt);
};

}  // namespace moesq::model
