// CPU tests of the kernel-layout transform and the `_ref` twins of the Hopper expert kernels
// (moe/kernel_layout.h, moe/sparse_gemm_ref.h). The GPU kernels are checked against these refs in
// tests/gpu/test_sparse_gemm.cu and tests/gpu/test_act_layout.cu; here the refs are checked against the
// format module, and the two activation layouts (ActLayout) against each other.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "format/fp_codecs.h"
#include "format/nvfp4.h"
#include "format/kernel_layout.h"
#include "ops/common/act_batch.h"

namespace {

using namespace moesq;
using namespace moesq::moe;

// ref GEMM (fp64 sum, one fp32 rounding, α applied in fp32) vs an independent fp64 sum over the
// format module's scaled dequantization: only the fp32 roundings of α·acc and of ŵ = q·s/γ differ.
constexpr double kRefVsFormatRelTol = 1e-6;

format::Sparse48Tensor random_sparse48(int64_t N, int64_t K, std::mt19937& rng, float gamma = 0.0f) {
  std::vector<float> w(N * K);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : w) v = nd(rng);
  std::vector<uint8_t> pat(N * K / 8);
  std::uniform_int_distribution<int> pd(0, format::kNumPatterns - 1);
  for (auto& p : pat) p = static_cast<uint8_t>(pd(rng));
  return format::sparse48_quantize(w.data(), N, K, pat.data(), gamma);
}

std::vector<uint16_t> random_rows(int64_t T, int64_t K, std::mt19937& rng) {
  std::vector<uint16_t> x(T * K);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  return x;
}

constexpr ActLayout kActLayouts[] = {ActLayout::kMmaFragment, ActLayout::kKMajor};

// Logical-order copy of the first K columns of a row stored in `layout` (the inverse of act_storage_index).
std::vector<uint16_t> unpermute_row(const uint16_t* row, int64_t K, ActLayout layout) {
  std::vector<uint16_t> logical(K);
  for (int64_t k = 0; k < K; ++k) logical[k] = row[act_storage_index(k, layout)];
  return logical;
}

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
          kernel_layout_decode_ref(kw, e, got.data());
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
  kernel_layout_decode_ref(kw, 0, got.data());
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

TEST(ActQuantRef, MatchesFormatFakeQuantBitwise) {
  std::mt19937 rng(99);
  for (int64_t K : {32, 64, 768, 2048}) {
    for (int rep = 0; rep < 5; ++rep) {
      auto x = random_rows(1, K, rng);
      if (rep == 1) for (int64_t k = 0; k < 32; ++k) x[k] = f32_to_bf16(1e-30f);  // tiny block → code 0
      if (rep == 2) x[K / 2] = f32_to_bf16(3e4f);                                  // one saturating outlier
      std::vector<float> fq(K);
      float amax = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        fq[k] = bf16_to_f32(x[k]);
        amax = std::max(amax, std::fabs(fq[k]));
      }
      format::quantize_activation_row(fq.data(), K);
      const float gamma = format::nvfp4_tensor_scale(amax);
      std::vector<uint16_t> out(padded_k(K));
      float inv = 0.0f;
      act_quant_row_ref(x.data(), K, true, out.data(), &inv);
      EXPECT_EQ(inv, 1.0f / gamma);
      for (int64_t k = 0; k < K; ++k) {
        const float v = bf16_to_f32(out[act_storage_index(k)]);
        ASSERT_EQ(v / gamma, fq[k]) << "K=" << K << " rep " << rep << " k=" << k;
      }
      for (int64_t k = K; k < padded_k(K); ++k) ASSERT_EQ(out[k], 0) << "padding at " << k;
    }
  }
}

TEST(ActQuantRef, W4A16OnlyPermutes) {
  std::mt19937 rng(5);
  auto x = random_rows(1, 96, rng);
  std::vector<uint16_t> out(padded_k(96));
  float inv = 0.0f;
  act_quant_row_ref(x.data(), 96, false, out.data(), &inv);
  EXPECT_EQ(inv, 1.0f);
  for (int k = 0; k < 96; ++k) EXPECT_EQ(out[act_storage_index(k)], x[k]);
}

