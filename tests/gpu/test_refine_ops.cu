// GPU tests of the refinement's ops (src/ops/{fake_quant, gather_f32, gumbel_support, swiglu_train,
// weighted_mse}) against their CPU twins on fresh random inputs, at awkward sizes (R not a multiple of
// the 256-thread CTA, odd row counts) and an I = 768 / H = 2048-like projection:
//   bitwise   fake_quant (values, amax, nonfinite flag; tensor and per-row γ, block 16 and 32), gather_f32,
//             gumbel_support kArgmax / kFixed, weighted_mse dŶ, swiglu_train forward where silu is exact;
//   tolerance gumbel_support kNoiseFree / kGumbel (the device's expf / logf and fp64 FMA contraction of
//             κ·a + g), gumbel_support_lion and swiglu_train backward (FMA contraction), swiglu_train
//             forward (expf) and its Q_a (a bounded fraction of flipped codes), weighted_mse row loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "ops/descale_rows/descale_rows.h"
#include "ops/fake_quant/fake_quant.h"
#include "ops/gather_f32/gather_f32.h"
#include "ops/gumbel_support/gumbel_math.h"
#include "ops/gumbel_support/gumbel_support.h"
#include "ops/sparse48_dequant/sparse48_dequant.h"
#include "format/nvfp4.h"
#include "ops/swiglu_train/swiglu_train.h"
#include "ops/weighted_mse/weighted_mse.h"
#include "support/gpu_test_main.h"

namespace {

using namespace moesq;
using namespace moesq::ops;

constexpr int kG = gumbel::kGroup, kP = gumbel::kNumPatterns;

// ---- tolerances ---------------------------------------------------------------------------------
// Relaxed support: the device's logf (≤ 1 ulp) moves a Gumbel draw g (|g| ≲ 20) by ≤ 20·2^-23, its
// expf (≤ 2 ulp) each softmax term by 2^-22 relative, and a moved g can flip the fp32 rounding of
// u = (κa + g)/τ (|u| ≲ 300 at τ = 0.25: ulp 2^-15; κ·a + g itself has no FMA). π moves by ≈ π·δu: per element
// |Δπ| ≤ kSoftAbsTol + kSoftRelTol·π.
constexpr double kSoftRelTol = 0x1p-11;
constexpr double kSoftAbsTol = 1e-7;
// The dominant pattern of a group (argmax π) changes only where two π nearly tie.
constexpr double kMaxDominantMismatchFraction = 1e-3;
// Lion: FMA contraction in the gradient (dπ − ⟨π, dπ⟩) and in the update moves the momentum by a few
// ulps of the tensor's gradient scale; where c = β1·m + (1 − β1)·g lands next to 0 its sign can flip
// (a ±2·lr difference in θ), which is allowed on a small fraction of the parameters.
constexpr double kLionMomRelTol = 1e-5;        // × max |m_ref| of the tensor
constexpr double kLionThetaAbsTol = 1e-6;      // + this × |θ_ref|, with no sign flip
constexpr double kMaxLionSignFlipFraction = 1e-3;
// SwiGLU forward without Q_a: expf ≤ 2 ulp in σ, two correctly rounded products (__fmul_rn).
constexpr double kSwigluFwdRelTol = 0x1p-20;
// With Q_a: an ulp in h can move a value across an E2M1 rounding boundary (a code flip) or the row's
// amax (every value of the row then differs by the ulp of γ): values within 2^-18 relative are the
// same code; flipped codes are a small fraction.
constexpr double kQaSameCodeRelTol = 0x1p-18;
constexpr double kMaxQaCodeFlipFraction = 0.01;
// Gates ≥ 17 make exp(−a) < 2^-24: σ = 1 exactly on host and device, h = a·b bitwise.
constexpr float kExactSiluMinGate = 17.0f;
// SwiGLU backward: FMA contraction of 1 + a(1 − σ) and of the products, expf in σ: relative to the
// element's scale |dh|·(|b| + 1).
constexpr double kSwigluBwdRelTol = 0x1p-18;
// weighted_mse: the device's fp64 FMA in Σ r² and its tree order vs the CPU's column order.
constexpr double kRowLossRelTol = 1e-12;

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }
template <typename T>
int64_t first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(&a[i], &b[i], sizeof(T))) return static_cast<int64_t>(i);
  return -1;
}

std::vector<float> normal(size_t n, float std, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, std);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  return x;
}

// ---- fake_quant -------------------------------------------------------------------------------------
// Rows with per-row scales 2^-6 … 2^6 and one all-zero block per row of two or more blocks.
std::vector<float> quant_rows(int64_t rows, int64_t K, int block, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(rows * K);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(g() % 13) - 6);
    for (int64_t k = 0; k < K; ++k) x[r * K + k] = scale * nd(g);
    if (K / block < 2) continue;
    const int64_t zb = static_cast<int64_t>(g() % (K / block));
    for (int j = 0; j < block; ++j) x[r * K + zb * block + j] = 0.0f;
  }
  return x;
}

