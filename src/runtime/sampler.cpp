// runtime::Sampler (sampler.h): greedy argmax or temperature + top-p from a seeded mt19937_64.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace moesq::runtime {

void check_sampler_options(const SamplerOptions& opt) {
  MOESQ_CHECK(opt.temperature >= 0.0f && std::isfinite(opt.temperature), "--temperature: ", opt.temperature,
              " must be >= 0");
  MOESQ_CHECK(opt.top_p > 0.0f && opt.top_p <= 1.0f, "--top-p: ", opt.top_p, " must be in (0, 1]");
}

Sampler::Sampler(const SamplerOptions& opt) : opt_(opt), rng_(opt.seed) { check_sampler_options(opt); }

int32_t Sampler::next(const float* z, int64_t V) {
  if (opt_.temperature == 0.0f) return static_cast<int32_t>(std::max_element(z, z + V) - z);  // first max
  const double mx = *std::max_element(z, z + V);
  std::vector<double> p(V);
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) sum += (p[v] = std::exp((z[v] - mx) / opt_.temperature));
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  // Smallest prefix of the sorted distribution with mass >= top_p (at least one token).
  double mass = 0.0;
  int64_t keep = 0;
  while (keep < V && (keep == 0 || mass < opt_.top_p * sum)) mass += p[order[keep++]];
  const double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[order[i]];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace moesq::runtime
