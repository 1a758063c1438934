// Launchers: the embedding gather (token ids → fp32 rows of a bf16 table) and the bf16 row gather
// (the rows whose logits are wanted), the two row copies of the engine's forward. Ids and row indices
// are checked on the host by the caller (the kernels read them as given). CPU twins: embed_ref,
// gather_rows_ref; both copy exactly (bf16 → fp32 is exact), so kernel and twin agree bit for bit.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct EmbedArgs {
  const int32_t* ids = nullptr;     // [T] token ids in [0, V)
  const uint16_t* table = nullptr;  // [V, H] bf16
  float* out = nullptr;             // [T, H] fp32: out[t] = fp32(table[ids[t]])
  int64_t T = 0, H = 0;
};
void embed(const EmbedArgs& args, cudaStream_t stream);
void embed_ref(const EmbedArgs& args);  // host pointers

struct GatherRowsArgs {
  const uint16_t* in = nullptr;   // [·, H] bf16 rows
  const int32_t* rows = nullptr;  // [n] row indices into in
  uint16_t* out = nullptr;        // [n, H] bf16: out[i] = in[rows[i]]
  int64_t n = 0, H = 0;
};
void gather_rows(const GatherRowsArgs& args, cudaStream_t stream);
void gather_rows_ref(const GatherRowsArgs& args);  // host pointers

}  // namespace moesq::ops
