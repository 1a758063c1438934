// The generic MoE decoder on the CPU: fp32 math on weights decoded from bf16 (or from a compressed
// checkpoint's NVFP4 experts). Every supported family (model/families.h) is this model: a layer is a
// token mixer (built-in GQA attention or a family's Mixer), then either a routed-expert block (router
// → top-k → SwiGLU experts → weighted combine, plus an optional sigmoid-gated shared expert) or a
// dense SwiGLU MLP; the family's differences are data in io::ModelSpec and io/tensor_names. The
// layer-level entry points (embed, attention_block, route, moe_block, logits) are what the
// compression pipeline (paper Algorithm 1) steps through.
//
// Conventions: hidden states are [T, H] row-major for ONE sequence of T tokens (attention is
// per sequence, causal); routing and experts act on any [n, H] set of rows.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <memory>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/forward_options.h"
#include "model/mixer.h"
#include "model/router.h"

namespace moesq::model {

// One SwiGLU expert: y = down(silu(gate x) * up x).
struct ExpertWeights {
  std::vector<float> gate;  // [I, H]
  std::vector<float> up;    // [I, H]
  std::vector<float> down;  // [H, I]
  // Biases of a routed expert where the family has them (spec.expert_bias, gpt-oss): [I], [I], [H]
  // (y = x Wᵀ + b); empty otherwise. Never compressed (kept bf16 as stored).
  std::vector<float> gate_bias, up_bias, down_bias;
  // Static activation global scales γ_a (compressed-tensors input_activations.dynamic false: the stored
  // input_global_scale of gate|up and of down); 0 = dynamic, γ_a per token row (format::quantize_activation_row).
  float gate_up_act_scale = 0.0f, down_act_scale = 0.0f;
};

// What a routed expert computes beyond plain SwiGLU, as a view for swiglu_forward: biases after each
// projection and gpt-oss's clamped activation (core/swiglu.h clamped_swiglu). The default is plain
// SwiGLU without biases (every family but gpt-oss).
struct ExpertVariant {
  const float* gate_bias = nullptr;  // [I] or null
  const float* up_bias = nullptr;    // [I] or null
  const float* down_bias = nullptr;  // [H] or null
  bool clamped = false;
  float alpha = 1.702f, limit = 7.0f;
  float gate_up_act_scale = 0.0f, down_act_scale = 0.0f;  // static γ_a of the two inputs; 0 = dynamic
};
// The variant of expert `w` of a `spec` model (pointers into w's biases: w must outlive it).
ExpertVariant expert_variant(const io::ModelSpec& spec, const ExpertWeights& w);

struct LayerWeights {
  std::vector<float> input_norm;     // [H]
  std::vector<float> q_proj;         // [nh·hd, H]
  std::vector<float> k_proj;         // [nkv·hd, H]
  std::vector<float> v_proj;         // [nkv·hd, H]
  std::vector<float> o_proj;         // [H, nh·hd]
  // attention_bias: true → [nh·hd], [nkv·hd], [nkv·hd], [H]; empty otherwise (y = x Wᵀ + b).
  std::vector<float> q_bias, k_bias, v_bias, o_bias;
  // spec.qk_norm PerHead: [hd] each; Whole: q_norm [nh·hd], k_norm [nkv·hd]; None: empty.
  std::vector<float> q_norm;
  std::vector<float> k_norm;
  // Built-in attention only: > 0 = sliding window (query t sees keys j with t − j < window), 0 = full
  // causal; from io::ModelSpec::window_of (use_sliding_window).
  int64_t attention_window = 0;
  // A family's own token mixer (model/mixer.h); null = the built-in GQA attention over the fields above.
  std::shared_ptr<const Mixer> mixer;
  std::vector<float> post_norm;      // [H]
  std::vector<float> router;         // [E, H]
  std::vector<float> router_bias;    // [E] e_score_correction_bias (spec.router_correction_bias), else empty
  std::vector<float> router_logit_bias;  // [E] added to the router logits (spec.router_logit_bias, gpt-oss), else empty
  std::vector<ExpertWeights> experts;  // [E]
  // Shared expert of an MoE layer (spec.num_shared_experts > 0): gate/up [Is, H], down [H, Is], Is =
  // shared_expert_intermediate_size; its gate [1, H] when spec.shared_expert_gate. Kept as stored
  // (never compressed); empty otherwise.
  ExpertWeights shared_expert;
  std::vector<float> shared_expert_gate;
  // Dense SwiGLU MLP of a layer listed in mlp_only_layers (or skipped by decoder_sparse_step):
  // gate/up [intermediate_size, H], down [H, intermediate_size]; empty on MoE layers.
  ExpertWeights dense_mlp;
};

// Optional outputs of a full forward, for parity tests.
struct Trace {
  std::vector<std::vector<float>> hidden;         // [L+1][T, H] (last one after final norm)
  std::vector<std::vector<float>> router_logits;  // [L][T, E]
  std::vector<Routes> routes;                     // [L]
};

// How a checkpoint is loaded (per call, not global state).
struct LoadOptions {
  // Accept a half-compressed checkpoint (some routed-expert projections dense .weight, the rest
  // packed): each projection is read as stored. Without it that is an Error naming the first
  // mismatching tensor (io::check_expert_storage).
  bool allow_mixed = false;
  // Routed experts read per layer when asked (load_experts / release_experts) instead of all at load:
  // host memory then holds the non-expert weights plus the layers loaded at the time (a real
  // Qwen3-30B-A3B's experts are ≈ 116 GB in fp32; one layer's ≈ 2.4 GB). What `compress` uses. The
  // checkpoint must outlive the model. Applies to checkpoints whose experts are stored dense
  // (bf16/f16/f32, the sources of compression); packed experts are loaded at once regardless.
  bool experts_on_demand = false;
};

class DecoderModel {
 public:
  // Loads a checkpoint of any family in model/families.h (bf16/f32 experts, or a moesq compressed
  // checkpoint whose experts are decoded to their exact dequantized values). Errors name the tensor
  // and the directory.
  explicit DecoderModel(const io::Checkpoint& ckpt, const LoadOptions& lo = {});
  // All weights allocated with their shapes and set to zero (tests and synthetic models fill them).
  DecoderModel(io::ModelSpec spec);

