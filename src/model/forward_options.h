// Per-call settings of a CPU forward (model/decoder.h, model/mixer.h): the model is immutable after
// load, and how one call runs is this struct.
#pragma once

namespace moesq::model {

// Per-call settings of a forward (the model itself is never changed to run differently).
struct ForwardOptions {
  // W4A4 deployment: NVFP4 dynamic activation quantization (format::quantize_activation_row) of the
  // expert inputs and of the SwiGLU output, act_block elements per UE4M3 scale (paper Eq. 4's Q_a).
  bool act_quant = false;
  int act_block = 32;
  // Threads inside one forward (experts, heads); 0 = moesq::num_threads(). Callers that parallelize
  // over windows or sequences pass 1.
  int threads = 0;
  // RoPE inverse frequencies rounded to bf16 (model/rope.h rope_tables): reproduces transformers run on a
  // bf16 checkpoint loaded in bf16 and upcast with .float() — how the family fixtures' references were
  // made. Off = the fp32 frequencies of the model definition (and of the Qwen3-MoE reference).
  bool rope_bf16_inv_freq = false;
  int expert_act_block() const { return act_quant ? act_block : 0; }  // swiglu_forward's act_block
};

}  // namespace moesq::model
