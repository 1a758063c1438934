// Bitwise comparison of two packed NVFP4 weights (format::PackedWeight): kind, shape, global scale,
// every packed byte, and the dequantized values.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "format/packed_weight.h"

namespace moesq::test {

inline void expect_same_bits(const format::PackedWeight& a, const format::PackedWeight& b, const std::string& what) {
  ASSERT_EQ(a.is_sparse48(), b.is_sparse48()) << what;
  ASSERT_EQ(a.N(), b.N()) << what;
  ASSERT_EQ(a.K(), b.K()) << what;
  if (a.is_sparse48()) {
    EXPECT_EQ(a.sparse48()->values, b.sparse48()->values) << what;
    EXPECT_EQ(a.sparse48()->meta, b.sparse48()->meta) << what;
    EXPECT_EQ(a.sparse48()->scales, b.sparse48()->scales) << what;
  } else {
    EXPECT_EQ(a.nvfp4()->values, b.nvfp4()->values) << what;
    EXPECT_EQ(a.nvfp4()->scales, b.nvfp4()->scales) << what;
  }
  const float ga = a.global_scale(), gb = b.global_scale();
  EXPECT_EQ(std::memcmp(&ga, &gb, sizeof ga), 0) << what << ": global scale bits";
  const std::vector<float> x = a.dequantize(), y = b.dequantize();
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << what;
}

}  // namespace moesq::test
