// CPU tests of ops::fake_quant_ref (the GPU kernels' twin, compared bitwise in tests/gpu/test_refine_ops.cu):
// bitwise equal to format::nvfp4_fake_quant_blocks (tensor γ) and format::quantize_activation_row
// (per-row γ), to quantize→dequantize through the packers (block 16: dense NVFP4), and to a plain
// definition of the fp32 order written here from the codecs; all-zero blocks and rows, the amax output,
// a NaN or an infinity setting the nonfinite flag (x unchanged), an empty tensor and the argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "format/fp_codecs.h"
#include "format/nvfp4.h"
#include "ops/fake_quant/fake_quant.h"
#include "support/expect_error.h"

namespace {

using moesq::ops::FakeQuantArgs;
namespace format = moesq::format;

// Rows of N(0, 1) values with a per-row scale spread over 2^-6 … 2^6 and one all-zero block per row
// of two blocks or more (and row 1 all zero), so per-row and tensor γ differ and zero blocks are exercised.
std::vector<float> random_rows(int64_t rows, int64_t K, int block, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(rows * K);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(g() % 13) - 6);
    for (int64_t k = 0; k < K; ++k) x[r * K + k] = r == 1 ? 0.0f : scale * nd(g);
    if (K / block < 2) continue;  // keep a nonzero block in every row but row 1
    const int64_t zb = static_cast<int64_t>(g() % (K / block));
    for (int j = 0; j < block; ++j) x[r * K + zb * block + j] = 0.0f;
  }
  return x;
}

