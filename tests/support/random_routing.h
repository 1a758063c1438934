// A random MoE routing for the combine / exchange tests: distinct top-k expert ids per token, each
// expert's routes in a shuffled slot order, the routes of `drop_expert` past its first `keep` dropped
// (as a capacity limit would), and the dispatch's inverse map. Header-only; draws from the caller's
// generator in a fixed order, so a test's later draws stay reproducible.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "ops/moe_combine/moe_combine.h"

namespace moesq::test {

struct RandomRouting {
  std::vector<int32_t> ids;     // [T, k] expert of each route
  std::vector<int32_t> counts;  // [E] kept routes per expert
  std::vector<int32_t> ros;     // [E, cap] route of each slot (act_dispatch's route_of_slot), −1 past counts
  std::vector<int32_t> sor;     // [T, k] slot of each route (slot_of_route), −1: dropped
};

inline RandomRouting random_routing(int64_t T, int E, int k, int cap, std::mt19937_64& g, int drop_expert = -1,
                                    size_t keep = 0) {
  RandomRouting r;
  r.ids.resize(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    std::copy_n(perm.begin(), k, r.ids.begin() + t * k);
  }
  std::vector<std::vector<int32_t>> per(E);
  for (int64_t q = 0; q < T * k; ++q) per[r.ids[q]].push_back(static_cast<int32_t>(q));
  r.counts.assign(E, 0);
  r.ros.assign(static_cast<size_t>(E) * cap, -1);
  for (int e = 0; e < E; ++e) {
    std::shuffle(per[e].begin(), per[e].end(), g);
    if (e == drop_expert && per[e].size() > keep) per[e].resize(keep);
    r.counts[e] = static_cast<int32_t>(per[e].size());
    std::copy(per[e].begin(), per[e].end(), r.ros.begin() + static_cast<int64_t>(e) * cap);
  }
  r.sor.resize(static_cast<size_t>(T * k));
  ops::invert_route_of_slot(r.ros.data(), r.counts.data(), E, cap, T * k, r.sor.data());
  return r;
}

}  // namespace moesq::test