struct FqOut {
  std::vector<float> x;
  float amax = -1.0f;
  int32_t flag = -1;
};
FqOut fake_quant_gpu(const std::vector<float>& x, int64_t rows, int64_t K, int block, bool per_row) {
  DevBuf<float> d_x(x), d_amax(std::vector<float>{-1.0f});
  DevBuf<int32_t> d_flag(std::vector<int32_t>{0});
  fake_quant({.x = d_x.p, .rows = rows, .K = K, .block = block, .per_row = per_row, .amax = d_amax.p,
              .nonfinite = d_flag.p},
             nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  return {d_x.download(), d_amax.download()[0], d_flag.download()[0]};
}

const int64_t kQuantShapes[][2] = {{1, 32}, {2, 48}, {3, 48}, {37, 96}, {129, 768}, {5, 2048}, {768, 256}};  // {rows, K}

TEST(FakeQuantGpu, MatchesRefBitwise) {
  for (const int block : {16, 32})
    for (const bool per_row : {false, true})
      for (const auto& s : kQuantShapes) {
        const int64_t rows = s[0], K = s[1];
        if (K % block) continue;
        const auto x = quant_rows(rows, K, block, 1000 * block + 10 * rows + per_row);
        if (!per_row && (rows * K) % 32) {  // the tensor kernel takes whole warps of values
          DevBuf<float> d_x(x), d_amax(1);
          EXPECT_THROW(fake_quant({.x = d_x.p, .rows = rows, .K = K, .block = block, .per_row = false,
                                   .amax = d_amax.p},
                                  nullptr),
                       Error);
          continue;
        }
        std::vector<float> ref = x;
        float ref_amax = -1.0f;
        int32_t ref_flag = 0;
        fake_quant_ref({.x = ref.data(), .rows = rows, .K = K, .block = block, .per_row = per_row, .amax = &ref_amax,
                        .nonfinite = &ref_flag});
        const FqOut gpu = fake_quant_gpu(x, rows, K, block, per_row);
        EXPECT_EQ(first_diff(gpu.x, ref), -1) << "block=" << block << " per_row=" << per_row << " rows=" << rows
                                              << " K=" << K << " (first bad index shown)";
        if (!per_row) EXPECT_EQ(gpu.amax, ref_amax) << "amax, block=" << block << " rows=" << rows << " K=" << K;
        EXPECT_EQ(gpu.flag, 0);
        int64_t nonzero = 0;
        for (float v : gpu.x) nonzero += v != 0.0f;
        EXPECT_GT(nonzero, 0);
      }
}

// The unscaled outputs (bf16 bits of dec(q)·s) and γ of the bf16 forward: the twin's bits, and x = u / γ.
TEST(FakeQuantGpu, UnscaledBf16AndGammaMatchRefBitwise) {
  for (const int block : {16, 32})
    for (const bool per_row : {false, true})
      for (const auto& s : kQuantShapes) {
        const int64_t rows = s[0], K = s[1];
        if (K % block || (!per_row && (rows * K) % 32)) continue;
        const auto x = quant_rows(rows, K, block, 3000 * block + 10 * rows + per_row);
        const size_t n = static_cast<size_t>(rows * K), ng = per_row ? static_cast<size_t>(rows) : 1;
        std::vector<float> ref = x, ref_gamma(ng, -1.0f);
        std::vector<uint16_t> ref_u(n, 0xffff);
        fake_quant_ref({.x = ref.data(), .rows = rows, .K = K, .block = block, .per_row = per_row, .amax = nullptr,
                        .nonfinite = nullptr, .unscaled_bf16 = ref_u.data(), .gamma = ref_gamma.data()});
        DevBuf<float> d_x(x), d_amax(1), d_gamma(std::vector<float>(ng, -1.0f));
        DevBuf<uint16_t> d_u(std::vector<uint16_t>(n, 0xffff));
        fake_quant({.x = d_x.p, .rows = rows, .K = K, .block = block, .per_row = per_row, .amax = d_amax.p,
                    .nonfinite = nullptr, .unscaled_bf16 = d_u.p, .gamma = d_gamma.p},
                   nullptr);
        MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
        const auto gx = d_x.download();
        const auto gu = d_u.download();
        const auto gg = d_gamma.download();
        EXPECT_EQ(first_diff(gx, ref), -1) << "x, block=" << block << " per_row=" << per_row << " rows=" << rows;
        EXPECT_EQ(first_diff(gu, ref_u), -1) << "unscaled, block=" << block << " per_row=" << per_row << " rows=" << rows;
        EXPECT_EQ(first_diff(gg, ref_gamma), -1) << "gamma, block=" << block << " per_row=" << per_row;
        int64_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          const uint32_t bits = static_cast<uint32_t>(gu[i]) << 16;
          float u;
          std::memcpy(&u, &bits, sizeof u);
          const float q = u / gg[per_row ? i / static_cast<size_t>(K) : 0];
          bad += std::memcmp(&q, &gx[i], sizeof q) != 0;
        }
        EXPECT_EQ(bad, 0) << "x != unscaled / gamma, block=" << block << " per_row=" << per_row << " rows=" << rows;
      }
}