// The plain definition (docs/FORMAT.md, format/nvfp4.cpp's order): γ = 2688 / amax (1 for a zero
// tensor), per block c = UE4M3(γ·amax_b / 6), s = dec(c), ŵ = dec(E2M1(w·(γ/s)))·s / γ, 0 when s = 0.
float plain_gamma(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0.0f)) return 1.0f;
  const float g = 2688.0f / amax;
  return std::isfinite(g) ? g : 1.0f;
}
void plain_fake_quant(float* x, int64_t n, int block, float gamma) {
  for (int64_t b = 0; b < n; b += block) {
    float bmax = 0.0f;
    for (int j = 0; j < block; ++j) bmax = std::max(bmax, std::fabs(x[b + j]));
    const float s = format::e4m3_decode(format::ue4m3_encode(gamma * bmax / 6.0f));
    for (int j = 0; j < block; ++j)
      x[b + j] = s > 0.0f ? format::e2m1_decode(format::e2m1_encode(x[b + j] * (gamma / s))) * s / gamma : 0.0f;
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

const int64_t kShapes[][2] = {{1, 32}, {3, 64}, {5, 96}, {17, 768}, {2, 2048}, {7, 48}};  // {rows, K}

}  // namespace

TEST(FakeQuant, TensorScaleEqualsFormatFakeQuantBitwise) {
  for (const int block : {16, 32})
    for (const auto& s : kShapes) {
      const int64_t rows = s[0], K = s[1];
      if (K % block) continue;
      const auto x = random_rows(rows, K, block, 1000 * block + rows);
      auto got = x;
      float amax = -1.0f;
      int32_t nonfinite = 0;
      moesq::ops::fake_quant_ref(
          {.x = got.data(), .rows = rows, .K = K, .block = block, .per_row = false, .amax = &amax, .nonfinite = &nonfinite});
      auto lib = x;
      const float gamma = format::nvfp4_tensor_scale(format::amax_abs(x.data(), rows * K));
      format::nvfp4_fake_quant_blocks(lib.data(), rows * K, block, gamma);
      auto plain = x;
      plain_fake_quant(plain.data(), rows * K, block, plain_gamma(x.data(), rows * K));
      EXPECT_EQ(first_diff(got, lib), -1) << "vs format, block=" << block << " rows=" << rows << " K=" << K;
      EXPECT_EQ(first_diff(got, plain), -1) << "vs plain, block=" << block << " rows=" << rows << " K=" << K;
      EXPECT_EQ(amax, format::amax_abs(x.data(), rows * K));
      EXPECT_EQ(nonfinite, 0);
      int64_t nonzero = 0;
      for (float v : got) nonzero += v != 0.0f;
      EXPECT_GT(nonzero, 0);
      if (rows >= 2)
        for (int64_t k = 0; k < K; ++k) EXPECT_EQ(got[1 * K + k], 0.0f) << "the all-zero row";
    }
}

TEST(FakeQuant, PerRowEqualsActivationQuantizerBitwise) {
  for (const int block : {16, 32})
    for (const auto& s : kShapes) {
      const int64_t rows = s[0], K = s[1];
      if (K % block) continue;
      const auto x = random_rows(rows, K, block, 2000 * block + rows);
      auto got = x;
      moesq::ops::fake_quant_ref({.x = got.data(), .rows = rows, .K = K, .block = block, .per_row = true});
      auto lib = x, plain = x;
      for (int64_t r = 0; r < rows; ++r) {
        format::quantize_activation_row(lib.data() + r * K, K, block);
        plain_fake_quant(plain.data() + r * K, K, block, plain_gamma(x.data() + r * K, K));
      }
      EXPECT_EQ(first_diff(got, lib), -1) << "vs format, block=" << block << " rows=" << rows << " K=" << K;
      EXPECT_EQ(first_diff(got, plain), -1) << "vs plain, block=" << block << " rows=" << rows << " K=" << K;
      // Per-row γ is not the tensor γ: with rows at different scales the results differ.
      if (rows >= 3) {
        auto tensor = x;
        moesq::ops::fake_quant_ref({.x = tensor.data(), .rows = rows, .K = K, .block = block, .per_row = false});
        EXPECT_FALSE(same_bits(tensor, got)) << "block=" << block << " rows=" << rows << " K=" << K;
      }
    }
}

// Block 16 with a tensor γ is dense NVFP4: nvfp4_quantize → nvfp4_dequantize gives the same bits.
TEST(FakeQuant, Block16IsDenseNvfp4QuantizeDequantize) {
  const int64_t N = 9, K = 160;
  const auto x = random_rows(N, K, 16, 77);
  auto got = x;
  moesq::ops::fake_quant_ref({.x = got.data(), .rows = N, .K = K, .block = 16, .per_row = false});
  const format::Nvfp4Tensor t = format::nvfp4_quantize(x.data(), N, K);
  std::vector<float> deq(N * K);
  format::nvfp4_dequantize(t, deq.data());
  EXPECT_EQ(first_diff(got, deq), -1);
}

// Values already on the grid (E2M1 codes × a power of two, with a 6 in every block) are a fixed point.
TEST(FakeQuant, GridValuesAreAFixedPoint) {
  const float e2m1[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const int64_t rows = 4, K = 64;
  std::vector<float> x(rows * K);
  for (int64_t i = 0; i < rows * K; ++i) x[i] = (i % 32 == 0 ? 6.0f : e2m1[i * 7 % 8]) * (i % 3 == 0 ? -1.0f : 1.0f);
  for (const bool per_row : {false, true}) {
    auto got = x;
    moesq::ops::fake_quant_ref({.x = got.data(), .rows = rows, .K = K, .block = 32, .per_row = per_row});
    EXPECT_EQ(first_diff(got, x), -1) << "per_row=" << per_row;
  }
}

TEST(FakeQuant, NonFiniteSetsTheFlagAndLeavesXUnchanged) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()})
    for (const bool per_row : {false, true}) {
      auto x = random_rows(3, 64, 32, 5);
      x[2 * 64 + 17] = bad;
      auto got = x;
      int32_t flag = 0;
      moesq::ops::fake_quant_ref(
          {.x = got.data(), .rows = 3, .K = 64, .block = 32, .per_row = per_row, .nonfinite = &flag});
      EXPECT_EQ(flag, 1) << "value " << bad << " per_row=" << per_row;
      EXPECT_EQ(first_diff(got, x), -1) << "value " << bad << " per_row=" << per_row;
      // Without a flag it neither throws nor writes (the format functions would throw).
      EXPECT_NO_THROW(moesq::ops::fake_quant_ref({.x = got.data(), .rows = 3, .K = 64, .block = 32, .per_row = per_row}));
      EXPECT_EQ(first_diff(got, x), -1);
      EXPECT_THROW(format::quantize_activation_row(x.data() + 2 * 64, 64, 32), moesq::Error);
    }
}