// Both layouts hold the same bits; only their positions differ, and the padding stays zero.
TEST(ActQuantRef, KMajorHoldsTheSameValuesAsMmaFragment) {
  std::mt19937 rng(41);
  for (bool quantize : {true, false}) {
    for (int64_t K : {32, 96, 288, 2048}) {
      auto x = random_rows(1, K, rng);
      std::vector<uint16_t> frag(padded_k(K), 0xFFFF), kmaj(padded_k(K), 0xFFFF);
      float inv_frag = 0.0f, inv_kmaj = 0.0f;
      act_quant_row_ref(x.data(), K, quantize, frag.data(), &inv_frag, ActLayout::kMmaFragment);
      act_quant_row_ref(x.data(), K, quantize, kmaj.data(), &inv_kmaj, ActLayout::kKMajor);
      EXPECT_EQ(inv_kmaj, inv_frag) << "quantize=" << quantize << " K=" << K;
      const auto want = unpermute_row(frag.data(), K, ActLayout::kMmaFragment);
      const auto got = unpermute_row(kmaj.data(), K, ActLayout::kKMajor);
      bool nonzero = false;
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_EQ(got[k], want[k]) << "quantize=" << quantize << " K=" << K << " first bad k=" << k;
        nonzero |= (got[k] & 0x7FFF) != 0;
      }
      EXPECT_TRUE(nonzero);
      if (!quantize)
        for (int64_t k = 0; k < K; ++k) ASSERT_EQ(got[k], x[k]) << "W4A16 keeps the bf16 bits, k=" << k;
      for (int64_t k = K; k < padded_k(K); ++k) ASSERT_EQ(kmaj[k], 0) << "K=" << K << " padding at " << k;
      // The two layouts really differ (K ≥ 32 always has a column that step 2 moves).
      EXPECT_NE(kmaj, frag) << "quantize=" << quantize << " K=" << K;
    }
  }
}

TEST(DispatchRef, KMajorBatchMatchesMmaFragmentBatch) {
  std::mt19937 rng(12);
  const int T = 23, topk = 2, E = 4, cap = 7;  // ~11.5 routes per expert: some are dropped
  for (int64_t K : {96, 288}) {
    auto x = random_rows(T, K, rng);
    std::vector<int32_t> ids(T * topk);
    std::uniform_int_distribution<int> ed(0, E - 1);
    for (auto& v : ids) v = ed(rng);
    const ActBatch frag = dispatch_ref(x.data(), T, K, ids.data(), topk, E, cap, true);
    const ActBatch kmaj = dispatch_ref(x.data(), T, K, ids.data(), topk, E, cap, true, ActLayout::kKMajor);
    EXPECT_EQ(frag.layout, ActLayout::kMmaFragment);
    EXPECT_EQ(kmaj.layout, ActLayout::kKMajor);
    EXPECT_EQ(kmaj.K_pad, frag.K_pad);
    EXPECT_EQ(kmaj.counts, frag.counts);
    EXPECT_EQ(kmaj.route_of_slot, frag.route_of_slot);
    EXPECT_EQ(kmaj.inv_scale, frag.inv_scale);
    ASSERT_EQ(kmaj.x.size(), frag.x.size());
    for (size_t s = 0; s < frag.route_of_slot.size(); ++s) {
      const auto want = unpermute_row(frag.x.data() + s * frag.K_pad, K, ActLayout::kMmaFragment);
      const auto got = unpermute_row(kmaj.x.data() + s * kmaj.K_pad, K, ActLayout::kKMajor);
      ASSERT_EQ(got, want) << "K=" << K << " expert " << s / cap << " slot " << s % cap;
      for (int64_t k = K; k < kmaj.K_pad; ++k) ASSERT_EQ(kmaj.x[s * kmaj.K_pad + k], 0) << "padding at " << k;
    }
  }
}