// amax_given (the support pass reduced it) and write_x = false (only the unscaled operand): the same
// unscaled bits and γ as the plain call, x untouched.
TEST(FakeQuantGpu, GivenAmaxAndNoXWriteMatchThePlainCall) {
  for (const auto& s : kQuantShapes) {
    const int64_t rows = s[0], K = s[1];
    if (K % 32 || (rows * K) % 32) continue;
    const auto x = quant_rows(rows, K, 32, 5000 + rows);
    const size_t n = static_cast<size_t>(rows * K);
    std::vector<float> ref = x, ref_gamma(1), ref_amax(1);
    std::vector<uint16_t> ref_u(n);
    fake_quant_ref({.x = ref.data(), .rows = rows, .K = K, .block = 32, .per_row = false, .amax = ref_amax.data(),
                    .nonfinite = nullptr, .unscaled_bf16 = ref_u.data(), .gamma = ref_gamma.data()});
    for (const bool write_x : {true, false}) {
      DevBuf<float> d_x(x), d_amax(ref_amax), d_gamma(1);
      DevBuf<uint16_t> d_u(n);
      fake_quant({.x = d_x.p, .rows = rows, .K = K, .block = 32, .per_row = false, .amax = d_amax.p,
                  .nonfinite = nullptr, .unscaled_bf16 = d_u.p, .gamma = d_gamma.p, .amax_given = true,
                  .write_x = write_x},
                 nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(first_diff(d_u.download(), ref_u), -1) << "rows=" << rows << " write_x=" << write_x;
      EXPECT_EQ(d_gamma.download()[0], ref_gamma[0]) << "rows=" << rows;
      EXPECT_EQ(first_diff(d_x.download(), write_x ? ref : x), -1) << "rows=" << rows << " write_x=" << write_x;
    }
  }
}

// ---- descale_rows ----------------------------------------------------------------------------------
// The descale fused into the SwiGLU forward (a|b) and the loss (Ŷ) on the GPU: the same bits as the
// descale_rows kernel followed by the plain kernels (padding row included).
TEST(DescaleRowsGpu, FusedIntoSwigluAndLossIsTheSeparatePass) {
  const int64_t rows = 256, I = 768, H = 2048;
  const auto ab = normal(rows * 2 * I, 3000.0f, 1), y = normal(rows * H, 3000.0f, 2), y_ref = normal(rows * H, 1.0f, 3);
  std::vector<float> rg = normal(rows, 1.0f, 4), w(rows, 0.25f), gw{1234.5f};
  for (auto& v : rg) v = 100.0f + std::fabs(v) * 1000.0f;
  rg[7] = 0.0f, w[7] = 0.0f;
  DevBuf<float> d_ab(ab), d_ab2(ab), d_h(rows * I), d_h2(rows * I), d_rg(rg), d_g(gw), d_y(y), d_y2(y), d_yref(y_ref),
      d_w(w), d_dy(rows * H), d_dy2(rows * H);
  DevBuf<double> d_l(rows), d_l2(rows);
  descale_rows({.x = d_ab.p, .rows = rows, .C = 2 * I, .row_gamma = d_rg.p, .gamma = d_g.p}, nullptr);
  swiglu_train_forward({.rows = rows, .I = I, .ab = d_ab.p, .h = d_h.p, .quantize = true, .block = 32}, nullptr);
  swiglu_train_forward({.rows = rows, .I = I, .ab = d_ab2.p, .h = d_h2.p, .quantize = true, .block = 32,
                        .ab_row_gamma = d_rg.p, .ab_gamma = d_g.p, .ab_out = d_ab2.p},
                       nullptr);
  descale_rows({.x = d_y.p, .rows = rows, .C = H, .row_gamma = d_rg.p, .gamma = d_g.p}, nullptr);
  weighted_mse({.rows = rows, .H = H, .y = d_y.p, .y_ref = d_yref.p, .w = d_w.p, .inv_norm = 1e-6, .dy = d_dy.p,
                .row_loss = d_l.p},
               nullptr);
  weighted_mse({.rows = rows, .H = H, .y = d_y2.p, .y_ref = d_yref.p, .w = d_w.p, .inv_norm = 1e-6, .dy = d_dy2.p,
                .row_loss = d_l2.p, .y_row_gamma = d_rg.p, .y_gamma = d_g.p},
               nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(first_diff(d_ab.download(), d_ab2.download()), -1);
  EXPECT_EQ(first_diff(d_h.download(), d_h2.download()), -1);
  EXPECT_EQ(first_diff(d_dy.download(), d_dy2.download()), -1);
  EXPECT_EQ(first_diff(d_l.download(), d_l2.download()), -1);
}

TEST(DescaleRowsGpu, MatchesRefBitwise) {
  std::mt19937_64 g(17);
  std::normal_distribution<float> nd(0.0f, 100.0f);
  std::uniform_real_distribution<float> ud(0.5f, 5000.0f);
  for (const auto& s : std::vector<std::array<int64_t, 2>>{{1, 1}, {3, 1536}, {256, 2048}, {70000, 3}}) {
    const int64_t rows = s[0], C = s[1];
    std::vector<float> x(rows * C), rg(rows), gamma{ud(g)};
    for (auto& v : x) v = nd(g);
    for (auto& v : rg) v = ud(g);
    rg[0] = 0.0f;  // a padding row
    std::vector<float> ref = x;
    descale_rows_ref({.x = ref.data(), .rows = rows, .C = C, .row_gamma = rg.data(), .gamma = gamma.data()});
    DevBuf<float> d_x(x), d_rg(rg), d_g(gamma);
    descale_rows({.x = d_x.p, .rows = rows, .C = C, .row_gamma = d_rg.p, .gamma = d_g.p}, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(first_diff(d_x.download(), ref), -1) << "rows=" << rows << " C=" << C;
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(ref[c], 0.0f) << "the padding row";
  }
}

TEST(FakeQuantGpu, NonFiniteSetsTheFlag) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    for (const bool per_row : {false, true}) {
      auto x = quant_rows(9, 64, 32, 3);
      x[7 * 64 + 33] = bad;
      EXPECT_EQ(fake_quant_gpu(x, 9, 64, 32, per_row).flag, 1) << "value " << bad << " per_row=" << per_row;
    }
  // All-zero and empty tensors.
  const std::vector<float> z(4 * 64, 0.0f);
  for (const bool per_row : {false, true}) {
    const FqOut o = fake_quant_gpu(z, 4, 64, 16, per_row);
    EXPECT_EQ(o.x, z);
    EXPECT_EQ(o.flag, 0);
  }
  DevBuf<float> d(1), d_amax(1);
  EXPECT_NO_THROW(fake_quant({.x = d.p, .rows = 0, .K = 32, .block = 32, .per_row = false, .amax = d_amax.p}, nullptr));
  EXPECT_THROW(fake_quant({.x = d.p, .rows = 1, .K = 32, .block = 32, .per_row = false, .amax = nullptr}, nullptr),
               Error);  // a tensor γ needs the amax scratch
}

// ---- gather_f32 ------------------------------------------------------------------------------------
// A refinement step's gathers in one launch (different widths, one index list with padding rows): the
// same bytes as the single launches.
TEST(GatherF32Gpu, SeveralGathersInOneLaunch) {
  const int64_t src_rows = 60, m = 37, Cs[5] = {2048, 2048, 1, 1024, 1};
  std::mt19937_64 g(3);
  std::vector<int64_t> idx(m);
  for (int64_t i = 0; i < m; ++i) idx[i] = i % 5 == 4 ? -1 : static_cast<int64_t>(g() % src_rows);
  DevBuf<int64_t> d_idx(idx);
  std::vector<DevBuf<float>> src, one, multi;
  GatherF32Args a[5], b[5];
  for (int j = 0; j < 5; ++j) {
    src.emplace_back(normal(src_rows * Cs[j], 1.0f, 80 + j));
    one.emplace_back(std::vector<float>(m * Cs[j], -1.0f));
    multi.emplace_back(std::vector<float>(m * Cs[j], -2.0f));
  }
  for (int j = 0; j < 5; ++j) {
    a[j] = {.src = src[j].p, .src_rows = src_rows, .C = Cs[j], .idx = d_idx.p, .m = m, .out = one[j].p};
    b[j] = a[j];
    b[j].out = multi[j].p;
    gather_f32(a[j], nullptr);
  }
  gather_f32(b, 5, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  for (int j = 0; j < 5; ++j) EXPECT_EQ(first_diff(one[j].download(), multi[j].download()), -1) << "gather " << j;
  EXPECT_THROW(gather_f32(b, 9, nullptr), Error);
}

TEST(GatherF32Gpu, MatchesPlainGatherBitwise) {
  for (const int64_t C : {1, 7, 300, 2048})
    for (const int64_t m : {1, 33, 257}) {
      const int64_t src_rows = 45;
      const auto src = normal(src_rows * C, 1.0f, C + m);
      std::mt19937_64 g(m);
      std::vector<int64_t> idx(m);
      for (int64_t i = 0; i < m; ++i) idx[i] = i % 4 == 3 ? -1 : static_cast<int64_t>(g() % src_rows);
      std::vector<float> ref(m * C, -7.0f);
      gather_f32_ref({.src = src.data(), .src_rows = src_rows, .C = C, .idx = idx.data(), .m = m, .out = ref.data()});
      // Past the source rows: the kernel writes zeros (the twin throws instead).
      if (m > 1) {
        idx[1] = src_rows;
        std::fill_n(ref.begin() + C, C, 0.0f);
      }
      DevBuf<float> d_src(src), d_out(std::vector<float>(m * C, std::numeric_limits<float>::quiet_NaN()));
      DevBuf<int64_t> d_idx(idx);
      gather_f32({.src = d_src.p, .src_rows = src_rows, .C = C, .idx = d_idx.p, .m = m, .out = d_out.p}, nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(first_diff(d_out.download(), ref), -1) << "C=" << C << " m=" << m;
    }
}

// ---- gumbel_support -----------------------------------------------------------------------------------
struct Support {
  int64_t R;
  std::vector<float> A, V;
  std::vector<uint8_t> fixed;
};
Support random_support(int64_t R, uint64_t seed) {
  Support s{R, normal(R * kP, 0.05f, seed), normal(R * kG, 1.0f, seed + 1), std::vector<uint8_t>(R)};
  std::mt19937_64 g(seed + 2);
  for (auto& p : s.fixed) p = static_cast<uint8_t>(g() % kP);
  for (int64_t r = 0; r < R; r += 11)  // ties: the lowest id wins on both sides
    for (int p = 0; p < kP; ++p) s.A[r * kP + p] = p % 3 == 1 ? 0.25f : 0.0f;
  return s;
}

struct SupportOut {
  std::vector<float> pi, W;
  std::vector<uint8_t> patterns;
  float amax = 0.0f;  // the fused Q_w amax (started at 0)
  int32_t flag = 0;   // the non-finite flag
};
SupportOut support_forward(const Support& s, SupportMode mode, double kappa, double tau, uint64_t key, bool gpu) {
  SupportOut o{std::vector<float>(s.R * kP, -1.0f), std::vector<float>(s.R * kG, -1.0f), std::vector<uint8_t>(s.R, 99)};
  if (!gpu) {
    gumbel_support_forward_ref({.R = s.R, .mode = mode, .A = s.A.data(), .V = s.V.data(), .fixed = s.fixed.data(),
                                .kappa = kappa, .tau = tau, .key = key, .pi = o.pi.data(), .W = o.W.data(),
                                .patterns = o.patterns.data(), .amax = &o.amax, .nonfinite = &o.flag});
    return o;
  }
  DevBuf<float> A(s.A), V(s.V), pi(o.pi), W(o.W), amax(std::vector<float>{0.0f});
  DevBuf<uint8_t> fixed(s.fixed), pat(o.patterns);
  DevBuf<int32_t> flag(std::vector<int32_t>{0});
  gumbel_support_forward({.R = s.R, .mode = mode, .A = A.p, .V = V.p, .fixed = fixed.p, .kappa = kappa, .tau = tau,
                          .key = key, .pi = pi.p, .W = W.p, .patterns = pat.p, .amax = amax.p, .nonfinite = flag.p},
                         nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  return {pi.download(), W.download(), pat.download(), amax.download()[0], flag.download()[0]};
}
float max_abs_of(const std::vector<float>& w) {
  float m = 0.0f;
  for (float v : w) m = std::max(m, std::fabs(v));
  return m;
}

const int64_t kGroupCounts[] = {1, 255, 257, 1000, 768 * 2048 / 8};

TEST(GumbelSupportGpu, HardModesMatchRefBitwise) {
  for (const int64_t R : kGroupCounts) {
    const Support s = random_support(R, R);
    for (const SupportMode mode : {SupportMode::kArgmax, SupportMode::kFixed}) {
      const SupportOut ref = support_forward(s, mode, 100.0, 2.0, 0, false);
      const SupportOut gpu = support_forward(s, mode, 100.0, 2.0, 0, true);
      EXPECT_EQ(first_diff(gpu.W, ref.W), -1) << "R=" << R << " mode " << static_cast<int>(mode);
      EXPECT_EQ(first_diff(gpu.patterns, ref.patterns), -1) << "R=" << R << " mode " << static_cast<int>(mode);
      EXPECT_EQ(gpu.amax, ref.amax) << "the fused amax, R=" << R;
      EXPECT_EQ(gpu.amax, max_abs_of(gpu.W)) << "R=" << R;
      EXPECT_EQ(gpu.flag, 0);
    }
  }
  // A NaN or an infinity in V raises the flag; the amax ignores the NaN (as fake_quant's own pass).
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Support s = random_support(1000, 5);
    for (int j = 0; j < kG; ++j) s.V[377 * kG + j] = bad;
    EXPECT_EQ(support_forward(s, SupportMode::kFixed, 100.0, 2.0, 0, true).flag, 1) << bad;
    EXPECT_EQ(support_forward(s, SupportMode::kFixed, 100.0, 2.0, 0, false).flag, 1) << bad;
  }
}

TEST(GumbelSupportGpu, RelaxedModesMatchRefWithinTolerance) {
  // The start and the end of the κ, τ annealing (κ 100 → 500, τ 2 → small).
  const double schedule[][2] = {{100.0, 2.0}, {500.0, 0.25}};
  for (const int64_t R : kGroupCounts)
    for (const auto& kt : schedule)
      for (const SupportMode mode : {SupportMode::kNoiseFree, SupportMode::kGumbel}) {
        const Support s = random_support(R, 7 * R);
        const uint64_t key = gumbel::rng_key(1, 3, 2, 17, 1);
        const SupportOut ref = support_forward(s, mode, kt[0], kt[1], key, false);
        const SupportOut gpu = support_forward(s, mode, kt[0], kt[1], key, true);
        int64_t bad_pi = 0, bad_w = 0, dominant = 0, exact = 0;
        for (int64_t r = 0; r < R; ++r) {
          for (int p = 0; p < kP; ++p) {
            const double d = std::fabs(gpu.pi[r * kP + p] - ref.pi[r * kP + p]);
            bad_pi += !(d <= kSoftAbsTol + kSoftRelTol * ref.pi[r * kP + p]);
            exact += d == 0.0;
          }
          for (int j = 0; j < kG; ++j) {
            const double d = std::fabs(gpu.W[r * kG + j] - ref.W[r * kG + j]);
            bad_w += !(d <= (2 * kSoftAbsTol + 2 * kSoftRelTol) * std::fabs(s.V[r * kG + j]));
          }
          dominant += gumbel::argmax_pattern<float>(&gpu.pi[r * kP]) != gumbel::argmax_pattern<float>(&ref.pi[r * kP]);
        }
        const double frac = static_cast<double>(dominant) / R;
        std::printf("gumbel_support mode %d kappa=%g tau=%g R=%lld: %lld of %lld pi exact, %lld dominant flips\n",
                    static_cast<int>(mode), kt[0], kt[1], static_cast<long long>(R), static_cast<long long>(exact),
                    static_cast<long long>(R * kP), static_cast<long long>(dominant));
        EXPECT_EQ(gpu.amax, max_abs_of(gpu.W)) << "the fused amax is max |W| exactly, R=" << R;
        EXPECT_EQ(ref.amax, max_abs_of(ref.W)) << "R=" << R;
        EXPECT_EQ(bad_pi, 0) << "R=" << R << " mode " << static_cast<int>(mode) << " kappa=" << kt[0];
        EXPECT_EQ(bad_w, 0) << "R=" << R << " mode " << static_cast<int>(mode) << " kappa=" << kt[0];
        EXPECT_LE(frac, R >= 1000 ? kMaxDominantMismatchFraction : 0.0) << "R=" << R;
      }
}

// Three projections of different sizes (an expert's gate, up, down) in one launch: the same bits as
// three single launches, forward (Gumbel noise, fused amax into two accumulators) and Lion (one relaxed
// projection beside a fixed one).
TEST(GumbelSupportGpu, ThreeProjectionsInOneLaunchAreThreeLaunches) {
  const int64_t Rs[3] = {1000, 257, 768 * 2048 / 8};
  std::vector<Support> S;
  for (int j = 0; j < 3; ++j) S.push_back(random_support(Rs[j], 40 + j));
  struct Dev {
    DevBuf<float> A, V, pi, W, dW, mA, mV;
    DevBuf<uint8_t> fixed;
  };
  auto make = [&](int j) {
    const int64_t R = Rs[j];
    return Dev{DevBuf<float>(S[j].A), DevBuf<float>(S[j].V), DevBuf<float>(R * kP), DevBuf<float>(R * kG),
               DevBuf<float>(normal(R * kG, 1e-3f, 50 + j)), DevBuf<float>(normal(R * kP, 1e-2f, 60 + j)),
               DevBuf<float>(normal(R * kG, 1e-3f, 70 + j)), DevBuf<uint8_t>(S[j].fixed)};
  };
  std::vector<Dev> one, multi;
  for (int j = 0; j < 3; ++j) one.push_back(make(j)), multi.push_back(make(j));
  DevBuf<float> amax_one(std::vector<float>{0.0f, 0.0f}), amax_multi(std::vector<float>{0.0f, 0.0f});
  auto fwd = [&](std::vector<Dev>& d, float* amax, int j) {
    return GumbelSupportArgs{.R = Rs[j], .mode = SupportMode::kGumbel, .A = d[j].A.p, .V = d[j].V.p,
                             .kappa = 300.0, .tau = 0.8, .key = gumbel::rng_key(3, 1, 2, 5, j), .pi = d[j].pi.p,
                             .W = d[j].W.p, .amax = amax + (j == 2 ? 1 : 0)};
  };
  auto lion = [&](std::vector<Dev>& d, int j) {
    const bool relaxed = j != 1;
    return GumbelSupportLionArgs{.R = Rs[j], .dW = d[j].dW.p, .pi = relaxed ? d[j].pi.p : nullptr,
                                 .fixed = d[j].fixed.p, .kappa = 300.0, .tau = 0.8, .A = relaxed ? d[j].A.p : nullptr,
                                 .V = d[j].V.p, .mom_A = relaxed ? d[j].mA.p : nullptr, .mom_V = d[j].mV.p,
                                 .lr_A = 2e-3, .lr_V = 4e-4};
  };
  GumbelSupportArgs f[3];
  GumbelSupportLionArgs l[3];
  for (int j = 0; j < 3; ++j) gumbel_support_forward(fwd(one, amax_one.p, j), nullptr);
  for (int j = 0; j < 3; ++j) f[j] = fwd(multi, amax_multi.p, j);
  gumbel_support_forward(f, 3, nullptr);
  for (int j = 0; j < 3; ++j) gumbel_support_lion(lion(one, j), nullptr);
  for (int j = 0; j < 3; ++j) l[j] = lion(multi, j);
  gumbel_support_lion(l, 3, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(first_diff(amax_one.download(), amax_multi.download()), -1);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(first_diff(one[j].W.download(), multi[j].W.download()), -1) << "W, projection " << j;
    EXPECT_EQ(first_diff(one[j].pi.download(), multi[j].pi.download()), -1) << "pi, projection " << j;
    EXPECT_EQ(first_diff(one[j].A.download(), multi[j].A.download()), -1) << "A, projection " << j;
    EXPECT_EQ(first_diff(one[j].V.download(), multi[j].V.download()), -1) << "V, projection " << j;
    EXPECT_EQ(first_diff(one[j].mA.download(), multi[j].mA.download()), -1) << "mom_A, projection " << j;
    EXPECT_EQ(first_diff(one[j].mV.download(), multi[j].mV.download()), -1) << "mom_V, projection " << j;
  }
  EXPECT_THROW(gumbel_support_forward(f, 4, nullptr), Error);
  EXPECT_THROW(gumbel_support_lion(l, 0, nullptr), Error);
}

// recompute_pi: Lion recomputes the forward's kGumbel π from A and the key instead of reading it. On the
// device the two kernels inline the same soft_group_forward (no FMA in κ·a + g), so the update is the
// stored-π update bit for bit; likewise on the host.
TEST(GumbelSupportGpu, LionRecomputedPiIsTheStoredPiBitwise) {
  const double kappa = 300.0, tau = 0.8, lr_A = 2e-3, lr_V = 4e-4;
  const uint64_t key = gumbel::rng_key(5, 6, 2, 7, 1);
  for (const int64_t R : kGroupCounts) {
    const Support s = random_support(R, 5 * R + 1);
    const auto dW = normal(R * kG, 1e-3f, R + 21);
    const auto mA0 = normal(R * kP, 1e-2f, R + 22), mV0 = normal(R * kG, 1e-3f, R + 23);
    for (const bool gpu : {false, true}) {
      const SupportOut f = support_forward(s, SupportMode::kGumbel, kappa, tau, key, gpu);
      std::vector<float> out[2][4];  // [recompute][A, V, mom_A, mom_V]
      for (const bool recompute : {false, true}) {
        std::vector<float> A = s.A, V = s.V, mA = mA0, mV = mV0;
        GumbelSupportLionArgs a{.R = R, .dW = dW.data(), .pi = recompute ? nullptr : f.pi.data(), .kappa = kappa,
                                .tau = tau, .recompute_pi = recompute, .key = key, .A = A.data(), .V = V.data(),
                                .mom_A = mA.data(), .mom_V = mV.data(), .lr_A = lr_A, .lr_V = lr_V};
        if (!gpu) {
          gumbel_support_lion_ref(a);
        } else {
          DevBuf<float> d_dW(dW), d_pi(f.pi), d_A(A), d_V(V), d_mA(mA), d_mV(mV);
          a.dW = d_dW.p, a.pi = recompute ? nullptr : d_pi.p, a.A = d_A.p, a.V = d_V.p, a.mom_A = d_mA.p,
          a.mom_V = d_mV.p;
          gumbel_support_lion(a, nullptr);
          MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
          A = d_A.download(), V = d_V.download(), mA = d_mA.download(), mV = d_mV.download();
        }
        out[recompute][0] = A, out[recompute][1] = V, out[recompute][2] = mA, out[recompute][3] = mV;
      }
      for (int k = 0; k < 4; ++k)
        EXPECT_EQ(first_diff(out[1][k], out[0][k]), -1) << "R=" << R << " gpu=" << gpu << " tensor " << k;
      EXPECT_NE(first_diff(out[1][0], s.A), -1) << "the step must move A, R=" << R;
    }
  }
}

TEST(GumbelSupportGpu, LionMatchesRefWithinTolerance) {
  const double kappa = 300.0, tau = 0.8, lr_A = 2e-3, lr_V = 4e-4;
  for (const int64_t R : kGroupCounts)
    for (const bool relaxed : {true, false}) {
      const Support s = random_support(R, 3 * R + relaxed);
      const SupportOut f = support_forward(s, SupportMode::kNoiseFree, kappa, tau, 0, false);
      const auto dW = normal(R * kG, 1e-3f, R + 11);
      const auto mA0 = normal(R * kP, 1e-2f, R + 12), mV0 = normal(R * kG, 1e-3f, R + 13);
      std::vector<float> A = s.A, V = s.V, mA = mA0, mV = mV0;
      gumbel_support_lion_ref({.R = R, .dW = dW.data(), .pi = relaxed ? f.pi.data() : nullptr, .fixed = s.fixed.data(),
                               .kappa = kappa, .tau = tau, .A = relaxed ? A.data() : nullptr, .V = V.data(),
                               .mom_A = relaxed ? mA.data() : nullptr, .mom_V = mV.data(), .lr_A = lr_A, .lr_V = lr_V});
      DevBuf<float> d_dW(dW), d_pi(f.pi), d_A(s.A), d_V(s.V), d_mA(mA0), d_mV(mV0);
      DevBuf<uint8_t> d_fixed(s.fixed);
      gumbel_support_lion({.R = R, .dW = d_dW.p, .pi = relaxed ? d_pi.p : nullptr, .fixed = d_fixed.p, .kappa = kappa,
                           .tau = tau, .A = relaxed ? d_A.p : nullptr, .V = d_V.p, .mom_A = relaxed ? d_mA.p : nullptr,
                           .mom_V = d_mV.p, .lr_A = lr_A, .lr_V = lr_V},
                          nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      auto compare = [&](const std::vector<float>& theta_ref, const std::vector<float>& theta_gpu,
                         const std::vector<float>& m_ref, const std::vector<float>& m_gpu, const char* what) {
        float m_scale = 0.0f;
        for (float v : m_ref) m_scale = std::max(m_scale, std::fabs(v));
        int64_t bad_m = 0, flips = 0;
        for (size_t i = 0; i < m_ref.size(); ++i) {
          bad_m += !(std::fabs(m_gpu[i] - m_ref[i]) <= kLionMomRelTol * m_scale);
          flips += !(std::fabs(theta_gpu[i] - theta_ref[i]) <= kLionThetaAbsTol * (1.0 + std::fabs(theta_ref[i])));
        }
        EXPECT_EQ(bad_m, 0) << what << " momentum, R=" << R << " relaxed=" << relaxed;
        EXPECT_LE(static_cast<double>(flips) / m_ref.size(), R >= 1000 ? kMaxLionSignFlipFraction : 0.0)
            << what << " (" << flips << " sign flips), R=" << R << " relaxed=" << relaxed;
        EXPECT_GT(m_scale, 0.0f);
      };
      compare(V, d_V.download(), mV, d_mV.download(), "V");
      if (relaxed) compare(A, d_A.download(), mA, d_mA.download(), "A");
      else EXPECT_EQ(first_diff(d_A.download(), s.A), -1) << "a fixed support leaves A alone";
    }
}

// ---- swiglu_train -------------------------------------------------------------------------------------
struct SwigluCase {
  int64_t rows, I;
  std::vector<float> ab, dh;  // [rows, 2I], [rows, I]
};
SwigluCase swiglu_case(int64_t rows, int64_t I, uint64_t seed, bool exact_silu) {
  SwigluCase c{rows, I, normal(rows * 2 * I, 2.0f, seed), normal(rows * I, 1.0f, seed + 1)};
  if (exact_silu) {
    std::mt19937_64 g(seed + 2);
    std::uniform_real_distribution<float> gate(kExactSiluMinGate, 40.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < I; ++k) c.ab[r * 2 * I + k] = gate(g);
  }
  return c;
}
std::vector<float> swiglu_forward_gpu(const SwigluCase& c, bool quantize, int block, int32_t* flag) {
  DevBuf<float> ab(c.ab), h(c.rows * c.I);
  DevBuf<int32_t> d_flag(std::vector<int32_t>{0});
  swiglu_train_forward({.rows = c.rows, .I = c.I, .ab = ab.p, .h = h.p, .quantize = quantize, .block = block,
                        .nonfinite = d_flag.p},
                       nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  *flag = d_flag.download()[0];
  return h.download();
}

// ---- the prior logits (Eq. 2 init) --------------------------------------------------------------
// The kernel runs prior_logit's fp64 expressions in the host's order (no FMA); the device's log, sqrt
// and cos may differ from glibc's in the last fp64 ulp, which the rounding to fp32 almost always hides:
// each logit within one fp32 ulp of the twin's (or 1e-12 absolute near 0), and most of them bitwise.
constexpr double kPriorAbsFloor = 1e-12;
constexpr double kMinPriorBitwiseFraction = 0.999;
TEST(GumbelSupportGpu, PriorLogitsMatchTheCpuDrawToAnUlp) {
  for (const int64_t R : {int64_t{1}, int64_t{255}, int64_t{100003}}) {
    std::mt19937 g(static_cast<uint32_t>(R));
    std::vector<uint8_t> prior(static_cast<size_t>(R));
    for (auto& p : prior) p = static_cast<uint8_t>(g() % kP);
    const GumbelPriorArgs host{.R = R, .prior = prior.data(), .sigma = 0.25, .s = 3.0,
                               .key = gumbel::rng_key(9, static_cast<uint64_t>(R), 1, 0, 2)};
    std::vector<float> ref(static_cast<size_t>(R * kP));
    GumbelPriorArgs ra = host;
    ra.A = ref.data();
    gumbel_prior_logits_ref(ra);
    DevBuf<uint8_t> d_prior(prior);
    DevBuf<float> d_A(ref.size());
    GumbelPriorArgs da = host;
    da.prior = d_prior.p;
    da.A = d_A.p;
    gumbel_prior_logits(da, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> gpu = d_A.download();
    int64_t bitwise = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      bitwise += same_bits(&gpu[i], &ref[i], sizeof(float));
      const double ulp = std::nextafter(std::fabs(ref[i]), INFINITY) - std::fabs(ref[i]);
      ASSERT_LE(std::fabs(double(gpu[i]) - ref[i]), std::max(ulp, kPriorAbsFloor))
          << "R=" << R << " element " << i << ": " << gpu[i] << " vs " << ref[i];
    }
    EXPECT_GE(static_cast<double>(bitwise), kMinPriorBitwiseFraction * static_cast<double>(ref.size())) << "R=" << R;
  }
}

// ---- sparse48_dequant: the packed expert's unpack on the device, bit for bit --------------------
TEST(Sparse48DequantGpu, MatchesTheHostUnpackBitwise) {
  const int64_t shapes[][2] = {{1, 32}, {3, 64}, {37, 768}, {768, 2048}};
  for (const auto& nk : shapes) {
    const int64_t N = nk[0], K = nk[1];
    std::mt19937 g(static_cast<uint32_t>(N * 7 + K));
    std::vector<float> W = normal(static_cast<size_t>(N * K), 0.02f, static_cast<uint64_t>(N + K));
    std::vector<uint8_t> pat(static_cast<size_t>(N * K / 8));
    for (auto& p : pat) p = static_cast<uint8_t>(g() % kP);
    format::Sparse48Tensor t = format::sparse48_quantize(W.data(), N, K, pat.data(), 0.0f, "test");
    // Every finite scale code and both signs of every value code somewhere (subnormal scales included).
    for (size_t i = 0; i < t.scales.size(); ++i) {
      const uint8_t c = static_cast<uint8_t>(i % 127);
      t.scales[i] = c == 0x7f ? 0x7e : c;
    }
    std::vector<float> ref(static_cast<size_t>(N * K));
    Sparse48DequantArgs a{.N = N, .K = K, .values = t.values.data(), .meta = t.meta.data(), .scales = t.scales.data(),
                          .global_scale = t.global_scale, .out = ref.data()};
    sparse48_dequant_ref(a);
    DevBuf<uint8_t> dv(t.values), dm(t.meta), ds(t.scales);
    DevBuf<float> dout(ref.size());
    a.values = dv.p, a.meta = dm.p, a.scales = ds.p, a.out = dout.p;
    sparse48_dequant(a, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(first_diff(dout.download(), ref), -1) << "N=" << N << " K=" << K;
  }
}

const int64_t kSwigluShapes[][2] = {{1, 32}, {3, 96}, {37, 768}, {129, 768}};  // {rows, I}

TEST(SwigluTrainGpu, ForwardMatchesRef) {
  for (const auto& s : kSwigluShapes)
    for (const int block : {16, 32}) {
      const int64_t rows = s[0], I = s[1];
      // Exact silu: bitwise, with and without Q_a.
      const SwigluCase e = swiglu_case(rows, I, 10 * rows + I, true);
      for (const bool quantize : {false, true}) {
        std::vector<float> ref(rows * I);
        swiglu_train_forward_ref({.rows = rows, .I = I, .ab = e.ab.data(), .h = ref.data(), .quantize = quantize,
                                  .block = block});
        int32_t flag = -1;
        EXPECT_EQ(first_diff(swiglu_forward_gpu(e, quantize, block, &flag), ref), -1)
            << "exact silu, quantize=" << quantize << " block=" << block << " rows=" << rows << " I=" << I;
        EXPECT_EQ(flag, 0);
      }
      // Ordinary gates: within expf's allowance; with Q_a a bounded fraction of flipped codes.
      const SwigluCase c = swiglu_case(rows, I, 20 * rows + I, false);
      for (const bool quantize : {false, true}) {
        std::vector<float> ref(rows * I);
        swiglu_train_forward_ref({.rows = rows, .I = I, .ab = c.ab.data(), .h = ref.data(), .quantize = quantize,
                                  .block = block});
        int32_t flag = -1;
        const auto gpu = swiglu_forward_gpu(c, quantize, block, &flag);
        EXPECT_EQ(flag, 0);
        int64_t off = 0, nonzero = 0;
        for (int64_t i = 0; i < rows * I; ++i) {
          const double tol = (quantize ? kQaSameCodeRelTol : kSwigluFwdRelTol) * std::fabs(ref[i]);
          off += !(std::fabs(gpu[i] - ref[i]) <= tol);
          nonzero += ref[i] != 0.0f;
        }
        EXPECT_GT(nonzero, 0);
        if (quantize) {
          std::printf("swiglu_train Q_a block=%d rows=%lld I=%lld: %lld of %lld codes flipped\n", block,
                      static_cast<long long>(rows), static_cast<long long>(I), static_cast<long long>(off),
                      static_cast<long long>(rows * I));
          EXPECT_LE(static_cast<double>(off) / (rows * I), rows * I >= 10000 ? kMaxQaCodeFlipFraction : 0.05)
              << "rows=" << rows << " I=" << I << " block=" << block;
        } else {
          EXPECT_EQ(off, 0) << "rows=" << rows << " I=" << I;
        }
      }
    }
  // A NaN gate raises the flag.
  SwigluCase n = swiglu_case(5, 64, 9, false);
  n.ab[3 * 128 + 10] = std::numeric_limits<float>::quiet_NaN();
  int32_t flag = 0;
  swiglu_forward_gpu(n, true, 32, &flag);
  EXPECT_EQ(flag, 1);
}

// The forward with Q_a in one launch (SwiGLU into shared memory, then the row's Q_a) against the two
// passes it replaces (SwiGLU without Q_a, then fake_quant per row): the same bits, with the unscaled
// outputs and the fused descale, over widths that are and are not multiples of the CTA.
TEST(SwigluTrainGpu, ForwardWithQaInOneLaunchIsTheTwoPasses) {
  for (const int64_t I : {32, 96, 768, 2048})
    for (const int block : {16, 32})
      for (const bool descale : {false, true}) {
        const int64_t rows = 37;
        const auto ab = normal(rows * 2 * I, descale ? 2000.0f : 2.0f, I + block);
        std::vector<float> rg(rows, 700.0f), gw{1500.0f};
        rg[3] = 0.0f;
        DevBuf<float> d_ab(ab), d_ab2(ab), d_h(rows * I), d_h2(rows * I), d_rg(rg), d_g(gw), d_gam(rows), d_gam2(rows);
        DevBuf<uint16_t> d_u(rows * I), d_u2(rows * I);
        DevBuf<int32_t> d_f(std::vector<int32_t>{0}), d_f2(std::vector<int32_t>{0});
        if (descale) descale_rows({.x = d_ab.p, .rows = rows, .C = 2 * I, .row_gamma = d_rg.p, .gamma = d_g.p}, nullptr);
        swiglu_train_forward({.rows = rows, .I = I, .ab = d_ab.p, .h = d_h.p, .quantize = false, .block = block}, nullptr);
        fake_quant({.x = d_h.p, .rows = rows, .K = I, .block = block, .per_row = true, .amax = nullptr,
                    .nonfinite = d_f.p, .unscaled_bf16 = d_u.p, .gamma = d_gam.p},
                   nullptr);
        swiglu_train_forward({.rows = rows, .I = I, .ab = d_ab2.p, .h = d_h2.p, .quantize = true, .block = block,
                              .nonfinite = d_f2.p, .h_unscaled_bf16 = d_u2.p, .h_gamma = d_gam2.p,
                              .ab_row_gamma = descale ? d_rg.p : nullptr, .ab_gamma = descale ? d_g.p : nullptr,
                              .ab_out = descale ? d_ab2.p : nullptr},
                             nullptr);
        MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
        const std::string what = "I=" + std::to_string(I) + " block=" + std::to_string(block) + " descale=" +
                                 std::to_string(descale);
        EXPECT_EQ(first_diff(d_h.download(), d_h2.download()), -1) << what;
        EXPECT_EQ(first_diff(d_u.download(), d_u2.download()), -1) << what;
        EXPECT_EQ(first_diff(d_gam.download(), d_gam2.download()), -1) << what;
        EXPECT_EQ(first_diff(d_ab.download(), d_ab2.download()), -1) << what;
        EXPECT_EQ(d_f2.download()[0], 0) << what;
      }
}

TEST(SwigluTrainGpu, BackwardMatchesRefWithinTolerance) {
  for (const auto& s : kSwigluShapes) {
    const int64_t rows = s[0], I = s[1];
    const SwigluCase c = swiglu_case(rows, I, 30 * rows + I, false);
    std::vector<float> ref(rows * 2 * I);
    swiglu_train_backward_ref({.rows = rows, .I = I, .ab = c.ab.data(), .dh = c.dh.data(), .dab = ref.data()});
    DevBuf<float> ab(c.ab), dh(c.dh), dab(std::vector<float>(rows * 2 * I, std::numeric_limits<float>::quiet_NaN()));
    swiglu_train_backward({.rows = rows, .I = I, .ab = ab.p, .dh = dh.p, .dab = dab.p}, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    const auto gpu = dab.download();
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < 2 * I; ++k) {
        const int64_t c0 = k % I;
        const double scale = std::fabs(c.dh[r * I + c0]) * (std::fabs(c.ab[r * 2 * I + I + c0]) + 1.0) *
                             (std::fabs(c.ab[r * 2 * I + c0]) + 1.0);
        bad += !(std::fabs(gpu[r * 2 * I + k] - ref[r * 2 * I + k]) <= kSwigluBwdRelTol * scale);
      }
    EXPECT_EQ(bad, 0) << "rows=" << rows << " I=" << I;
  }
}

// ---- weighted_mse -------------------------------------------------------------------------------------
TEST(WeightedMseGpu, MatchesRef) {
  for (const int64_t H : {64, 257, 2048})
    for (const int64_t rows : {1, 33, 300}) {
      const auto y = normal(rows * H, 1.0f, H + rows), y_ref = normal(rows * H, 1.0f, H + rows + 1);
      std::vector<float> w(rows);
      std::mt19937_64 g(rows);
      std::uniform_real_distribution<float> ud(0.05f, 1.0f);
      double sw = 0.0;
      for (int64_t i = 0; i < rows; ++i) sw += (w[i] = i % 7 == 6 ? 0.0f : ud(g));  // padding rows: w = 0
      const double inv_norm = 1.0 / (sw * H);
      std::vector<float> dy(rows * H);
      std::vector<double> loss(rows);
      weighted_mse_ref({.rows = rows, .H = H, .y = y.data(), .y_ref = y_ref.data(), .w = w.data(), .inv_norm = inv_norm,
                        .dy = dy.data(), .row_loss = loss.data()});
      DevBuf<float> d_y(y), d_yr(y_ref), d_w(w), d_dy(rows * H);
      DevBuf<double> d_loss(rows);
      weighted_mse({.rows = rows, .H = H, .y = d_y.p, .y_ref = d_yr.p, .w = d_w.p, .inv_norm = inv_norm, .dy = d_dy.p,
                    .row_loss = d_loss.p},
                   nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(first_diff(d_dy.download(), dy), -1) << "dy, rows=" << rows << " H=" << H;
      const auto gl = d_loss.download();
      for (int64_t i = 0; i < rows; ++i)
        ASSERT_NEAR(gl[i], loss[i], kRowLossRelTol * loss[i]) << "row " << i << " rows=" << rows << " H=" << H;
      // Loss only.
      DevBuf<double> d_loss2(rows);
      weighted_mse({.rows = rows, .H = H, .y = d_y.p, .y_ref = d_yr.p, .w = d_w.p, .inv_norm = inv_norm, .dy = nullptr,
                    .row_loss = d_loss2.p},
                   nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(first_diff(d_loss2.download(), gl), -1) << "the same tree every run";
    }
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
