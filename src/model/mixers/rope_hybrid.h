// RoPE for the hybrid families (qwen3_next, qwen3_5_moe_text) and gpt_oss: partial rotation and
// YaRN over io::HybridRopeSpec. model/mixers/rope.h (MLA, deepseek_v3) computes the same YaRN
// frequencies over io::RopeSpec; the two were written in parallel and are to be unified.
// RoPE tables for the family mixers: default and YaRN inverse frequencies, partial rotation
// (only the first rotary_dim dims of a head turn), and the YaRN attention factor folded into cos/sin
// as transformers does (so q·k picks it up squared).
#pragma once
#include <cstdint>
#include <vector>

#include "io/config_hybrid.h"

namespace moesq::model {

// inv_freq [rotary_dim/2] in fp32, in transformers' evaluation order:
//   default: 1 / θ^(2i/d);
//   YaRN (Peng et al. 2023, Eq. 19–23): blend of 1/θ^(2i/d) (extrapolation) and 1/(s·θ^(2i/d))
//   (interpolation) by a linear ramp over the dims whose wavelength crosses β_fast..β_slow
//   rotations in the original context.
std::vector<float> rope_inv_freq(const io::HybridRopeSpec& r);

// cos/sin [T, rotary_dim/2] for positions pos0 .. pos0+T−1, each × r.attention_factor.
struct HybridRopeTables {
  int64_t half = 0;
  std::vector<float> cos, sin;
  const float* cos_row(int64_t t) const { return cos.data() + t * half; }
  const float* sin_row(int64_t t) const { return sin.data() + t * half; }
};
HybridRopeTables rope_tables(const io::HybridRopeSpec& r, int64_t pos0, int64_t T);

}  // namespace moesq::model
