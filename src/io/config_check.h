// config.json's sizes against the tensors a checkpoint stores, before anything is allocated from those
// sizes: a config claiming 10^12 layers, a 2^40 vocabulary or 2^40 heads made the loader ask for
// terabytes (`internal error: std::bad_alloc`) and inspect loop for hours. Each check reads a tensor
// every family stores under io/tensor_names.h's names, so it is cheap and family-independent.
#pragma once
#include "io/checkpoint.h"

namespace moesq::io {

// Error naming config.json's field(s), the tensor and both shapes when they disagree:
// embed_tokens [vocab_size, hidden_size]; some tensor of the last layer must exist (num_hidden_layers); the first MoE layer's router [num_experts, hidden_size]; the first layer with
// a self_attn.k_proj: k_proj [num_key_value_heads·head_dim, hidden_size] and o_proj
// [hidden_size, num_attention_heads·head_dim].
void check_config_against_tensors(const Checkpoint& ckpt);

}  // namespace moesq::io
