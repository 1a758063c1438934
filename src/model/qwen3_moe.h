// The Qwen3-MoE family is the generic decoder (model/decoder.h) with its defaults: per-head q/k
// RMSNorm, softmax router renormalised when norm_topk_prob, no shared expert. The name stays for the
// callers that load a checkpoint of any family through it (pipeline, eval, kv_decoder, CLI).
#pragma once
#include "model/decoder.h"

namespace moesq::model {

using Qwen3Moe = DecoderModel;

}  // namespace moesq::model