TEST(DispatchRef, CanonicalSlotsCountsAndCapacityDrops) {
  std::mt19937 rng(11);
  const int T = 37, topk = 3, E = 5, cap = 9;
  auto x = random_rows(T, 64, rng);
  std::vector<int32_t> ids(T * topk);
  std::uniform_int_distribution<int> ed(0, E - 1);
  for (auto& v : ids) v = ed(rng);
  const ActBatch a = dispatch_ref(x.data(), T, 64, ids.data(), topk, E, cap, true);
  std::vector<int> want(E, 0);
  for (int v : ids) ++want[v];
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(a.counts[e], want[e]);
    int prev = -1;
    for (int s = 0; s < std::min(want[e], cap); ++s) {
      const int r = a.route_of_slot[e * cap + s];
      EXPECT_EQ(ids[r], e);
      EXPECT_GT(r, prev) << "canonical order: ascending route id";
      prev = r;
    }
    for (int s = std::min(want[e], cap); s < cap; ++s) EXPECT_EQ(a.route_of_slot[e * cap + s], -1);
  }
}

TEST(GroupedSparseGemmRef, AgreesWithFormatDequantization) {
  std::mt19937 rng(21);
  const int E = 3, cap = 5;
  const int64_t M = 19, K = 96;
  std::vector<format::Sparse48Tensor> ts;
  for (int e = 0; e < E; ++e) ts.push_back(random_sparse48(M, K, rng));
  std::vector<const format::Sparse48Tensor*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  const int T = 6, topk = 2;
  auto x = random_rows(T, K, rng);
  std::vector<int32_t> ids = {0, 1, 0, 2, 1, 0, 0, 2, 0, 1, 0, 2};  // expert 0 gets 6 routes → 1 dropped
  const ActBatch a = dispatch_ref(x.data(), T, K, ids.data(), topk, E, cap, true);
  std::vector<float> y(E * cap * M, -1.0f);
  grouped_sparse_gemm_ref(ptrs, a, y.data());
  double err = 0.0, ref = 0.0;
  for (int e = 0; e < E; ++e) {
    std::vector<float> w(M * K);
    format::sparse48_dequantize(ts[e], w.data());
    for (int s = 0; s < std::min(a.counts[e], cap); ++s) {
      const size_t slot = e * cap + s;
      const int64_t tok = a.route_of_slot[slot] / topk;
      std::vector<float> xq(K);
      for (int64_t k = 0; k < K; ++k) xq[k] = bf16_to_f32(x[tok * K + k]);
      format::quantize_activation_row(xq.data(), K);
      for (int64_t m = 0; m < M; ++m) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(w[m * K + k]) * xq[k];
        err += (acc - y[slot * M + m]) * (acc - y[slot * M + m]);
        ref += acc * acc;
      }
    }
  }
  EXPECT_GT(ref, 0.0);
  EXPECT_LE(std::sqrt(err / ref), kRefVsFormatRelTol);
  EXPECT_EQ(y[(0 * cap + 4) * M + 0] == -1.0f, false);  // slot 4 of expert 0 written (5 kept routes)
}

