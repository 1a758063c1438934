// io/export_layouts.h: paired 4:8 ↔ dense NVFP4 (compressed-tensors) ↔ pair-bitmask, the data-derived
// chunk mask (zero pairs → lowest-index zero bytes) and the detection rule. Every conversion keeps the
// dequantized floats bit for bit; import(export(t)) is canonical_sparse48(t), = t without zero pairs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "format/nvfp4.h"
#include "io/export_layouts.h"

namespace {

using namespace moesq;
using namespace moesq::io;

std::vector<float> gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> w(static_cast<size_t>(n));
  for (float& x : w) x = d(rng);
  return w;
}

format::Sparse48Tensor random_sparse(int64_t N, int64_t K, uint32_t seed) {
  const std::vector<float> w = gaussian(N * K, seed);
  const std::vector<uint8_t> pat = format::magnitude_patterns(w.data(), N, K);
  return format::sparse48_quantize(w.data(), N, K, pat.data());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same(const format::Sparse48Tensor& a, const format::Sparse48Tensor& b) {
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.meta, b.meta);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.global_scale, b.global_scale);
}

TEST(ExportLayouts, ChunkMaskIsNonzeroBytesThenLowestZeroBytes) {
  const uint8_t a[4] = {0, 0, 0, 0}, b[4] = {0, 0x15, 0, 0xc2}, c[4] = {0, 0, 0x80, 0}, d[4] = {1, 2, 3, 0},
                e[4] = {0, 0, 0, 0x07};
  EXPECT_EQ(chunk_pair_mask(a), 0x3);  // all zero: bytes 0 and 1
  EXPECT_EQ(chunk_pair_mask(b), 0xa);  // bytes 1 and 3
  EXPECT_EQ(chunk_pair_mask(c), 0x5);  // 0x80 (two −0 codes) is a nonzero byte; then byte 0
  EXPECT_EQ(chunk_pair_mask(e), 0x9);  // byte 3, then byte 0
  EXPECT_EQ(chunk_pair_mask(d), -1);   // three nonzero bytes: not paired 4:8
}

TEST(ExportLayouts, DenseViewDequantizesBitIdentically) {
  const format::Sparse48Tensor s = random_sparse(64, 256, 1);
  const format::Nvfp4Tensor d = to_dense_nvfp4(s);
  ASSERT_EQ(d.values.size(), 64u * 128u);
  ASSERT_EQ(d.scales.size(), 64u * 16u);
  for (size_t j = 0; j < d.scales.size(); j += 2) ASSERT_EQ(d.scales[j], d.scales[j + 1]);
  std::vector<float> a(64 * 256), b(64 * 256);
  format::sparse48_dequantize(s, a.data());
  format::nvfp4_dequantize(d, b.data());
  EXPECT_TRUE(same_bits(a, b));
}

TEST(ExportLayouts, WorkedExampleRowBytes) {
  // The FORMAT.md §4 row: values c2 15 f7 63 0f 00 21 db, meta e8 d4, scale 7e (patterns {0,2},{2,3},{0,1},{1,3}).
  format::Sparse48Tensor s;
  s.N = 1;
  s.K = 32;
  s.values = {0xc2, 0x15, 0xf7, 0x63, 0x0f, 0x00, 0x21, 0xdb};
  s.meta = {0xe8, 0xd4};
  s.scales = {0x7e};
  s.global_scale = 448.0f;
  const format::Nvfp4Tensor d = to_dense_nvfp4(s);
  const std::vector<uint8_t> want = {0xc2, 0x00, 0x15, 0x00, 0x00, 0x00, 0xf7, 0x63,
                                     0x0f, 0x00, 0x00, 0x00, 0x00, 0x21, 0x00, 0xdb};
  EXPECT_EQ(d.values, want);
  EXPECT_EQ(d.scales, (std::vector<uint8_t>{0x7e, 0x7e}));
  const PairBitmaskTensor b = to_pair_bitmask(d, "row");
  EXPECT_EQ(b.packed, s.values);
  // group 0 bytes {0,2} → 0x5; group 1 {2,3} → 0xc; group 2: pair {0,1} holds 0f 00 → nonzero byte 0 only,
  // then the lowest zero byte 1 → 0x3 (the same pairs here); group 3 {1,3} → 0xa.
  EXPECT_EQ(b.mask, (std::vector<uint8_t>{0xc5, 0xa3}));
  expect_same(pair_bitmask_to_sparse48(b, "row"), s);
}

