// Random top-k expert ids for MoE tests: M tokens × k distinct experts in [0, E), in a shuffled order,
// deterministic from `seed` (SplitMix64). Shared by the alignment and AWQ GEMM tests.
#pragma once
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "core/half.h"
#include "core/splitmix64.h"

namespace moesq::test {

inline std::vector<int32_t> random_topk(int64_t M, int k, int E, uint64_t seed) {
  SplitMix64 g(seed);
  std::vector<int32_t> ids;  // [M, k] row-major
  for (int64_t t = 0; t < M; ++t) {
    std::set<int32_t> row;
    while (static_cast<int>(row.size()) < k) row.insert(static_cast<int32_t>(g.below(E)));
    std::vector<int32_t> v(row.begin(), row.end());
    for (size_t i = v.size() - 1; i > 0; --i) std::swap(v[i], v[g.below(i + 1)]);
    ids.insert(ids.end(), v.begin(), v.end());
  }
  return ids;
}

// [rows, cols] fp16 bits uniform in [−1, 1), deterministic from `seed`.
inline std::vector<uint16_t> random_f16(int64_t rows, int64_t cols, uint64_t seed) {
  SplitMix64 g(seed ^ 0xf16f16ull);
  std::vector<uint16_t> v(rows * cols);
  for (auto& h : v) h = f32_to_f16(2.0f * g.uniform() - 1.0f);
  return v;
}

}  // namespace moesq::test
