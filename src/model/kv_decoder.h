// Incremental (KV-cached) decoding of one sequence, one token per step: what data-free calibration
// and `generate` need to sample from the model in O(T) forwards instead of O(T²). The MoE part and
// the head go through the model's own layer API, so routing and experts are the same code as the
// full forward; only the mixer keeps state: the built-in GQA attention a K/V cache here, a family
// mixer its own (Mixer::new_decode_state: MLA's latent cache, Gated DeltaNet's conv + recurrent
// state, the gated and the sink attention's K/V cache, window-trimmed on sliding layers). Tests
// check step logits against DecoderModel::forward for every family (tests/model/test_family_parity.cpp,
// tests/model/test_qwen3_next.cpp; past gpt-oss's sliding window: tests/model/test_gpt_oss.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/decoder.h"

namespace moesq::model {

class KvDecoder {
 public:
  // fo: how the layers run (act quant; fo.threads inside each step's expert pass; RoPE rounding).
  // Error naming the layer when a layer's mixer has no decode path.
  KvDecoder(const DecoderModel& m, int64_t max_len, const ForwardOptions& fo);
  // Bytes a KvDecoder(m, max_len, ·) allocates for its decode state, at its largest over max_len
  // steps: the built-in attention layers' fp32 K/V caches [max_len, nkv·hd] ×2, each family mixer's
  // Mixer::decode_state_bytes (MLA latent cache, Gated DeltaNet conv + recurrent state, window-bounded
  // K/V caches) and the RoPE tables. For a memory check before constructing one. Error: a layer's
  // mixer has no decode path.
  static int64_t cache_bytes(const DecoderModel& m, int64_t max_len);
  // Appends `token` at the next position and returns the logits for the following token, [V].
  std::vector<float> step(int32_t token);
  int64_t position() const { return pos_; }

 private:
  // h [1, H] += ffn(post_attention_layernorm(h)) of layer l (routed experts or the dense MLP).
  void ffn_step(int64_t l, std::vector<float>& h) const;

  const DecoderModel& m_;
  ForwardOptions fo_;
  int64_t max_len_, pos_ = 0;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // [L][max_len, nkv·hd] (built-in attention layers)
  std::vector<std::unique_ptr<MixerState>> mixer_state_;  // [L] (layers with a family mixer, else null)
  std::vector<float> cos_, sin_;                       // [max_len, hd/2] RoPE tables
};

}  // namespace moesq::model
