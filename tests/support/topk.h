// Top-k helpers of the parity tests (Qwen3-MoE and the other families): what a reference's router
// logits select, and how clearly.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

namespace moesq::test {

// Top-k ids of one row of router logits z [E], as a sorted set (descending logit = descending score
// for softmax and sigmoid routers alike; equal logits → lower id).
inline std::vector<int32_t> topk_set(const float* z, int64_t E, int64_t k) {
  std::vector<int32_t> o(E);
  std::iota(o.begin(), o.end(), 0);
  std::partial_sort(o.begin(), o.begin() + k, o.end(),
                    [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  o.resize(k);
  std::sort(o.begin(), o.end());
  return o;
}

// Gap between the k-th and (k+1)-th largest logits of a row (infinity when k = E: nothing to confuse).
inline double topk_gap(const float* z, int64_t E, int64_t k) {
  if (k >= E) return INFINITY;
  std::vector<float> v(z, z + E);
  std::sort(v.begin(), v.end(), std::greater<float>());
  return static_cast<double>(v[k - 1]) - v[k];
}

}  // namespace moesq::test
