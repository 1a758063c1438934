// The kernel-layout transform (format/kernel_layout.h): activation storage orders, the round trip against
// the canonical decode in both metadata orders, 2.75 bits/weight, the code-word bit tricks the kernels
// rely on, zero-scale blocks, and shape errors. The GPU test checks the metadata order against hardware.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "format/fp_codecs.h"
#include "format/kernel_layout.h"
#include "format/nvfp4.h"
#include "support/ops_fixtures.h"

namespace {

using namespace moesq;
using namespace moesq::format;
using namespace moesq::test;  // support/ops_fixtures.h

TEST(KernelLayout, StorageIndexIsAPermutationOfEach32Block) {
  for (ActLayout layout : kActLayouts) {
    for (int64_t base : {0, 32, 2048}) {
      std::set<int64_t> seen;
      for (int k = 0; k < 32; ++k) {
        const int64_t s = act_storage_index(base + k, layout);
        EXPECT_GE(s, base) << act_layout_name(layout);
        EXPECT_LT(s, base + 32) << act_layout_name(layout);
        seen.insert(s);
      }
      EXPECT_EQ(seen.size(), 32u) << act_layout_name(layout) << " base " << base;
    }
  }
  EXPECT_EQ(act_storage_index(5), act_storage_index(5, ActLayout::kMmaFragment)) << "default layout";
}

// kKMajor is step 1 alone (docs/KERNEL_LAYOUT.md §1): storage position q of each group of 8 holds
// logical position [0,2,4,6,1,3,5,7][q] of that group (DESIGN.md §4); kMmaFragment is step 2 applied to it.
TEST(KernelLayout, KMajorStorageIndexIsThe48To24PermutationOnly) {
  constexpr int kOldPosOfNew[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int64_t base : {0, 32, 4096}) {
    for (int g = 0; g < 4; ++g) {
      for (int q = 0; q < 8; ++q) {
        const int64_t k = base + 8 * g + kOldPosOfNew[q];
        ASSERT_EQ(act_storage_index(k, ActLayout::kKMajor), base + 8 * g + q) << "k=" << k;
        const int c = 8 * g + q;  // mma column after step 1
        ASSERT_EQ(act_storage_index(k, ActLayout::kMmaFragment), base + 8 * ((c % 8) / 2) + 2 * (c / 8) + (c & 1))
            << "k=" << k;
      }
    }
  }
}

TEST(KernelLayout, ActLayoutNames) {
  EXPECT_STREQ(act_layout_name(ActLayout::kMmaFragment), "mma-fragment");
  EXPECT_STREQ(act_layout_name(ActLayout::kKMajor), "k-major");
  EXPECT_THROW(act_layout_name(static_cast<ActLayout>(2)), moesq::Error);
  EXPECT_THROW(act_storage_index(0, static_cast<ActLayout>(2)), moesq::Error);
}

TEST(KernelLayout, RoundTripMatchesCanonicalDecodeBothMetaOrders) {
  std::mt19937 rng(1234);
  for (int64_t M : {1, 15, 16, 17, 40}) {
    for (int64_t K : {32, 96, 256, 288}) {
      std::vector<format::Sparse48Tensor> ts;
      for (int e = 0; e < 3; ++e) ts.push_back(random_sparse48(M, K, rng));
      std::vector<const format::Sparse48Tensor*> ptrs;
      for (auto& t : ts) ptrs.push_back(&t);
      for (MetaOrder mo : {MetaOrder::kHalfK, MetaOrder::kRowSplit}) {
        const KernelWeights kw = kernel_layout_from_sparse48(ptrs, "test", mo);
        EXPECT_EQ(kw.M_pad % kMmaM, 0);
        EXPECT_EQ(kw.K_pad, padded_k(K));
        EXPECT_EQ(kw.data.size(), kw.expert_bytes() * 3);
        for (int e = 0; e < 3; ++e) {
          std::vector<float> want(M * K), got(M * K, -7.0f);
          sparse48_decode_unscaled(ts[e], want.data());
          kernel_layout_unpack_ref(kw, e, got.data());
          bool nonzero = false;
          for (int64_t i = 0; i < M * K; ++i) {
            ASSERT_EQ(got[i], want[i]) << "M=" << M << " K=" << K << " expert " << e << " first bad (m,k)=(" << i / K
                                       << "," << i % K << ")";
            nonzero |= want[i] != 0.0f;
          }
          EXPECT_TRUE(nonzero);
          EXPECT_EQ(kw.gamma[e], ts[e].global_scale);
        }
      }
    }
  }
}

TEST(KernelLayout, BytesAre275BitsPerWeightWithoutPadding) {
  std::mt19937 rng(7);
  auto t = random_sparse48(32, 512, rng);
  const KernelWeights kw = kernel_layout_from_sparse48({&t});
  EXPECT_EQ(kw.data.size(), t.values.size() + t.meta.size() + t.scales.size());
  EXPECT_DOUBLE_EQ(8.0 * kw.data.size() / (32.0 * 512.0), 2.75);
}

// The kernel's decode of register k (sparse_gemm.cu decode_a, docs/KERNEL_LAYOUT.md §2): magnitudes
// from the word shifted by kMagShift[k], signs from the word shifted by kSignShift[k] (> 0: right).
constexpr int kMagShift[4] = {0, -3, 3, -6};
constexpr int kSignShift[4] = {0, -3, -1, -2};
constexpr uint32_t kMagMask = 0x01C001C0u, kSignMask = 0x80008000u;
uint32_t shift_word(uint32_t w, int s) { return s >= 0 ? w >> s : w << -s; }
uint32_t kernel_register(uint32_t w, int k) {
  return (shift_word(w, kMagShift[k]) & kMagMask) | (shift_word(w, kSignShift[k]) & kSignMask);
}

TEST(KernelLayout, CodeBitsTileTheWord) {
  std::set<int> seen;
  for (int i = 0; i < 8; ++i)
    for (int b = 0; b < 4; ++b) {
      const int p = kernel_code_bit(i, b);
      EXPECT_TRUE(p >= 0 && p < 32) << "element " << i << " bit " << b;
      seen.insert(p);
    }
  EXPECT_EQ(seen.size(), 32u);
  EXPECT_THROW(kernel_code_bit(8, 0), moesq::Error);
}

// Every element of a random code word becomes, after its register's shift-and-mask, the bf16 bits of
// its E2M1 value × 2^-126 (code 1 = 0.5 → the bf16 subnormal 2^-127), in its half of the register.
TEST(KernelLayout, CodeWordShiftAndMaskGivesBf16TimesTwoToMinus126) {
  std::mt19937 rng(99);
  for (int rep = 0; rep < 200; ++rep) {
    uint8_t codes[8];
    uint32_t w = 0;
    for (int i = 0; i < 8; ++i) {
      codes[i] = static_cast<uint8_t>(rng() & 0xf);
      for (int b = 0; b < 4; ++b) w |= static_cast<uint32_t>((codes[i] >> b) & 1u) << kernel_code_bit(i, b);
    }
    for (int i = 0; i < 8; ++i) {
      const uint32_t reg = kernel_register(w, i >> 1);
      const uint16_t half = static_cast<uint16_t>(reg >> (16 * (i & 1)));
      const float want = std::ldexp(format::e2m1_decode(codes[i]), -126);
      ASSERT_EQ(bf16_to_f32(half), want) << "rep " << rep << " element " << i << " code " << int(codes[i]);
      ASSERT_EQ(std::signbit(bf16_to_f32(half)), (codes[i] & 8) != 0) << "element " << i << " code " << int(codes[i]);
    }
  }
}

// The kernel's UE4M3 pair → bf16x2 conversion: exact f16 of each code, packed, >> 3, + 0x73807380 equals
// bf16(scale · 2^119) in both halves for every nonzero UE4M3 code (subnormals and 448 included); code 0
// gives 2^104, which is why zero-scale blocks store code 0 (next test).
TEST(KernelLayout, Ue4m3PairViaF16ShiftIsExactBf16TimesTwoTo119) {
  for (int lo = 0; lo < 0x7f; ++lo) {
    for (int hi : {1, 0x07, 0x08, 0x38, 0x7e, (lo * 37 + 11) % 0x7e + 1}) {
      const uint32_t f = static_cast<uint32_t>(f32_to_f16(format::e4m3_decode(static_cast<uint8_t>(lo)))) |
                         static_cast<uint32_t>(f32_to_f16(format::e4m3_decode(static_cast<uint8_t>(hi)))) << 16;
      const uint32_t s2 = (f >> 3) + 0x73807380u;
      const float want_hi = std::ldexp(format::e4m3_decode(static_cast<uint8_t>(hi)), 119);
      ASSERT_EQ(bf16_to_f32(static_cast<uint16_t>(s2 >> 16)), want_hi) << "hi code " << hi << " lo " << lo;
      const float got_lo = bf16_to_f32(static_cast<uint16_t>(s2));
      if (lo == 0) ASSERT_EQ(got_lo, std::ldexp(1.0f, 104));
      else ASSERT_EQ(got_lo, std::ldexp(format::e4m3_decode(static_cast<uint8_t>(lo)), 119)) << "lo code " << lo;
    }
  }
}

TEST(KernelLayout, ZeroScaleBlocksStoreZeroCodes) {
  std::mt19937 rng(5);
  auto t = random_sparse48(16, 256, rng);
  for (auto& v : t.values) v = static_cast<uint8_t>(rng() | 0x11);  // nonzero codes everywhere
  for (size_t b = 0; b < t.scales.size(); ++b) t.scales[b] = (b % 3 == 0) ? 0 : t.scales[b];
  const KernelWeights kw = kernel_layout_from_sparse48({&t});
  std::vector<float> got(16 * 256);
  kernel_layout_unpack_ref(kw, 0, got.data());
  for (int64_t m = 0; m < 16; ++m)
    for (int64_t k = 0; k < 256; ++k)
      if (t.scales[m * 8 + k / 32] == 0) ASSERT_EQ(got[m * 256 + k], 0.0f) << "(m,k)=(" << m << "," << k << ")";
  // Every element of a zero-scale block has all four bits clear in its lane word: count the set bits
  // of the code region against the nonzero codes of the other blocks.
  size_t bits_set = 0, bits_want = 0;
  for (int i = 0; i < kChunkCodeBytes; ++i) bits_set += __builtin_popcount(kw.data[i]);
  for (int64_t m = 0; m < 16; ++m)
    for (int64_t j = 0; j < 128; ++j)
      if (t.scales[m * 8 + j / 16] != 0) bits_want += __builtin_popcount((t.values[(m * 128 + j) / 2] >> (4 * (j & 1))) & 0xf);
  EXPECT_EQ(bits_set, bits_want);
}

// The kernel expands a lane's metadata with ((word >> 4·(s & 1)) & 0x0F0F0F0F) · 0x11 (sparse_gemm.cu
// meta_of_step): byte j must be nibble j doubled, nibbles j = (row g, group 2t), (row g, 2t+1),
// (row g+8, 2t), (row g+8, 2t+1) of step s (kHalfK order, verified on the H200 by the GPU test).
TEST(KernelLayout, MetaWordExpandsByMaskAndMultiply) {
  std::mt19937 rng(17);
  const int64_t M = 16, K = 512;
  auto t = random_sparse48(M, K, rng);
  const KernelWeights kw = kernel_layout_from_sparse48({&t});
  auto canon = [&](int64_t row, int64_t grp) { return (t.meta[(row * (K / 8) + grp) / 2] >> (4 * (grp & 1))) & 0xf; };
  for (int64_t kc = 0; kc < K / kChunkK; ++kc) {
    const uint8_t* meta = kw.data.data() + kc * kChunkBytes + kChunkCodeBytes + kChunkScaleBytes;
    for (int g = 0; g < 8; ++g)
      for (int tl = 0; tl < 2; ++tl)
        for (int s = 0; s < kKStepsPerChunk; ++s) {
          uint32_t word;
          std::memcpy(&word, meta + (g * 2 + tl) * 16 + (s / 2) * 4, 4);
          const uint32_t got = ((word >> (4 * (s & 1))) & 0x0F0F0F0Fu) * 0x11u;
          const int64_t grp0 = (kc * kChunkK + s * kMmaK) / 8 + 2 * tl;
          const uint32_t nib[4] = {static_cast<uint32_t>(canon(g, grp0)), static_cast<uint32_t>(canon(g, grp0 + 1)),
                                   static_cast<uint32_t>(canon(g + 8, grp0)), static_cast<uint32_t>(canon(g + 8, grp0 + 1))};
          uint32_t want = 0;
          for (int j = 0; j < 4; ++j) want |= (nib[j] * 0x11u) << (8 * j);
          ASSERT_EQ(got, want) << "chunk " << kc << " quad " << g << " lane " << tl << " step " << s;
        }
  }
}

TEST(KernelLayout, RejectsBadShapes) {
  std::mt19937 rng(3);
  auto a = random_sparse48(16, 64, rng), b = random_sparse48(16, 96, rng);
  EXPECT_THROW(kernel_layout_from_sparse48({&a, &b}, "mixed"), moesq::Error);
  EXPECT_THROW(kernel_layout_from_sparse48({}, "none"), moesq::Error);
}

}  // namespace
