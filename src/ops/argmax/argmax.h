// Launcher: the greedy next token of each logits row, argmax_v logits[i, v] with the lowest v on ties
// (runtime::Sampler's greedy choice), so a decode step need not copy [n, V] logits to the host.
// A row without any value above -inf (all -inf or NaN) gives 0. CPU twin: argmax_ref (exact: a
// comparison has no rounding, so kernel and twin agree on every input).
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct ArgmaxArgs {
  const float* logits = nullptr;  // [n, V] fp32
  int32_t* out = nullptr;         // [n] token ids
  int64_t n = 0, V = 0;
};
void argmax(const ArgmaxArgs& args, cudaStream_t stream);
void argmax_ref(const ArgmaxArgs& args);  // host pointers

}  // namespace moesq::ops