TEST(ExportLayouts, PairBitmaskRoundTripIsIdenticalWithoutZeroPairs) {
  const format::Sparse48Tensor s = random_sparse(128, 256, 2);
  int64_t changed = -1;
  const format::Sparse48Tensor c = canonical_sparse48(s, &changed);
  const PairBitmaskTensor b = to_pair_bitmask(to_dense_nvfp4(s), "w");
  ASSERT_EQ(b.packed.size(), 128u * 64u);
  ASSERT_EQ(b.mask.size(), 128u * 16u);
  for (uint8_t m : b.mask) {
    EXPECT_EQ(__builtin_popcount(m & 0xf), 2);
    EXPECT_EQ(__builtin_popcount(m >> 4), 2);
  }
  const format::Sparse48Tensor back = pair_bitmask_to_sparse48(b, "w");
  expect_same(back, c);
  const auto det = detect_sparse48(to_dense_nvfp4(s));
  ASSERT_TRUE(det.has_value());
  expect_same(*det, c);
  if (changed == 0) expect_same(back, s);
  std::vector<float> x(128 * 256), y(128 * 256);
  format::sparse48_dequantize(s, x.data());
  format::sparse48_dequantize(back, y.data());
  EXPECT_TRUE(same_bits(x, y));
}

TEST(ExportLayouts, ZeroKeptPairMarksLowestIndexZeroBytes) {
  // Row K = 32 with amax 6 (γ = 448, scale 448): group 0 keeps pairs {1,3} by magnitude, but pair 3
  // is tiny next to the block max, so it quantizes to zero codes: the mask says bytes {0,1}.
  std::vector<float> w(32, 0.0f);
  w[2] = 6.0f;
  w[3] = 1.0f;
  w[6] = 0.01f;
  w[7] = 0.01f;  // (a tiny NEGATIVE value would encode as −0, code 8: a nonzero byte)
  for (int k = 8; k < 32; ++k) w[k] = 1.0f;
  const std::vector<uint8_t> pat = format::magnitude_patterns(w.data(), 1, 32);
  ASSERT_EQ(pat[0], 4);  // {1,3}
  const format::Sparse48Tensor s = format::sparse48_quantize(w.data(), 1, 32, pat.data());
  ASSERT_EQ(s.values[1], 0x00) << "pair 3 quantized to zero";
  const PairBitmaskTensor b = to_pair_bitmask(to_dense_nvfp4(s), "w");
  EXPECT_EQ(b.mask[0] & 0xf, 0x3);
  EXPECT_EQ(b.packed[0], 0x00);
  EXPECT_EQ(b.packed[1], s.values[0]);
  int64_t changed = 0;
  const format::Sparse48Tensor c = canonical_sparse48(s, &changed);
  EXPECT_EQ(changed, 1);
  expect_same(pair_bitmask_to_sparse48(b, "w"), c);
  std::vector<float> x(32), y(32);
  format::sparse48_dequantize(s, x.data());
  format::sparse48_dequantize(c, y.data());
  EXPECT_TRUE(same_bits(x, y));
  // Canonical is a fixed point.
  expect_same(canonical_sparse48(c), c);
}

TEST(ExportLayouts, DenseNvfp4IsNotDetectedAsPaired) {
  const std::vector<float> w = gaussian(32 * 128, 3);
  const format::Nvfp4Tensor d = format::nvfp4_quantize(w.data(), 32, 128);
  EXPECT_FALSE(detect_sparse48(d).has_value());
  EXPECT_THROW(to_pair_bitmask(d, "dense"), moesq::Error);
  // Pairwise-equal scales but three nonzero bytes in a chunk: still dense.
  format::Nvfp4Tensor e = to_dense_nvfp4(random_sparse(4, 64, 4));
  e.values[0] = e.values[1] = e.values[2] = 0x22;
  EXPECT_FALSE(detect_sparse48(e).has_value());
  try {
    to_pair_bitmask(e, "blk.w");
    FAIL();
  } catch (const moesq::Error& err) {
    EXPECT_NE(std::string(err.what()).find("blk.w: row 0 chunk 0"), std::string::npos) << err.what();
  }
}

TEST(ExportLayouts, BadMaskNibbleIsAnErrorNamingRowAndChunk) {
  PairBitmaskTensor b = to_pair_bitmask(to_dense_nvfp4(random_sparse(2, 32, 5)), "p");
  b.mask[1 * 2 + 1] = static_cast<uint8_t>((b.mask[3] & 0x0f) | 0x70);  // row 1 chunk 3: three bits
  try {
    pair_bitmask_to_sparse48(b, "p");
    FAIL();
  } catch (const moesq::Error& err) {
    EXPECT_NE(std::string(err.what()).find("row 1 chunk 3"), std::string::npos) << err.what();
  }
}

}  // namespace