TEST(FakeQuant, AllZeroAndEmptyTensors) {
  std::vector<float> z(2 * 32, 0.0f);
  float amax = -1.0f;
  moesq::ops::fake_quant_ref({.x = z.data(), .rows = 2, .K = 32, .block = 32, .per_row = false, .amax = &amax});
  EXPECT_EQ(amax, 0.0f);
  for (float v : z) EXPECT_EQ(v, 0.0f);
  moesq::ops::fake_quant_ref({.x = z.data(), .rows = 2, .K = 32, .block = 16, .per_row = true});
  for (float v : z) EXPECT_EQ(v, 0.0f);
  float dummy = 3.0f;
  EXPECT_NO_THROW(moesq::ops::fake_quant_ref({.x = &dummy, .rows = 0, .K = 32, .block = 32, .per_row = false}));
  EXPECT_NO_THROW(moesq::ops::fake_quant_ref({.x = &dummy, .rows = 0, .K = 32, .block = 32, .per_row = true}));
  EXPECT_EQ(dummy, 3.0f);
}

TEST(FakeQuant, ArgumentErrorsNameTheProblem) {
  std::vector<float> x(64, 1.0f);
  const FakeQuantArgs a{.x = x.data(), .rows = 2, .K = 32, .block = 32};
  FakeQuantArgs b = a;
  b.block = 8;
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref(b), "block 8 must be 16 or 32");
  b = a;
  b.K = 48;
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref(b), "K=48 is not a multiple of block=32");
  b = a;
  b.K = 0;
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref(b), "bad shape rows=2 K=0");
  b = a;
  b.rows = -1;
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref(b), "bad shape rows=-1");
  b = a;
  b.x = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref(b), "x is null");
}

// The unscaled outputs of the bf16 forward: each value's dec(E2M1 code)·dec(UE4M3 scale), from the plain
// definition's codes, as exact bf16 bits; γ the plain γ; and x = u / γ bit for bit — so a GEMM of the
// unscaled operands divided by the two γ is the GEMM of the fake-quantized values with exact products.
TEST(FakeQuant, UnscaledBf16IsTheCodeTimesTheBlockScale) {
  for (const int block : {16, 32})
    for (const bool per_row : {false, true})
      for (const auto& s : kShapes) {
        const int64_t rows = s[0], K = s[1];
        if (K % block) continue;
        const auto x = random_rows(rows, K, block, 3000 * block + rows + per_row);
        const size_t n = static_cast<size_t>(rows * K);
        auto got = x;
        std::vector<uint16_t> u(n, 0xffff);
        std::vector<float> gamma(per_row ? rows : 1, -1.0f);
        moesq::ops::fake_quant_ref({.x = got.data(), .rows = rows, .K = K, .block = block, .per_row = per_row,
                                    .amax = nullptr, .nonfinite = nullptr, .unscaled_bf16 = u.data(),
                                    .gamma = gamma.data()});
        auto plain = x;  // the values must not change when the extra outputs are asked for
        if (per_row) {
          for (int64_t r = 0; r < rows; ++r) plain_fake_quant(plain.data() + r * K, K, block, plain_gamma(x.data() + r * K, K));
        } else {
          plain_fake_quant(plain.data(), rows * K, block, plain_gamma(x.data(), rows * K));
        }
        EXPECT_EQ(first_diff(got, plain), -1) << "block=" << block << " per_row=" << per_row << " rows=" << rows;
        int64_t bad_u = 0, bad_x = 0, nonzero = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const float g = per_row ? plain_gamma(x.data() + r * K, K) : plain_gamma(x.data(), rows * K);
          EXPECT_EQ(gamma[per_row ? r : 0], g) << "gamma, row " << r;
          for (int64_t b = 0; b < K; b += block) {
            float bmax = 0.0f;
            for (int j = 0; j < block; ++j) bmax = std::max(bmax, std::fabs(x[r * K + b + j]));
            const float sc = format::e4m3_decode(format::ue4m3_encode(g * bmax / 6.0f));
            for (int j = 0; j < block; ++j) {
              const size_t i = static_cast<size_t>(r * K + b + j);
              const float want = sc > 0.0f ? format::e2m1_decode(format::e2m1_encode(x[i] * (g / sc))) * sc : 0.0f;
              const uint32_t bits = static_cast<uint32_t>(u[i]) << 16;
              float have;
              std::memcpy(&have, &bits, sizeof have);
              bad_u += have != want;
              const float q = have / g;
              bad_x += std::memcmp(&q, &got[i], sizeof q) != 0;
              nonzero += have != 0.0f;
            }
          }
        }
        EXPECT_EQ(bad_u, 0) << "block=" << block << " per_row=" << per_row << " rows=" << rows << " K=" << K;
        EXPECT_EQ(bad_x, 0) << "x != u / gamma, block=" << block << " per_row=" << per_row << " rows=" << rows;
        EXPECT_GT(nonzero, 0);
      }
  float x[32] = {1.0f}, gamma = 0.0f;
  uint16_t u[32];
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref({.x = x, .rows = 1, .K = 32, .block = 32, .per_row = true,
                                                      .amax = nullptr, .nonfinite = nullptr, .unscaled_bf16 = u}),
                          "unscaled_bf16 and gamma are given together");
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref({.x = x, .rows = 1, .K = 32, .block = 32, .per_row = true,
                                                      .amax = nullptr, .nonfinite = nullptr, .gamma = &gamma}),
                          "unscaled_bf16 and gamma are given together");
}

