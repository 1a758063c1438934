// Incremental (KV-cached) decoding of one sequence, one token per step: what data-free calibration
// needs to sample from the model in O(T) forwards instead of O(T²). The MoE part and the head go
// through Qwen3Moe's own layer API, so routing and experts are the same code as the full forward;
// only the attention keeps a cache. A test checks step logits against Qwen3Moe::forward.
#pragma once
#include <cstdint>
#include <vector>

#include "model/qwen3_moe.h"

namespace moesq::model {

class KvDecoder {
 public:
  // fo: how the MoE layers run (act quant; fo.threads inside each step's expert pass).
  KvDecoder(const Qwen3Moe& m, int64_t max_len, const ForwardOptions& fo);
  // Appends `token` at the next position and returns the logits for the following token, [V].
  std::vector<float> step(int32_t token);
  int64_t position() const { return pos_; }

 private:
  const Qwen3Moe& m_;
  ForwardOptions fo_;
  int64_t max_len_, pos_ = 0;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // [L][max_len, nkv·hd]
  std::vector<float> cos_, sin_;                       // [max_len, hd/2] RoPE tables
};

}  // namespace moesq::model
