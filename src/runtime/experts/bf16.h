// The bf16 expert backend: dense bf16 grouped GEMMs (ops::gemm_bf16) over experts dequantized exactly
// to bf16 from any stored layout (bf16, NVFP4, paired 4:8, INT4). Non-obvious: each expert's K columns
// are stored permuted into the activation layout kKMajor, so the dispatch's permuted rows need no
// un-permutation (a dot product does not care about the order of its terms).
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/experts/expert_backend.h"

namespace moesq::runtime {

struct Bf16HostExperts : HostExperts {
  // [end − begin] experts (HostExperts): expert begin first.
  std::vector<uint16_t> gu;    // [n, 2I, H_pad] bf16 (gate rows then up rows), K in kKMajor order, 0 past H
  std::vector<uint16_t> down;  // [n, H, I_pad] bf16, K in kKMajor order, 0 past I
};

// Dense [N, K] fp32 rows → [N, K_pad] bf16 with column k stored at act_storage_index(k, kKMajor).
void permute_dense_rows(const float* w, int64_t N, int64_t K, int64_t K_pad, uint16_t* out);

}  // namespace moesq::runtime
