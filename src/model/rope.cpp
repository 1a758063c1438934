// RoPE (see the header). The non-obvious decision: every step is evaluated in the precision
// transformers uses — the YaRN correction range in double (Python math), the frequencies, ramp and
// blend in fp32 (torch tensors) — so the tables match the reference's bit for bit in the common
// cases, not merely to 1e-7. The YaRN ramp is written once (yarn_blend) for both config forms.
#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/half.h"

namespace moesq::model {

namespace {

// base^(2i/dim) in fp32: torch's float arange divided by dim, then pow(float scalar, tensor). [dim/2]
std::vector<float> pos_freqs(double theta, int64_t dim) {
  std::vector<float> p(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i)
    p[i] = std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(dim));
  return p;
}

std::vector<float> default_inv_freq(const std::vector<float>& pos) {
  std::vector<float> inv(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) inv[i] = 1.0f / pos[i];
  return inv;
}

// The dim index whose wavelength fits `num_rotations` turns in `max_pos` positions (YaRN Eq. 17).
double correction_dim(double num_rotations, int64_t dim, double base, double max_pos) {
  return static_cast<double>(dim) * std::log(max_pos / (num_rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

// YaRN (Eq. 19–23): blend of 1/θ^(2i/d) (extrapolation) and 1/(s·θ^(2i/d)) (interpolation) by a
// linear ramp over the dims whose wavelength crosses β_fast..β_slow rotations in the original context.
struct YarnRamp {
  double theta, factor, beta_fast, beta_slow, original_max;
  bool truncate;
};
std::vector<float> yarn_inv_freq(const std::vector<float>& pos, int64_t dim, const YarnRamp& y) {
  double low = correction_dim(y.beta_fast, dim, y.theta, y.original_max);
  double high = correction_dim(y.beta_slow, dim, y.theta, y.original_max);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: prevent a zero-width ramp
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  const float factor_f = static_cast<float>(y.factor);
  std::vector<float> inv(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) {
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;  // 1 on high-frequency dims: keep them as trained
    const float extrapolation = 1.0f / pos[i];
    const float interpolation = 1.0f / (factor_f * pos[i]);
    inv[i] = interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  return inv;
}

}  // namespace

RopeFrequencies rope_frequencies(const io::RopeSpec& rope, int64_t dim, int64_t max_position_embeddings) {
  MOESQ_CHECK(dim > 0 && dim % 2 == 0, "rope_frequencies: rotated dims ", dim, " must be even and positive");
  const std::vector<float> pos = pos_freqs(rope.theta, dim);
  RopeFrequencies f;
  if (rope.type == "default") {
    f.inv_freq = default_inv_freq(pos);
    return f;
  }
  MOESQ_CHECK(rope.type == "yarn", "rope_frequencies: RoPE type \"", rope.type, "\" is not default or yarn");
  double factor = rope.factor;
  double original_max = static_cast<double>(max_position_embeddings);
  if (rope.original_max_position_embeddings > 0) {
    original_max = static_cast<double>(rope.original_max_position_embeddings);
    factor = static_cast<double>(max_position_embeddings) / original_max;
  }
  MOESQ_CHECK(original_max > 0, "rope_frequencies: YaRN needs max_position_embeddings");
  double attention_factor = rope.attention_factor;
  if (attention_factor < 0) {
    attention_factor = (rope.mscale != 0 && rope.mscale_all_dim != 0)
                           ? io::yarn_get_mscale(factor, rope.mscale) / io::yarn_get_mscale(factor, rope.mscale_all_dim)
                           : io::yarn_get_mscale(factor, 1.0);
  }
  f.attention_factor = static_cast<float>(attention_factor);
  f.inv_freq = yarn_inv_freq(pos, dim, {rope.theta, factor, rope.beta_fast, rope.beta_slow, original_max, rope.truncate});
  return f;
}

RopeFrequencies rope_frequencies(const io::HybridRopeSpec& r) {
  const int64_t dim = r.rotary_dim;
  MOESQ_CHECK(dim >= 2 && dim % 2 == 0, "rope: rotary_dim ", dim, " must be even and >= 2");
  const std::vector<float> pos = pos_freqs(r.theta, dim);
  RopeFrequencies f;
  f.inv_freq = r.type == io::HybridRopeType::Default
                   ? default_inv_freq(pos)
                   : yarn_inv_freq(pos, dim,
                                   {r.theta, r.factor, r.beta_fast, r.beta_slow,
                                    static_cast<double>(r.original_max_position_embeddings), r.truncate});
  if (r.inv_freq_bf16)
    for (float& v : f.inv_freq) v = round_bf16(v);
  f.attention_factor = static_cast<float>(r.attention_factor);
  return f;
}

RopeFrequencies default_rope_frequencies(double theta, int64_t hd, bool bf16_inv_freq) {
  RopeFrequencies f;
  f.inv_freq = default_inv_freq(pos_freqs(theta, hd));
  if (bf16_inv_freq)
    for (float& v : f.inv_freq) v = round_bf16(v);
  return f;
}

void rope_tables(int64_t T, const RopeFrequencies& f, std::vector<float>& cos_t, std::vector<float>& sin_t,
                 int64_t pos0) {
  const int64_t half = static_cast<int64_t>(f.inv_freq.size());
  cos_t.resize(T * half);
  sin_t.resize(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float ang = static_cast<float>(pos0 + t) * f.inv_freq[i];
      cos_t[t * half + i] = static_cast<float>(std::cos(static_cast<double>(ang))) * f.attention_factor;
      sin_t[t * half + i] = static_cast<float>(std::sin(static_cast<double>(ang))) * f.attention_factor;
    }
}

void rope_tables(int64_t T, int64_t hd, double theta, std::vector<float>& cos_t, std::vector<float>& sin_t,
                 bool bf16_inv_freq) {
  rope_tables(T, default_rope_frequencies(theta, hd, bf16_inv_freq), cos_t, sin_t);
}

// v·cos + rotate_half(v)·sin, rotate_half(v) = cat(-v[dim/2:], v[:dim/2]).
void apply_rope(float* v, int64_t dim, const float* cos_row, const float* sin_row) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cos_row[i] - b * sin_row[i];
    v[i + half] = b * cos_row[i] + a * sin_row[i];
  }
}

void deinterleave_pairs(float* v, int64_t dim) {
  thread_local std::vector<float> tmp;
  tmp.assign(v, v + dim);
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    v[i] = tmp[2 * i];
    v[half + i] = tmp[2 * i + 1];
  }
}

}  // namespace moesq::model
