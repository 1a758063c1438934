// The DeepSeek-V3 / Kimi-K2 token mixer for the generic decoder: multi-head latent attention
// (model/mixers/mla.h) behind the model::Mixer interface, with its weights read from a checkpoint
// through io/tensor_names_deepseek_v3.h. Registered for deepseek_v3 and kimi_k2 in model/families.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/mixer.h"
#include "model/mixers/mla.h"

namespace moesq::model {

class MlaMixer final : public Mixer {
 public:
  // rope: the frequencies of the qk_rope_head_dim rotated dims (default RoPE or YaRN).
  MlaMixer(MlaDims dims, MlaWeights weights, RopeFrequencies rope);

  std::string name() const override { return "mla"; }
  // x [T, H] = input_layernorm(h) → o_proj(MLA(x)) [T, H] (positions 0..T-1).
  std::vector<float> forward(const float* x, int64_t T, const ForwardOptions& fo) const override;
  // Plain-loop twin of forward (mla_forward_ref); honours fo.rope_bf16_inv_freq like forward.
  bool has_forward_ref() const override { return true; }
  std::vector<float> forward_ref(const float* x, int64_t T, const ForwardOptions& fo) const override;
  std::vector<float> forward_ref(const float* x, int64_t T) const { return forward_ref(x, T, ForwardOptions{}); }
  // Decode through the latent KV cache (mla_decode): the state holds the cache and the RoPE tables
  // of max_len positions (fo.rope_bf16_inv_freq fixed at creation).
  std::unique_ptr<MixerState> new_decode_state(int64_t max_len, const ForwardOptions& fo) const override;
  std::vector<float> decode(const float* x, int64_t T, MixerState& state, const ForwardOptions& fo) const override;
  // max_len · (r_kv + rope) latent-cache floats plus max_len · rope RoPE-table floats (cos and sin).
  int64_t decode_state_bytes(int64_t max_len) const override;

  const MlaDims& dims() const { return dims_; }
  const MlaWeights& weights() const { return weights_; }
  MlaWeights& mutable_weights() { return weights_; }  // to fill a zero_mla_mixer's weights in place
  // The RoPE tables forward() uses for positions 0..T-1, [T, rope/2] each (compression's GPU forward
  // takes the same); bf16_inv_freq: ForwardOptions::rope_bf16_inv_freq (frequencies rounded to bf16 first).
  RopeTables tables(int64_t T, bool bf16_inv_freq) const;

 private:
  MlaDims dims_;
  MlaWeights weights_;
  RopeFrequencies rope_;
};

// The MLA dims of a spec whose config has multi-head latent attention (ModelSpec::mla, filled by
// io/config_deepseek_v3.cpp). Error: the spec has none.
MlaDims mla_dims(const io::ModelSpec& spec);
// An MlaMixer of `spec`'s dims with zero weights (RMSNorm weights too; biases if attention_bias) and
// the spec's RoPE (default or YaRN): synthetic models fill its weights (bench compress --synthetic).
std::unique_ptr<MlaMixer> zero_mla_mixer(const io::ModelSpec& spec);

// Reads layer `layer`'s MLA weights (shapes from the checkpoint's deepseek_v3 config; errors name
// the tensor, its shape and the expected one; F8_E4M3 weights are refused by name).
std::unique_ptr<MlaMixer> load_mla_mixer(const io::Checkpoint& ckpt, int64_t layer);
// The MixerFactory of the family registry (model/families.cpp).
std::unique_ptr<Mixer> make_mla_mixer(const io::Checkpoint& ckpt, const io::ModelSpec& spec, int64_t layer);

}  // namespace moesq::model
