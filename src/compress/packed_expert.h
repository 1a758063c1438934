// A compressed expert: its three projections in either paired 4:8 NVFP4 or dense NVFP4, with the
// helpers the pipeline needs (dequantize, tensor names for export).
// gate_proj and up_proj share one global scale γ (DESIGN.md §3): a server that fuses gate|up into one
// GEMM reads a single global scale, so a per-projection γ would silently corrupt the up outputs.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "format/nvfp4.h"

namespace moesq::compress {

struct PackedProj {
  bool sparse = true;          // paired 4:8 (true) or dense NVFP4 (false)
  format::Sparse48Tensor s;    // when sparse
  format::Nvfp4Tensor d;       // when dense
  int64_t N() const { return sparse ? s.N : d.N; }
  int64_t K() const { return sparse ? s.K : d.K; }
  float global_scale() const { return sparse ? s.global_scale : d.global_scale; }
  std::vector<float> dequantize() const;  // [N, K] fp32
  size_t packed_bytes() const { return sparse ? s.packed_bytes() : d.packed_bytes(); }
};

struct PackedExpert {
  std::array<PackedProj, 3> proj;  // gate [I, H], up [I, H], down [H, I]
};

}  // namespace moesq::compress