  const io::ModelSpec& spec() const { return spec_; }
  LayerWeights& layer(int64_t l) { return layers_[l]; }
  const LayerWeights& layer(int64_t l) const { return layers_[l]; }

  // How the checkpoint is meant to run: W4A4 (act_quant with the weights' block size, 32 for
  // paired 4:8 experts, 16 for dense NVFP4) for a compressed checkpoint, W16A16 otherwise; threads 0.
  // Read from quantization_config on load; callers copy it and change their copy per call.
  const ForwardOptions& default_forward_options() const { return default_options_; }
  // Weight format of the routed experts: "bf16" (or the source dtype), "paired-4:8-nvfp4", "nvfp4".
  const std::string& expert_format() const { return expert_format_; }

  // Experts on demand (LoadOptions::experts_on_demand): true when the model was loaded so. Then
  // load_experts(l) reads MoE layer l's routed experts from the checkpoint (a no-op when they are
  // loaded, or when the model is not on demand: every layer is loaded then), and release_experts(l)
  // frees them (a no-op when not on demand). A forward through an unloaded layer's experts is an
  // Error naming the layer. Errors of load_experts name the tensor and the directory.
  bool experts_on_demand() const { return static_cast<bool>(load_experts_fn_); }
  void load_experts(int64_t l);
  void release_experts(int64_t l);
  bool experts_loaded(int64_t l) const;  // MoE layer l's experts are in memory (dense layers: true)

  std::vector<float>& embed_weight() { return embed_; }          // [V, H]
  std::vector<float>& final_norm_weight() { return final_norm_; }  // [H]
  std::vector<float>& lm_head_weight() { return lm_head_; }      // [V, H]
  const std::vector<float>& embed_weight() const { return embed_; }
  const std::vector<float>& final_norm_weight() const { return final_norm_; }
  const std::vector<float>& lm_head_weight() const { return lm_head_; }