// Same tokens in both layouts → bitwise the same Y, including ragged counts, a dropped route and K
// with padding; reading a k-major batch as if it were mma-fragment must change Y (the layout is read).
TEST(GroupedSparseGemmRef, BothActLayoutsGiveBitwiseTheSameY) {
  std::mt19937 rng(22);
  const int E = 3, cap = 5, T = 7, topk = 2;
  for (bool quantize : {true, false}) {
    for (int64_t K : {96, 288}) {
      const int64_t M = 17;
      std::vector<format::Sparse48Tensor> ts;
      for (int e = 0; e < E; ++e) ts.push_back(random_sparse48(M, K, rng));
      std::vector<const format::Sparse48Tensor*> ptrs;
      for (auto& t : ts) ptrs.push_back(&t);
      auto x = random_rows(T, K, rng);
      std::vector<int32_t> ids = {0, 1, 0, 2, 1, 0, 0, 2, 0, 1, 0, 1, 2, 1};  // expert 0: 6 routes → 1 dropped
      const ActBatch frag = dispatch_ref(x.data(), T, K, ids.data(), topk, E, cap, quantize);
      const ActBatch kmaj = dispatch_ref(x.data(), T, K, ids.data(), topk, E, cap, quantize, ActLayout::kKMajor);
      std::vector<float> y_frag(E * cap * M, -1.0f), y_kmaj(E * cap * M, -1.0f);
      grouped_sparse_gemm_ref(ptrs, frag, y_frag.data());
      grouped_sparse_gemm_ref(ptrs, kmaj, y_kmaj.data());
      bool nonzero = false;
      for (size_t i = 0; i < y_frag.size(); ++i) {
        ASSERT_EQ(std::memcmp(&y_kmaj[i], &y_frag[i], sizeof(float)), 0)
            << "quantize=" << quantize << " M=" << M << " K=" << K << " expert " << i / (cap * M) << " slot "
            << (i / M) % cap << " m=" << i % M << ": " << y_kmaj[i] << " vs " << y_frag[i];
        nonzero |= y_frag[i] != 0.0f && y_frag[i] != -1.0f;
      }
      EXPECT_TRUE(nonzero);
      ActBatch mislabeled = kmaj;
      mislabeled.layout = ActLayout::kMmaFragment;
      std::vector<float> y_bad(E * cap * M, -1.0f);
      grouped_sparse_gemm_ref(ptrs, mislabeled, y_bad.data());
      EXPECT_NE(y_bad, y_frag) << "quantize=" << quantize << " K=" << K;
    }
  }
}

TEST(SwigluQuantRef, KMajorHoldsTheSameValuesAsMmaFragment) {
  std::mt19937 rng(9);
  const int E = 3, cap = 4;
  for (bool quantize : {true, false}) {
    for (int64_t I : {64, 288}) {
      auto h = random_rows(E * cap, 2 * I, rng);
      const std::vector<int32_t> counts = {4, 0, 6};  // full, empty, over capacity
      const ActBatch frag = swiglu_quant_ref(h, E, cap, I, counts, quantize);
      const ActBatch kmaj = swiglu_quant_ref(h, E, cap, I, counts, quantize, ActLayout::kKMajor);
      EXPECT_EQ(kmaj.layout, ActLayout::kKMajor);
      EXPECT_EQ(kmaj.counts, frag.counts);
      EXPECT_EQ(kmaj.inv_scale, frag.inv_scale);
      int64_t nonzero = 0;
      for (size_t s = 0; s < static_cast<size_t>(E) * cap; ++s) {
        const auto want = unpermute_row(frag.x.data() + s * frag.K_pad, I, ActLayout::kMmaFragment);
        const auto got = unpermute_row(kmaj.x.data() + s * kmaj.K_pad, I, ActLayout::kKMajor);
        ASSERT_EQ(got, want) << "quantize=" << quantize << " I=" << I << " expert " << s / cap << " slot " << s % cap;
        for (uint16_t v : got) nonzero += (v & 0x7FFF) != 0;
        for (int64_t k = I; k < kmaj.K_pad; ++k) ASSERT_EQ(kmaj.x[s * kmaj.K_pad + k], 0) << "padding at " << k;
      }
      EXPECT_GT(nonzero, 0);
    }
  }
}

TEST(SwigluQuantRef, SiluTimesUpThenQuantized) {
  std::mt19937 rng(8);
  const int E = 2, cap = 3;
  const int64_t I = 64;
  auto h = random_rows(E * cap, 2 * I, rng);
  std::vector<int32_t> counts = {2, 0};
  const ActBatch a = swiglu_quant_ref(h, E, cap, I, counts, false);
  for (int s = 0; s < 2; ++s) {
    for (int64_t i = 0; i < I; ++i) {
      const float g = bf16_to_f32(h[s * 2 * I + i]), u = bf16_to_f32(h[s * 2 * I + I + i]);
      const float want = round_bf16(g / (1.0f + std::exp(-g)) * u);
      EXPECT_EQ(bf16_to_f32(a.x[s * a.K_pad + act_storage_index(i)]), want);
    }
  }
  for (int64_t k = 0; k < a.K_pad; ++k) EXPECT_EQ(a.x[2 * a.K_pad + k], 0) << "slot past count untouched";
}

}  // namespace
