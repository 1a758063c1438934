// The non-obvious decision: every step is evaluated in the precision transformers uses — the
// correction range in double (Python math), the frequencies, ramp and blend in fp32 (torch tensors)
// — so the tables match the reference's bit for bit in the common cases, not merely to 1e-7.
#include "model/mixers/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace moesq::model {

namespace {

// The dim index whose wavelength fits `num_rotations` turns in `max_pos` positions (YaRN Eq. 17).
double correction_dim(double num_rotations, int64_t dim, double base, double max_pos) {
  return static_cast<double>(dim) * std::log(max_pos / (num_rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

RopeFrequencies rope_frequencies(const io::RopeSpec& rope, int64_t dim, int64_t max_position_embeddings) {
  MOESQ_CHECK(dim > 0 && dim % 2 == 0, "rope_frequencies: rotated dims ", dim, " must be even and positive");
  const int64_t half = dim / 2;
  // base^(2i/dim) in fp32: torch's float arange divided by dim, then pow(float scalar, tensor).
  std::vector<float> pos_freqs(half);
  for (int64_t i = 0; i < half; ++i)
    pos_freqs[i] = std::pow(static_cast<float>(rope.theta), static_cast<float>(2 * i) / static_cast<float>(dim));
  RopeFrequencies f;
  f.inv_freq.resize(half);
  if (rope.type == "default") {
    for (int64_t i = 0; i < half; ++i) f.inv_freq[i] = 1.0f / pos_freqs[i];
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
  double low = correction_dim(rope.beta_fast, dim, rope.theta, original_max);
  double high = correction_dim(rope.beta_slow, dim, rope.theta, original_max);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: prevent a zero-width ramp
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  const float factor_f = static_cast<float>(factor);
  for (int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;  // 1 on high-frequency dims: keep them as trained
    const float extrapolation = 1.0f / pos_freqs[i];
    const float interpolation = 1.0f / (factor_f * pos_freqs[i]);
    f.inv_freq[i] = interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  return f;
}

void rope_tables(int64_t T, const RopeFrequencies& f, std::vector<float>& cos_t, std::vector<float>& sin_t) {
  const int64_t half = static_cast<int64_t>(f.inv_freq.size());
  cos_t.resize(T * half);
  sin_t.resize(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float ang = static_cast<float>(t) * f.inv_freq[i];
      cos_t[t * half + i] = static_cast<float>(std::cos(static_cast<double>(ang))) * f.attention_factor;
      sin_t[t * half + i] = static_cast<float>(std::sin(static_cast<double>(ang))) * f.attention_factor;
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