  // tokens [T] → H [T, H]
  std::vector<float> embed(const std::vector<int32_t>& tokens) const;
  // h [T, H] in place: h += mixer(input_layernorm(h))  (one causal sequence; the built-in GQA
  // attention or the layer's Mixer)
  void attention_block(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo) const;
  // x = post_attention_layernorm(h): [n, H] → [n, H]
  std::vector<float> moe_input(int64_t l, const std::vector<float>& h, int64_t n) const;
  Routes route(int64_t l, const std::vector<float>& x, int64_t n) const;
  // The second half of route: the family's selection on router logits x·Wgᵀ [n, E] computed elsewhere
  // (compression's GPU path computes them on the device); route(x) = route_logits(x·Wgᵀ).
  Routes route_logits(int64_t l, std::vector<float> logits, int64_t n) const;
  // Expert e on rows x [n, H] → y [n, H] (fo.act_quant applies).
  std::vector<float> expert_forward(int64_t l, int64_t e, const float* x, int64_t n, const ForwardOptions& fo) const;
  // Plain-loop twin of expert_forward (no BLAS): the oracle of the fast path.
  std::vector<float> expert_forward_ref(int64_t l, int64_t e, const float* x, int64_t n,
                                        const ForwardOptions& fo) const;
  // Plain-loop twin of attention_block (the built-in attention's, or the layer mixer's forward_ref;
  // Error when the mixer has none).
  void attention_block_ref(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo = {}) const;
  // Dense SwiGLU MLP of a non-MoE layer: x [n, H] → y [n, H] (no activation quantization).
  // ffn_block: the layer's whole feed-forward, moe_block(route(x)) on MoE layers, dense_mlp otherwise;
  // `routes`, if given, receives the routes (left empty on a dense layer).
  std::vector<float> ffn_block(int64_t l, const std::vector<float>& x, int64_t n, const ForwardOptions& fo,
                               Routes* routes = nullptr) const;
  // The shared expert's gated output on x [n, H] (zeros [n, H] when the layer has none).
  std::vector<float> shared_expert_forward(int64_t l, const std::vector<float>& x, int64_t n) const;
  std::vector<float> dense_mlp(int64_t l, const std::vector<float>& x, int64_t n) const;
  // The MoE block's output y [n, H] (not added to h): the weighted combine of the routed experts,
  // plus sigmoid(x · w_gate) ⊙ shared_expert(x) where the family has a shared expert (unquantized).
  std::vector<float> moe_block(int64_t l, const std::vector<float>& x, const Routes& r,
                               const ForwardOptions& fo) const;
  // One whole decoder layer on h [T, H] in place: attention_block, then h += ffn_block(moe_input(h)).
  // Returns the layer's routes (empty on a dense layer). What forward runs per layer; parity tests
  // run it teacher-forced on a reference's layer input.
  Routes layer_forward(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo) const;
  // The final RMSNorm: h [T, H] → [T, H] (transformers' last hidden state).
  std::vector<float> final_norm(const std::vector<float>& h, int64_t T) const;
  // h [T, H] → logits [T, V] (applies the final norm).
  std::vector<float> logits(const std::vector<float>& h, int64_t T) const;

  // Full forward of one sequence: tokens [T] → logits [T, V].
  std::vector<float> forward(const std::vector<int32_t>& tokens, const ForwardOptions& fo,
                             Trace* trace = nullptr) const;

  // Mean negative log-likelihood (nats) over predicted tokens of one window; also returns count:
  // mean over t in [0, T-1) of -log softmax(logits[t])[tokens[t+1]]. Windows of < 2 tokens: Error.
  double window_nll(const std::vector<int32_t>& tokens, const ForwardOptions& fo, int64_t* predicted) const;

 private:
  io::ModelSpec spec_;
  std::vector<float> embed_;       // [V, H]
  std::vector<LayerWeights> layers_;
  std::vector<float> final_norm_;  // [H]
  std::vector<float> lm_head_;     // [V, H]
  ForwardOptions default_options_;
  std::string expert_format_ = "bf16";
  // Experts on demand: reads layer l's routed experts into the vector (set by the loader; empty otherwise).
  std::function<void(int64_t, std::vector<ExpertWeights>&)> load_experts_fn_;
  // The spec's shapes, with the routed experts left unallocated when !allocate_experts.
  DecoderModel(io::ModelSpec spec, bool allocate_experts);
  friend class ModelLoader;
};

// One SwiGLU expert on explicit weights: y = down(Q_a(silu(gate Q_a(x)) ⊙ up Q_a(x))), fp32 (BLAS).
// gate, up: [I, H]; down: [H, I]; x: [n, H] → y [n, H]. act_block > 0 applies NVFP4 activation
// quantization with that block (Eq. 4's Q_a, W4A4 as deployed); 0 = none. `inter`, if given,
// receives the down_proj input [n, I] (after Q_a). DecoderModel::expert_forward and the compression
// pipeline (targets Y_e, down_proj inputs, reconstruction errors) share this one path. With a variant
// (gpt-oss): g = gate Q_a(x) + b_g, u = up Q_a(x) + b_u, h = clamped_swiglu(g, u), y = down Q_a(h) + b_d.
std::vector<float> swiglu_forward(const float* gate, const float* up, const float* down, int64_t H, int64_t I,
                                  const float* x, int64_t n, int act_block, std::vector<float>* inter = nullptr,
                                  const ExpertVariant& v = {});
// Plain-loop twin of swiglu_forward (no BLAS), same arguments: the oracle of the fast path.
std::vector<float> swiglu_forward_ref(const float* gate, const float* up, const float* down, int64_t H, int64_t I,
                                      const float* x, int64_t n, int act_block, std::vector<float>* inter = nullptr,
                                      const ExpertVariant& v = {});

}  // namespace moesq::model
