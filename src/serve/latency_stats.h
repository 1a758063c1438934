// Summary statistics of a serving benchmark's latencies (load_client.h), the figures vLLM's serving
// benchmark prints: mean, median and a percentile by linear interpolation between the two closest
// ranks (numpy.percentile's default, so the numbers compare with that tool's). Units are whatever
// the samples are in (the client uses milliseconds).
#pragma once
#include <vector>

namespace moesq::serve {

struct LatencySummary {
  long long count = 0;
  double mean = 0, median = 0, p99 = 0, min = 0, max = 0;  // all 0 when count == 0
};

// p in [0, 100]; the p-th percentile of `samples` (any order; NaN-free). Error: empty samples or p
// outside [0, 100].
double percentile(std::vector<double> samples, double p);
LatencySummary summarize(const std::vector<double>& samples);

}  // namespace moesq::serve
