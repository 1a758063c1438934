// A compressed expert: its three projections as packed NVFP4 weights (format::PackedWeight: paired
// 4:8 or dense NVFP4), in io::ExpertProj order.
// gate_proj and up_proj share one global scale γ (format::gate_up_tensor_scale, DESIGN.md §3): a
// server that fuses gate|up into one GEMM reads a single global scale, so a per-projection γ would
// silently corrupt the up outputs.
#pragma once
#include <array>
#include <string>

#include "format/packed_weight.h"

namespace moesq::compress {

struct PackedExpert {
  std::array<format::PackedWeight, 3> proj;  // gate [I, H], up [I, H], down [H, I]
};

}  // namespace moesq::compress

namespace moesq::compress {

// One expert as a one-shot baseline solver returns it (compress/jsq.h, compress/obr.h).
struct SolvedExpert {
  PackedExpert packed;
  bool fallback = false;  // no usable calibration rows: the documented fallback was used
  std::string note;       // why, when fallback
};

}  // namespace moesq::compress
