// Random inputs of the kernel-layout and MoE-op tests (fixed-seed std::mt19937, never zeros): paired 4:8
// tensors, bf16 token rows, and the inverse of an activation layout's K order.
#pragma once
#include <random>
#include <vector>

#include "core/half.h"
#include "format/kernel_layout.h"
#include "format/nvfp4.h"

namespace moesq::test {

inline format::Sparse48Tensor random_sparse48(int64_t N, int64_t K, std::mt19937& rng, float gamma = 0.0f) {
  std::vector<float> w(N * K);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : w) v = nd(rng);
  std::vector<uint8_t> pat(N * K / 8);
  std::uniform_int_distribution<int> pd(0, format::kNumPatterns - 1);
  for (auto& p : pat) p = static_cast<uint8_t>(pd(rng));
  return format::sparse48_quantize(w.data(), N, K, pat.data(), gamma);
}

inline std::vector<uint16_t> random_rows(int64_t T, int64_t K, std::mt19937& rng) {
  std::vector<uint16_t> x(T * K);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  return x;
}

inline constexpr format::ActLayout kActLayouts[] = {format::ActLayout::kMmaFragment, format::ActLayout::kKMajor};

// Logical-order copy of the first K columns of a row stored in `layout` (the inverse of act_storage_index).
inline std::vector<uint16_t> unpermute_row(const uint16_t* row, int64_t K, format::ActLayout layout) {
  std::vector<uint16_t> logical(K);
  for (int64_t k = 0; k < K; ++k) logical[k] = row[format::act_storage_index(k, layout)];
  return logical;
}

}  // namespace moesq::test
