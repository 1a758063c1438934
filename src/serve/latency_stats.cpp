// Mean / median / p99 (latency_stats.h): numpy.percentile's linear method, h = (n − 1)·p/100.
#include "serve/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace moesq::serve {

double percentile(std::vector<double> samples, double p) {
  MOESQ_CHECK(!samples.empty(), "percentile of no samples");
  MOESQ_CHECK(p >= 0 && p <= 100, "percentile ", p, " outside [0, 100]");
  std::sort(samples.begin(), samples.end());
  const double h = static_cast<double>(samples.size() - 1) * p / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, samples.size() - 1);
  return samples[lo] + (h - static_cast<double>(lo)) * (samples[hi] - samples[lo]);
}

LatencySummary summarize(const std::vector<double>& samples) {
  LatencySummary s;
  s.count = static_cast<long long>(samples.size());
  if (samples.empty()) return s;
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  s.median = percentile(samples, 50);
  s.p99 = percentile(samples, 99);
  s.min = *std::min_element(samples.begin(), samples.end());
  s.max = *std::max_element(samples.begin(), samples.end());
  return s;
}

}  // namespace moesq::serve
