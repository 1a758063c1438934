// RoPE tables (see the header). fp32 where torch computes in fp32 (inv_freq, pos · inv_freq, the
// ramp), double only for the python-float scalars (the YaRN correction range).
#include "model/mixers/rope_hybrid.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace moesq::model {

namespace {
constexpr double kPi = 3.14159265358979323846;

// Dimension index whose wavelength makes `rotations` turns over the original context
// (transformers find_correction_dim).
double correction_dim(double rotations, int64_t dim, double base, int64_t max_pos) {
  return (static_cast<double>(dim) * std::log(static_cast<double>(max_pos) / (rotations * 2.0 * kPi))) /
         (2.0 * std::log(base));
}
}  // namespace

std::vector<float> rope_inv_freq(const io::HybridRopeSpec& r) {
  const int64_t dim = r.rotary_dim, half = dim / 2;
  MOESQ_CHECK(dim >= 2 && dim % 2 == 0, "rope: rotary_dim ", dim, " must be even and >= 2");
  std::vector<float> pos_freq(half), inv(half);
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos_freq[i] = std::pow(static_cast<float>(r.theta), expo);
    inv[i] = 1.0f / pos_freq[i];
  }
  if (r.type == io::HybridRopeType::Default) return inv;
  double low = correction_dim(r.beta_fast, dim, r.theta, r.original_max_position_embeddings);
  double high = correction_dim(r.beta_slow, dim, r.theta, r.original_max_position_embeddings);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: prevent a zero-width ramp
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  const float s = static_cast<float>(r.factor);
  for (int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;  // weight of the unscaled frequency
    const float interp = 1.0f / (s * pos_freq[i]);
    inv[i] = interp * (1.0f - extrapolation) + inv[i] * extrapolation;
  }
  return inv;
}

HybridRopeTables rope_tables(const io::HybridRopeSpec& r, int64_t pos0, int64_t T) {
  std::vector<float> inv = rope_inv_freq(r);
  if (r.inv_freq_bf16)
    for (float& v : inv) v = round_bf16(v);
  HybridRopeTables t;
  t.half = static_cast<int64_t>(inv.size());
  t.cos.resize(T * t.half);
  t.sin.resize(T * t.half);
  const float af = static_cast<float>(r.attention_factor);
  for (int64_t p = 0; p < T; ++p)
    for (int64_t i = 0; i < t.half; ++i) {
      const float ang = static_cast<float>(pos0 + p) * inv[i];
      t.cos[p * t.half + i] = static_cast<float>(std::cos(static_cast<double>(ang))) * af;
      t.sin[p * t.half + i] = static_cast<float>(std::sin(static_cast<double>(ang))) * af;
    }
  return t;
}

}  // namespace moesq::model