// amax_given (the producer reduced amax(|x|) and checked finiteness) and write_x = false (x only read):
// the same unscaled bits and γ as the plain call; a wrong given amax is an Error in the twin.
TEST(FakeQuant, GivenAmaxAndReadOnlyXGiveThePlainCallsOutputs) {
  const int64_t rows = 17, K = 768;
  const auto x = random_rows(rows, K, 32, 91);
  const size_t n = static_cast<size_t>(rows * K);
  auto plain = x;
  std::vector<uint16_t> u_plain(n), u(n);
  float g_plain = 0.0f, g = 0.0f, amax_plain = 0.0f;
  moesq::ops::fake_quant_ref({.x = plain.data(), .rows = rows, .K = K, .block = 32, .per_row = false,
                              .amax = &amax_plain, .nonfinite = nullptr, .unscaled_bf16 = u_plain.data(),
                              .gamma = &g_plain});
  for (const bool write_x : {true, false}) {
    auto got = x;
    float amax = format::amax_abs(x.data(), rows * K);
    moesq::ops::fake_quant_ref({.x = got.data(), .rows = rows, .K = K, .block = 32, .per_row = false, .amax = &amax,
                                .nonfinite = nullptr, .unscaled_bf16 = u.data(), .gamma = &g, .amax_given = true,
                                .write_x = write_x});
    EXPECT_EQ(u, u_plain) << "write_x=" << write_x;
    EXPECT_EQ(g, g_plain);
    EXPECT_EQ(first_diff(got, write_x ? plain : x), -1) << "write_x=" << write_x;
  }
  auto got = x;
  float wrong = 2.0f * amax_plain;
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref({.x = got.data(), .rows = rows, .K = K, .block = 32,
                                                      .per_row = false, .amax = &wrong, .nonfinite = nullptr,
                                                      .amax_given = true}),
                          "is not amax(|x|)");
  EXPECT_ERROR_CONTAINING(moesq::ops::fake_quant_ref({.x = got.data(), .rows = rows, .K = K, .block = 32,
                                                      .per_row = true, .amax = nullptr, .nonfinite = nullptr,
                                                      .write_x = false}),
                          "write_x = false needs a tensor scale");
}
