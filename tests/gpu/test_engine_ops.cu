// GPU tests of the engine's ops (src/ops/{gemm_bf16,rmsnorm,qk_rope,attention,router_topk,moe_combine,dense_swiglu})
// against their CPU `_ref` twins on fresh random inputs with fixed seeds (STYLE.md §3–5). Where the
// kernel and the twin round in the same order the check is BITWISE; elsewhere a named tolerance.
// Attention and qk_rope also through non-identity slot tables (tok_slot: the KV slot of each row) and
// through a paged KV block table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/attention/attention.h"
#include "ops/dense_swiglu/dense_swiglu.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/gemm_bf16/gemm_bf16_large_m.h"
#include "ops/gemm_bf16/gemm_bf16_decode.h"
#include "ops/gemm_bf16/gemm_bf16_small_m.h"
#include "ops/gemm_bf16/gemm_bf16_wa.h"
#include "ops/moe_combine/moe_combine.h"
#include "ops/qk_rope/qk_rope.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/route_rows/route_rows.h"
#include "ops/router_topk/router_topk.h"
#include "ops/row_bias/row_bias.h"
#include "ops/synth_pack/synth_pack.h"
#include "core/cuda/dev_buf.cuh"
#include "support/gpu_test_main.h"
#include "support/random_routing.h"

using moesq::DevBuf;

namespace {

// fp32 accumulation on tensor cores vs the twin's fp64 sum of the same exact bf16 products: the
// difference is fp32 rounding of K partial sums, relative to Σ|x·w|.
constexpr double kGemmRelTol = 1e-5;
// Attention (hi + lo output compared): q and P enter the MMAs as bf16 hi + lo (≈ 2^-16 relative
// each), __expf vs std::exp (≈ 2 ulp), fp32 sums in another order: ≈ 1e-6 relative on O(1) outputs.
constexpr double kAttnTcAtol = 2e-5, kAttnTcRtol = 2e-5;
// Router weights: expf (≤ 2 ulp) vs std::exp in the softmax.
constexpr double kRouterAtol = 1e-6;
// Dense SwiGLU hi + lo pairs: ≈ 16 significant bits (see DenseSwigluMatchesRef).
constexpr double kDenseSwigluRelTol = 2e-5;

std::vector<uint16_t> rand_bf16(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = moesq::f32_to_bf16(d(g));
  return v;
}
std::vector<float> rand_f32(size_t n, uint64_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Runs gemm_bf16 and its twin on the same inputs; returns the max error relative to Σ|x·w|.
double check_gemm(int G, int64_t M, int64_t N, int64_t K, const std::vector<int32_t>& counts, bool integer,
                  uint64_t seed, bool accumulate = false, bool split = false) {
  std::vector<uint16_t> x = rand_bf16(G * M * K, seed), w = rand_bf16(G * N * K, seed + 1);
  const std::vector<uint16_t> xl = rand_bf16(G * M * K, seed + 3, 1.0f / 512);  // hi + lo split input
  if (integer) {  // small integers: every partial sum exact in fp32, so kernel == twin exactly
    std::mt19937_64 g(seed);
    for (auto& v : x) v = moesq::f32_to_bf16(static_cast<float>(static_cast<int>(g() % 7) - 3));
    for (auto& v : w) v = moesq::f32_to_bf16(static_cast<float>(static_cast<int>(g() % 7) - 3));
  }
  const int64_t ldy = N + 3;
  std::vector<float> y0 = rand_f32(G * M * ldy, seed + 2);  // prefilled: untouched rows must stay
  DevBuf<uint16_t> dx(x), dw(w), dxl(xl);
  DevBuf<float> dy(y0);
  DevBuf<int32_t> dc(counts.empty() ? std::vector<int32_t>(1) : counts);
  moesq::ops::GemmBf16Args a;
  a.x = dx.p, a.w = dw.p, a.y_f32 = dy.p, a.accumulate = accumulate, a.counts = counts.empty() ? nullptr : dc.p;
  a.groups = G, a.M = M, a.N = N, a.K = K, a.ldy = ldy, a.x_lo = split ? dxl.p : nullptr;
  moesq::ops::gemm_bf16(a, nullptr);
  const std::vector<float> gy = dy.download();
  std::vector<float> ry = y0;
  a.x_lo = split ? xl.data() : nullptr;
  a.x = x.data(), a.w = w.data(), a.y_f32 = ry.data(), a.counts = counts.empty() ? nullptr : counts.data();
  moesq::ops::gemm_bf16_ref(a);
  double worst = 0.0;
  bool nonzero = false;
  for (int g = 0; g < G; ++g)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < ldy; ++n) {
        const int64_t o = (g * M + m) * ldy + n;
        if (n >= N || (!counts.empty() && m >= std::min<int64_t>(counts[g], M))) {
          EXPECT_EQ(bits(gy[o]), bits(y0[o])) << "padding/untouched element changed: g=" << g << " m=" << m << " n=" << n;
          continue;
        }
        double mag = 0.0;
        for (int64_t k = 0; k < K; ++k)
          mag += std::fabs((moesq::bf16_to_f32(x[(g * M + m) * K + k]) + (split ? moesq::bf16_to_f32(xl[(g * M + m) * K + k]) : 0.0f)) *
                           moesq::bf16_to_f32(w[(g * N + n) * K + k]));
        if (integer) {
          EXPECT_EQ(gy[o], ry[o]) << "integer case M=" << M << " N=" << N << " K=" << K << " g=" << g << " m=" << m << " n=" << n;
        }
        worst = std::max(worst, std::fabs(gy[o] - ry[o]) / std::max(mag, 1e-30));
        nonzero |= gy[o] != 0.0f;
      }
  EXPECT_TRUE(nonzero) << "all-zero output M=" << M << " N=" << N << " K=" << K;
  return worst;
}

}  // namespace

TEST(EngineOps, GemmBf16AwkwardShapes) {
  for (int64_t M : {1, 2, 3, 63, 65, 130})
    for (int64_t N : {64, 100})
      for (int64_t K : {32, 40, 264}) {
        const double e = check_gemm(1, M, N, K, {}, false, 100 + M * 7 + N + K);
        EXPECT_LE(e, kGemmRelTol) << "M=" << M << " N=" << N << " K=" << K;
      }
}

TEST(EngineOps, GemmBf16GroupedCountsAndIntegerExact) {
  // Ragged groups: an empty expert, a partial one, a full one, a count above M (clamped).
  EXPECT_LE(check_gemm(4, 70, 96, 256, {0, 5, 70, 99}, false, 7), kGemmRelTol);
  EXPECT_EQ(check_gemm(2, 33, 64, 512, {33, 17}, true, 8), 0.0);
  EXPECT_LE(check_gemm(1, 9, 72, 128, {}, false, 9, /*accumulate=*/true), kGemmRelTol);
  EXPECT_LE(check_gemm(3, 65, 64, 264, {65, 0, 7}, false, 10, false, /*split=*/true), kGemmRelTol);
}

TEST(EngineOps, GemmBf16BatchInvariant) {
  // Row r of x gives the same bits whatever M (1 … 200) and wherever it sits in the tile.
  const int64_t N = 136, K = 512, Mmax = 200;
  const std::vector<uint16_t> x = rand_bf16(Mmax * K, 11), w = rand_bf16(N * K, 12);
  DevBuf<uint16_t> dw(w);
  std::vector<float> ref_row;
  for (int64_t M : {1, 2, 64, 65, 200}) {
    for (int64_t at : {int64_t(0), M - 1}) {
      std::vector<uint16_t> xm = rand_bf16(M * K, 13 + M);
      std::copy(x.begin(), x.begin() + K, xm.begin() + at * K);
      DevBuf<uint16_t> dx(xm);
      DevBuf<float> dy(M * N);
      moesq::ops::GemmBf16Args a;
      a.x = dx.p, a.w = dw.p, a.y_f32 = dy.p, a.M = M, a.N = N, a.K = K, a.ldy = N;
      moesq::ops::gemm_bf16(a, nullptr);
      const std::vector<float> y = dy.download();
      std::vector<float> row(y.begin() + at * N, y.begin() + (at + 1) * N);
      if (ref_row.empty()) ref_row = row;
      for (int64_t n = 0; n < N; ++n) ASSERT_EQ(bits(row[n]), bits(ref_row[n])) << "M=" << M << " row at " << at << " n=" << n;
    }
  }
}

// Split-K by K-fixed slices: vs the twin (accumulate, hi + lo input), and row 0's bits the same at M = 1
// and M = 130 (the slice count depends on K alone).
TEST(EngineOps, GemmBf16SplitKMatchesRefAndIsBatchInvariant) {
  const int64_t N = 136;
  for (int64_t K : {200, 1280, 4096}) {
    std::vector<float> row0;
    for (int64_t M : {1, 130}) {
      const std::vector<uint16_t> x = rand_bf16(M * K, 21 + K), w = rand_bf16(N * K, 22 + K);
      const std::vector<uint16_t> xl = rand_bf16(M * K, 23 + K, 1.0f / 512);
      const std::vector<float> y0 = rand_f32(M * (N + 5), 24);
      DevBuf<uint16_t> dx(x), dw(w), dxl(xl);
      DevBuf<float> dy(y0), dws(moesq::ops::gemm_bf16_split_floats(M, N, K));
      moesq::ops::GemmBf16Args a;
      a.x = dx.p, a.x_lo = dxl.p, a.w = dw.p, a.y_f32 = dy.p, a.accumulate = true, a.M = M, a.N = N, a.K = K;
      a.ldy = N + 5, a.split_ws = dws.p;
      moesq::ops::gemm_bf16(a, nullptr);
      const std::vector<float> gy = dy.download();
      std::vector<float> ry = y0;
      a.x = x.data(), a.x_lo = xl.data(), a.w = w.data(), a.y_f32 = ry.data(), a.split_ws = nullptr;
      moesq::ops::gemm_bf16_ref(a);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < a.ldy; ++n) {
          const int64_t o = m * a.ldy + n;
          if (n >= N) {
            ASSERT_EQ(bits(gy[o]), bits(y0[o])) << "padding column changed K=" << K;
            continue;
          }
          double mag = std::fabs(y0[o]);
          for (int64_t k = 0; k < K; ++k)
            mag += std::fabs((moesq::bf16_to_f32(x[m * K + k]) + moesq::bf16_to_f32(xl[m * K + k])) *
                             moesq::bf16_to_f32(w[n * K + k]));
          ASSERT_LE(std::fabs(gy[o] - ry[o]), kGemmRelTol * mag) << "K=" << K << " M=" << M << " m=" << m << " n=" << n;
        }
      // Row 0 with the same inputs at both M (x, w, y0 share seeds; row 0 of x is the same draw).
      std::vector<float> r(gy.begin(), gy.begin() + N);
      if (row0.empty()) row0 = r;
      for (int64_t n = 0; n < N; ++n) ASSERT_EQ(bits(r[n]), bits(row0[n])) << "K=" << K << " M=" << M << " n=" << n;
    }
  }
}

// The small-M path (M ≤ 64: one chain per warp, cp.async ring, slices added in the kernel) and the
// decode path (a CTA of 128 columns and every token, split slices folded across a cluster) give every
// row the bits of the 64×64 tile kernel (M = 80): grouped with counts, bf16 output, hi + lo input,
// accumulate, split-K (2 to 8 slices, a partial last one), N and K off the tile sizes.
TEST(EngineOps, GemmBf16SmallMBitsEqualTileKernel) {
  struct Case {
    int G;
    int64_t N, K;
    bool lo, split, bf16, accumulate, counts;
  };
  const Case cases[] = {{1, 128, 2048, false, true, false, false, false}, {1, 136, 2048, true, true, false, true, false},
                        {1, 100, 200, true, false, false, false, false},  {3, 96, 264, false, false, true, false, true},
                        {2, 72, 4096, true, true, false, false, false},   {1, 40, 7168, false, true, false, true, false},
                        {1, 264, 2600, true, true, false, true, false},   // 6 slices, the last of 40
                        {1, 72, 4096, true, true, false, false, false}};  // 8 slices: the decode path's largest cluster
  // token_tiles: the small-M kernel's 16-token tiles per staged W tile (1, 2, 4; gemm_bf16_small_m.h);
  // 0 / −1 / −2: the decode path (gemm_bf16_decode.h) at 16 / 32 / 32 columns per warp (−2: two warp
  // rows, each half the token tiles), −3 its wgmma form (gemm_bf16_decode_wg), which take at most
  // kGemmDecodeMaxSlices slices (K = 7168 has 14: the small-M kernel's).
  for (int token_tiles : {1, 2, 4, 0, -1, -2, -3})
  for (const Case& c : cases)
    for (int64_t m : {1, 5, 16, 33, 64}) {
      if (c.split && c.G != 1) continue;
      if (token_tiles <= 0 && c.split && (c.K + moesq::ops::kGemmSplitK - 1) / moesq::ops::kGemmSplitK >
                                             moesq::ops::detail::kGemmDecodeMaxSlices)
        continue;
      const int64_t Mbig = 80, ldy = c.N + 3;
      const std::vector<uint16_t> w = rand_bf16(c.G * c.N * c.K, 31 + c.K);
      const std::vector<uint16_t> xb = rand_bf16(c.G * Mbig * c.K, 32 + c.K), lb = rand_bf16(c.G * Mbig * c.K, 33, 1.0f / 512);
      const std::vector<float> yb = rand_f32(c.G * Mbig * ldy, 34);
      // The small run's operands: the first m rows of every group of the big run.
      std::vector<uint16_t> xs(c.G * m * c.K), ls(c.G * m * c.K);
      std::vector<float> ys(c.G * m * ldy);
      for (int g = 0; g < c.G; ++g) {
        std::copy_n(xb.begin() + g * Mbig * c.K, m * c.K, xs.begin() + g * m * c.K);
        std::copy_n(lb.begin() + g * Mbig * c.K, m * c.K, ls.begin() + g * m * c.K);
        std::copy_n(yb.begin() + g * Mbig * ldy, m * ldy, ys.begin() + g * m * ldy);
      }
      std::vector<int32_t> cnt_big(c.G), cnt_small(c.G);
      for (int g = 0; g < c.G; ++g) cnt_small[g] = static_cast<int32_t>(std::max<int64_t>(m - g, 0)), cnt_big[g] = cnt_small[g];
      auto run = [&](int64_t M, const std::vector<uint16_t>& x, const std::vector<uint16_t>& l, const std::vector<float>& y0,
                     const std::vector<int32_t>& cnt) {
        DevBuf<uint16_t> dx(x), dl(l), dw(w), dyb(std::vector<uint16_t>(y0.size(), 0x7fc1));
        DevBuf<float> dy(y0), dws(c.split ? moesq::ops::gemm_bf16_split_floats(M, c.N, c.K) : 1);
        DevBuf<int32_t> dc(cnt);
        moesq::ops::GemmBf16Args a;
        a.x = dx.p, a.x_lo = c.lo ? dl.p : nullptr, a.w = dw.p, a.groups = c.G, a.M = M, a.N = c.N, a.K = c.K, a.ldy = ldy;
        a.accumulate = c.accumulate, a.counts = c.counts ? dc.p : nullptr, a.split_ws = c.split ? dws.p : nullptr;
        if (c.bf16) a.y_bf16 = dyb.p; else a.y_f32 = dy.p;
        if (M <= moesq::ops::detail::kGemmSmallM) {
          moesq::ops::gemm_bf16_check(a);
          if (token_tiles <= 0) {
            EXPECT_TRUE(moesq::ops::detail::gemm_bf16_decode_fits(a));
            if (token_tiles == -3)
              moesq::ops::detail::gemm_bf16_decode_wg(a, nullptr);
            else
              moesq::ops::detail::gemm_bf16_decode(a, nullptr, token_tiles == 0 ? 16 : 32, token_tiles == -2 ? 2 : 1);
          } else {
            EXPECT_TRUE(moesq::ops::detail::gemm_bf16_small_m_fits(a));
            moesq::ops::detail::gemm_bf16_small_m(a, nullptr, token_tiles);
          }
        } else {
          moesq::ops::gemm_bf16(a, nullptr);
        }
        std::vector<uint32_t> out;
        if (c.bf16) for (uint16_t v : dyb.download()) out.push_back(v);
        else for (float v : dy.download()) out.push_back(bits(v));
        return out;
      };
      const std::vector<uint32_t> big = run(Mbig, xb, lb, yb, cnt_big), small = run(m, xs, ls, ys, cnt_small);
      for (int g = 0; g < c.G; ++g)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t n = 0; n < ldy; ++n)
            ASSERT_EQ(small[(g * m + r) * ldy + n], big[(g * Mbig + r) * ldy + n])
                << "N=" << c.N << " K=" << c.K << " lo=" << c.lo << " split=" << c.split << " bf16=" << c.bf16
                << " M=" << m << " token_tiles=" << token_tiles << " g=" << g << " row " << r << " col " << n;
    }
}

// The large-M path (detail::gemm_bf16_large_m: 128×128 tiles, mma.sync m16n8k16, 3-stage cp.async) gives
// a row the bits the small-M path gives it alone (M = 1), wherever the row sits — first/last row of a
// 128-row tile, of a warp's 64-row half, past the first tile — with hi + lo input, accumulate, bf16
// output, grouped counts, N and K off the tile sizes; the whole output is the 64×64 tile kernel's at
// the same M, bit for bit (so the ref's tolerance tests of the tile kernel hold for it too).
// The W-as-A decode path (gemm_bf16_wa.h, opt-in) against the 64×64 tile kernel: every output bit
// equal, M = 1…8, with and without hi + lo, split slices (K = 2048, 4096 and a partial last slice),
// K not a multiple of 64 or 16 (zero past the range), N not a multiple of 16, fp32 (accumulate) and bf16
// outputs. It holds only if an mma.m16n8k16 element keeps its bits with the operands swapped
// (bench/probe_mma_order.cu); failing here keeps the path off.
TEST(EngineOps, GemmBf16WaBitsEqualTileKernel) {
  struct Case {
    int64_t N, K;
    bool lo, split, bf16, accumulate;
  };
  const Case cases[] = {{128, 2048, true, true, false, false}, {136, 2056, true, true, false, true},
                        {100, 200, false, false, false, false}, {72, 4096, true, true, false, false},
                        {40, 1096, false, true, false, true},    {520, 264, true, false, true, false},
                        {72, 8192, false, true, false, true}};
  // K slices of 512: 4, 5, 1 (no split), 8, 3, 1, 16 — CTAs of 2 tiles × 4 warps, 1 × 5, 8 × 1, 1 × 8,
  // 2 × 3, 8 × 1 and 1 × 8 warps taking 2 slices each (CtaShape in gemm_bf16_wa.cu); every register depth.
  for (int depth : {3, 4, 6})
  for (const Case& c : cases)
    for (int64_t M : {1, 3, 8}) {
      const int64_t ldy = c.N + 3;
      const std::vector<uint16_t> w = rand_bf16(c.N * c.K, 41 + c.K), x = rand_bf16(M * c.K, 42 + M),
                                  l = rand_bf16(M * c.K, 43 + M, 1.0f / 512);
      const std::vector<float> y0 = rand_f32(M * ldy, 44);
      auto run = [&](bool wa) {
        DevBuf<uint16_t> dx(x), dl(l), dw(w), dyb(std::vector<uint16_t>(M * ldy, 0x7fc1));
        DevBuf<float> dy(y0), dws(c.split ? moesq::ops::gemm_bf16_split_floats(M, c.N, c.K) : 1);
        moesq::ops::GemmBf16Args a;
        a.x = dx.p, a.x_lo = c.lo ? dl.p : nullptr, a.w = dw.p, a.M = M, a.N = c.N, a.K = c.K, a.ldy = ldy;
        a.accumulate = c.accumulate, a.split_ws = c.split ? dws.p : nullptr;
        if (c.bf16) a.y_bf16 = dyb.p; else a.y_f32 = dy.p;
        moesq::ops::gemm_bf16_check(a);
        if (wa) {
          EXPECT_TRUE(moesq::ops::detail::gemm_bf16_wa_fits(a));
          moesq::ops::detail::gemm_bf16_wa(a, nullptr, depth);
        } else {
          moesq::ops::detail::gemm_bf16_tile(a, nullptr);
        }
        MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint32_t> out;
        if (c.bf16) for (uint16_t v : dyb.download()) out.push_back(v);
        else for (float v : dy.download()) out.push_back(bits(v));
        return out;
      };
      const std::vector<uint32_t> tile = run(false), wa = run(true);
      int64_t diff = 0, first = -1;
      for (size_t i = 0; i < tile.size(); ++i)
        if (tile[i] != wa[i]) diff += 1, first = first < 0 ? static_cast<int64_t>(i) : first;
      EXPECT_EQ(diff, 0) << "N=" << c.N << " K=" << c.K << " lo=" << c.lo << " split=" << c.split << " bf16=" << c.bf16
                         << " M=" << M << " depth=" << depth << ": first differing index " << first;
    }
}

TEST(EngineOps, GemmBf16LargeMBitsEqualRowAlone) {
  struct Case {
    int G;
    int64_t M, N, K;
    bool lo, bf16, accumulate, counts;
  };
  const Case cases[] = {{1, 300, 136, 2048, false, false, false, false}, {1, 300, 260, 264, true, false, true, false},
                        {1, 129, 128, 4096, true, true, false, false},   {2, 200, 72, 512, false, false, false, true},
                        {1, 1000, 40, 96, false, true, false, false},    {3, 150, 520, 128, true, false, false, false},
                        {1, 260, 520, 2048, true, false, true, false}};
  // ({3, 150, 520, 128}: groups without counts, as the MLA block's per-head W_UKᵀ / W_UV GEMMs, which
  // gemm_bf16 sends to the large-M path at ≥ 128 tiles.)
  // (bf16 output never accumulates, and split_ws takes no counts: gemm_bf16_check refuses both.)
  // The last case also runs with split_ws: the fixed K slices folded in registers, as the engine's
  // q|k|v and o_proj call it (vs the tile kernel's partials + split_reduce).
  for (bool split : {false, true})
  for (const Case& c : cases) {
    if (split && (c.K < 1024 || c.bf16 || c.G != 1)) continue;  // split: one group, fp32 out, ≥ 2 slices
    const int64_t ldy = c.N + 3;
    const std::vector<uint16_t> w = rand_bf16(c.G * c.N * c.K, 41 + c.K);
    const std::vector<uint16_t> x = rand_bf16(c.G * c.M * c.K, 42 + c.M), l = rand_bf16(c.G * c.M * c.K, 43, 1.0f / 512);
    const std::vector<float> y0 = rand_f32(c.G * c.M * ldy, 44);
    std::vector<int32_t> cnt(c.G);
    for (int g = 0; g < c.G; ++g) cnt[g] = static_cast<int32_t>(c.M - 70 * g);  // group 1: a ragged last tile
    auto run = [&](int G, int64_t M, const std::vector<uint16_t>& xs, const std::vector<uint16_t>& ls,
                   const std::vector<uint16_t>& ws, const std::vector<float>& ys, const std::vector<int32_t>& cs,
                   bool tile = false) {
      DevBuf<uint16_t> dx(xs), dl(ls), dw(ws), dyb(std::vector<uint16_t>(ys.size(), 0x7fc1));
      DevBuf<float> dy(ys), dws(split && G == 1 ? moesq::ops::gemm_bf16_split_floats(M, c.N, c.K) : 1);
      DevBuf<int32_t> dc(cs);
      moesq::ops::GemmBf16Args a;
      a.x = dx.p, a.x_lo = c.lo ? dl.p : nullptr, a.w = dw.p, a.groups = G, a.M = M, a.N = c.N, a.K = c.K, a.ldy = ldy;
      a.accumulate = c.accumulate, a.counts = c.counts ? dc.p : nullptr, a.split_ws = split && G == 1 ? dws.p : nullptr;
      if (c.bf16) a.y_bf16 = dyb.p; else a.y_f32 = dy.p;
      if (tile) moesq::ops::detail::gemm_bf16_tile(a, nullptr);  // the 64×64 kernel at the same M
      else if (M > 64) moesq::ops::detail::gemm_bf16_large_m(a, nullptr);
      else moesq::ops::gemm_bf16(a, nullptr);  // the small-M path (M = 1: the row alone)
      std::vector<uint32_t> out;
      if (c.bf16) for (uint16_t v : dyb.download()) out.push_back(v);
      else for (float v : dy.download()) out.push_back(bits(v));
      return out;
    };
    const std::vector<uint32_t> big = run(c.G, c.M, x, l, w, y0, cnt);
    const std::vector<uint32_t> tile = run(c.G, c.M, x, l, w, y0, cnt, true);
    ASSERT_EQ(big.size(), tile.size());
    size_t differ = 0;
    for (size_t i = 0; i < big.size(); ++i) differ += big[i] != tile[i];
    ASSERT_EQ(differ, 0u) << "large-M and 64×64 tile kernels differ: M=" << c.M << " N=" << c.N << " K=" << c.K
                          << " split=" << split;
    for (int g = 0; g < c.G; ++g)
      for (int64_t r : {int64_t(0), int64_t(1), int64_t(63), int64_t(64), int64_t(127), int64_t(128), c.M - 71, c.M - 1}) {
        if (r < 0 || r >= c.M) continue;
        const bool valid = !c.counts || r < cnt[g];
        const auto row_of = [&](const auto& v, int64_t len) {
          return std::vector<typename std::decay_t<decltype(v)>::value_type>(v.begin() + (g * c.M + r) * len,
                                                                             v.begin() + (g * c.M + r + 1) * len);
        };
        const std::vector<uint16_t> wg(w.begin() + g * c.N * c.K, w.begin() + (g + 1) * c.N * c.K);
        const std::vector<uint32_t> alone = run(1, 1, row_of(x, c.K), row_of(l, c.K), wg, row_of(y0, ldy), {1});
        for (int64_t n = 0; n < ldy; ++n) {
          const uint32_t got = big[(g * c.M + r) * ldy + n];
          // Rows past a group's count and the ldy padding stay as they were (y0, or the bf16 poison).
          const uint32_t want = valid && n < c.N ? alone[n] : c.bf16 ? 0x7fc1u : bits(y0[(g * c.M + r) * ldy + n]);
          ASSERT_EQ(got, want) << "M=" << c.M << " N=" << c.N << " K=" << c.K << " lo=" << c.lo << " bf16=" << c.bf16
                               << " split=" << split << " g=" << g << " row " << r << " col " << n;
        }
      }
  }
}

TEST(EngineOps, RmsNormBitwise) {
  for (int64_t D : {64, 256, 2048, 300}) {
    const int64_t n = 5;
    const std::vector<float> x = rand_f32(n * D, D, 2.0f, 0.3f), w = rand_f32(D, D + 1, 0.2f, 1.0f);
    DevBuf<float> dx(x), dw(w);
    DevBuf<uint16_t> dy(n * D), dyl(n * D);
    moesq::ops::RmsNormArgs a;
    a.x = dx.p, a.w = dw.p, a.y = dy.p, a.y_lo = dyl.p, a.n = n, a.D = D, a.eps = 1e-6;
    moesq::ops::rmsnorm(a, nullptr);
    std::vector<uint16_t> ry(n * D), ryl(n * D);
    a.x = x.data(), a.w = w.data(), a.y = ry.data(), a.y_lo = ryl.data();
    moesq::ops::rmsnorm_ref(a);
    const std::vector<uint16_t> gy = dy.download(), gyl = dyl.download();
    for (int64_t i = 0; i < n * D; ++i) ASSERT_EQ(gy[i], ry[i]) << "D=" << D << " first bad index " << i;
    for (int64_t i = 0; i < n * D; ++i) ASSERT_EQ(gyl[i], ryl[i]) << "D=" << D << " lo part, first bad index " << i;
  }
}

// Also the hybrids' gated attention layout (q heads [query | gate], QkRopeArgs::q_gate) with partial
// RoPE over `rot` of the head's dims (Qwen3-Next: 8 of 32 → here a quarter and a half of hd).
TEST(EngineOps, QkRopeBitwise) {
  struct Variant {
    int hd, rot;
    bool gate;
  };
  for (const Variant var : {Variant{64, 0, false}, Variant{128, 0, false}, Variant{64, 16, true}, Variant{256, 64, true}}) {
    const int hd = var.hd;
    const int nh = 4, nkv = 2, slots = 3, T = 7;
    const int64_t max_len = 16, W = ((var.gate ? 2 * nh : nh) + 2 * nkv) * hd;
    const int half = (var.rot > 0 ? var.rot : hd) / 2;
    const std::vector<float> qkv = rand_f32(T * W, hd, 1.5f), qn = rand_f32(hd, 2, 0.1f, 1.0f), kn = rand_f32(hd, 3, 0.1f, 1.0f);
    std::vector<float> cs(max_len * half), sn(max_len * half);
    for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.37f * i), sn[i] = std::sin(0.37f * i);
    const std::vector<int32_t> slot = {0, 2, 2, 1, 0, 2, 1}, pos = {0, 3, 4, 15, 1, 5, 0};
    const size_t cache_n = slots * max_len * nkv * hd;
    DevBuf<float> dqkv(qkv), dqn(qn), dkn(kn), dcs(cs), dsn(sn), dq(T * nh * hd);
    DevBuf<int32_t> dslot(slot), dpos(pos);
    DevBuf<uint16_t> dk(std::vector<uint16_t>(cache_n, 0)), dv(std::vector<uint16_t>(cache_n, 0));
    moesq::ops::QkRopeArgs a;
    a.qkv = dqkv.p, a.q_norm = dqn.p, a.k_norm = dkn.p, a.cos = dcs.p, a.sin = dsn.p, a.tok_slot = dslot.p;
    a.tok_pos = dpos.p, a.q_out = dq.p, a.k_cache = dk.p, a.v_cache = dv.p, a.T = T, a.nh = nh, a.nkv = nkv;
    a.hd = hd, a.max_len = max_len, a.rot = var.rot, a.q_gate = var.gate;
    moesq::ops::qk_rope(a, nullptr);
    std::vector<float> rq(T * nh * hd);
    std::vector<uint16_t> rk(cache_n, 0), rv(cache_n, 0);
    a.qkv = qkv.data(), a.q_norm = qn.data(), a.k_norm = kn.data(), a.cos = cs.data(), a.sin = sn.data();
    a.tok_slot = slot.data(), a.tok_pos = pos.data(), a.q_out = rq.data(), a.k_cache = rk.data(), a.v_cache = rv.data();
    moesq::ops::qk_rope_ref(a);
    const auto gq = dq.download();
    const auto gk = dk.download(), gv = dv.download();
    for (size_t i = 0; i < rq.size(); ++i) ASSERT_EQ(bits(gq[i]), bits(rq[i])) << "hd=" << hd << " q index " << i;
    for (size_t i = 0; i < cache_n; ++i) ASSERT_EQ(gk[i], rk[i]) << "hd=" << hd << " k cache index " << i;
    for (size_t i = 0; i < cache_n; ++i) ASSERT_EQ(gv[i], rv[i]) << "hd=" << hd << " v cache index " << i;
    EXPECT_NE(std::count(gk.begin(), gk.end(), 0), static_cast<long>(cache_n));
  }
}

// Runs the prefill path (tiles) and the split-KV path on the same tokens: both against the twin
// (tolerance on hi + lo), and against each other BITWISE (the decode = prefill contract).
void check_attention(int hd, int nh, int nkv, const std::vector<int>& lens, uint64_t seed, int64_t window = 0,
                     bool with_sinks = false, bool with_gate = false) {
  const int slots = static_cast<int>(lens.size());
  const int64_t max_len = *std::max_element(lens.begin(), lens.end()) + 3;
  std::vector<int32_t> slot, pos;  // every slot's full causal prefill, slots interleaved in blocks
  for (int s = 0; s < slots; ++s)
    for (int p = 0; p < lens[s]; ++p) slot.push_back(s), pos.push_back(p);
  const int64_t T = slot.size();
  const size_t cache_n = slots * max_len * nkv * hd;
  const std::vector<float> q = rand_f32(T * nh * hd, seed, 0.5f);
  std::vector<uint16_t> kc = rand_bf16(cache_n, seed + 1), vc = rand_bf16(cache_n, seed + 2);
  // Keys past a slot's length hold NaN: they must never be read into a result.
  for (int s = 0; s < slots; ++s)
    for (int64_t j = lens[s]; j < max_len; ++j)
      for (int c = 0; c < nkv * hd; ++c) kc[(s * max_len + j) * nkv * hd + c] = vc[(s * max_len + j) * nkv * hd + c] = 0x7fc0;
  const std::vector<int32_t> tiles = moesq::ops::attention_tiles(slot.data(), pos.data(), T, nh, nkv);
  DevBuf<float> dq(q), dpart(moesq::ops::attention_partial_floats(T, nh, hd, max_len));
  DevBuf<uint16_t> dk(kc), dv(vc), dout(T * nh * hd), dlo(T * nh * hd), dout2(T * nh * hd), dlo2(T * nh * hd);
  DevBuf<int32_t> dslot(slot), dpos(pos), dtiles(tiles);
  const std::vector<float> sinks = rand_f32(nh, seed + 3, 2.0f);
  DevBuf<float> dsinks(sinks);
  // The hybrids' output gate, laid out as the q|k|v buffer holds it: each head's [query | gate].
  const std::vector<float> gates = rand_f32(T * nh * 2 * hd, seed + 4, 2.0f);
  DevBuf<float> dgates(gates);
  moesq::ops::AttentionArgs a;
  a.q = dq.p, a.k_cache = dk.p, a.v_cache = dv.p, a.tok_slot = dslot.p, a.tok_pos = dpos.p, a.out = dout.p, a.out_lo = dlo.p;
  a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len, a.scale = 1.0f / std::sqrt(float(hd));
  a.window = window, a.sinks = with_sinks ? dsinks.p : nullptr;
  if (with_gate) a.gate = dgates.p + hd, a.gate_ld = int64_t{nh} * 2 * hd, a.gate_head_ld = 2 * hd;
  a.tiles = dtiles.p, a.n_tiles = static_cast<int64_t>(tiles.size() / 2);
  moesq::ops::attention(a, nullptr);
  a.tiles = nullptr, a.n_tiles = 0, a.partial = dpart.p, a.out = dout2.p, a.out_lo = dlo2.p;
  moesq::ops::attention(a, nullptr);
  // The last token alone through the split path: same bits as inside the batch.
  moesq::ops::AttentionArgs one = a;
  DevBuf<uint16_t> dout3(nh * hd), dlo3(nh * hd);
  one.q = dq.p + (T - 1) * nh * hd, one.tok_slot = dslot.p + T - 1, one.tok_pos = dpos.p + T - 1, one.T = 1;
  if (one.gate) one.gate += (T - 1) * one.gate_ld;  // the token's own gate row
  one.out = dout3.p, one.out_lo = dlo3.p;
  moesq::ops::attention(one, nullptr);
  std::vector<uint16_t> ro(T * nh * hd), rlo(T * nh * hd);
  moesq::ops::AttentionArgs r = a;
  r.q = q.data(), r.k_cache = kc.data(), r.v_cache = vc.data(), r.tok_slot = slot.data(), r.tok_pos = pos.data();
  r.out = ro.data(), r.out_lo = rlo.data(), r.partial = nullptr, r.sinks = with_sinks ? sinks.data() : nullptr;
  r.gate = with_gate ? gates.data() + hd : nullptr;
  moesq::ops::attention_ref(r);
  const auto go = dout.download(), gl = dlo.download(), so = dout2.download(), sl = dlo2.download();
  const auto oo = dout3.download(), ol = dlo3.download();
  double worst = 0.0;
  for (size_t i = 0; i < ro.size(); ++i) {
    ASSERT_EQ(go[i], so[i]) << "prefill vs split-KV bits differ: hd=" << hd << " G=" << nh / nkv << " token " << i / (nh * hd)
                            << " head " << (i / hd) % nh << " elem " << i % hd;
    ASSERT_EQ(gl[i], sl[i]) << "prefill vs split-KV lo bits differ, hd=" << hd << " token " << i / (nh * hd);
    const float g = moesq::bf16_to_f32(go[i]) + moesq::bf16_to_f32(gl[i]);
    const float e = moesq::bf16_to_f32(ro[i]) + moesq::bf16_to_f32(rlo[i]);
    ASSERT_TRUE(std::isfinite(g)) << "non-finite output (a NaN key past the length was read?) index " << i;
    worst = std::max(worst, std::fabs(g - e) / (kAttnTcAtol + kAttnTcRtol * std::fabs(e)));
  }
  for (int i = 0; i < nh * hd; ++i) {
    ASSERT_EQ(oo[i], so[(T - 1) * nh * hd + i]) << "token alone vs in batch, elem " << i;
    ASSERT_EQ(ol[i], sl[(T - 1) * nh * hd + i]) << "token alone vs in batch (lo), elem " << i;
  }
  EXPECT_LE(worst, 1.0) << "hd=" << hd << " nh=" << nh << " nkv=" << nkv << " (error / tolerance)";
  // Position 0 attends to exactly one key: the output is that key's v row, exactly (without a sink).
  for (int h = 0; h < nh && !with_sinks && !with_gate; ++h)
    for (int c = 0; c < hd; ++c)
      EXPECT_EQ(go[h * hd + c], vc[(h / (nh / nkv)) * hd + c]) << "single-key case, head " << h << " elem " << c;
}

TEST(EngineOps, AttentionPrefillSplitAndRef) {
  // Lengths around the 64-key chunk edges; G = nh / nkv of the tiny fixture (2), Qwen3-30B (8), -235B (16).
  check_attention(64, 4, 2, {1, 63, 64, 65, 130}, 11);
  check_attention(128, 32, 4, {200, 1, 129, 64}, 12);
  check_attention(128, 16, 1, {70, 3}, 13);
  check_attention(64, 8, 8, {33, 97}, 14);
}

// gpt-oss's sliding-window layers and attention sinks: both paths against the twin and against each
// other bitwise; windows equal to, below and not a multiple of the 64-key chunk, prompts past them.
TEST(EngineOps, AttentionSlidingWindowAndSinks) {
  check_attention(64, 4, 2, {1, 64, 65, 130, 300}, 21, 64, true);   // the tiny gpt-oss shape (window 64)
  check_attention(64, 4, 2, {200, 7}, 22, 100, false);
  check_attention(64, 4, 2, {200, 7}, 23, 0, true);                 // sinks on a full-attention layer
  check_attention(64, 64, 8, {700, 129}, 24, 128, true);            // gpt-oss-120b: 64 heads, 8 kv, window 128
  check_attention(32, 4, 4, {90}, 25, 1, false);                    // a window of one key
}

// The hybrids' output gate σ(gate) (AttentionArgs::gate): both paths against the twin and each other
// bitwise, at the tiny fixtures' shape (hd 32, 4 heads, 2 kv) and at Qwen3-Next-80B's / Qwen3.5-397B's
// (hd 256 — the prefill kernel spills at that width, 460 B — 16 heads of 2 kv, G = 8), and hd 256 without a gate.
TEST(EngineOps, AttentionOutputGate) {
  check_attention(32, 4, 2, {1, 64, 65, 130}, 31, 0, false, true);
  check_attention(256, 16, 2, {200, 3, 64}, 32, 0, false, true);
  check_attention(256, 32, 2, {70}, 33);
}

// Decode rows whose sequences live in slots {3, 1, 0} of a 4-slot cache (the engine's decode over
// any live slots: tok_slot is the per-row slot table) give, bit for bit, each row alone with its
// sequence in slot 0 of a 1-slot cache, through the split-KV path and through the prefill path.
TEST(EngineOps, AttentionAnySlotTableEqualsSlotZero) {
  for (int hd : {64, 128}) {
    const int nh = 8, nkv = 2, slots = 4;
    const int64_t max_len = 200, slot_w = max_len * nkv * hd;
    const std::vector<int32_t> slot = {3, 1, 0}, pos = {199, 64, 0};
    const int64_t T = slot.size();
    const std::vector<float> q = rand_f32(T * nh * hd, 31 + hd, 0.5f);
    const std::vector<uint16_t> kc = rand_bf16(slots * slot_w, 32 + hd), vc = rand_bf16(slots * slot_w, 33 + hd);
    const std::vector<int32_t> tiles = moesq::ops::attention_tiles(slot.data(), pos.data(), T, nh, nkv);
    DevBuf<float> dq(q), dpart(moesq::ops::attention_partial_floats(T, nh, hd, max_len));
    DevBuf<uint16_t> dk(kc), dv(vc), dout(T * nh * hd), dlo(T * nh * hd), dpre(T * nh * hd), dprelo(T * nh * hd);
    DevBuf<int32_t> dslot(slot), dpos(pos), dtiles(tiles);
    moesq::ops::AttentionArgs a;
    a.q = dq.p, a.k_cache = dk.p, a.v_cache = dv.p, a.tok_slot = dslot.p, a.tok_pos = dpos.p, a.out = dout.p;
    a.out_lo = dlo.p, a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
    a.scale = 1.0f / std::sqrt(float(hd)), a.partial = dpart.p;
    moesq::ops::attention(a, nullptr);
    moesq::ops::AttentionArgs pre = a;
    pre.partial = nullptr, pre.tiles = dtiles.p, pre.n_tiles = static_cast<int64_t>(tiles.size() / 2);
    pre.out = dpre.p, pre.out_lo = dprelo.p;
    moesq::ops::attention(pre, nullptr);
    const auto go = dout.download(), gl = dlo.download(), po = dpre.download(), pl = dprelo.download();
    for (int64_t t = 0; t < T; ++t) {
      DevBuf<uint16_t> k1(kc.data() + slot[t] * slot_w, slot_w), v1(vc.data() + slot[t] * slot_w, slot_w);
      DevBuf<uint16_t> o1(nh * hd), l1(nh * hd);
      DevBuf<int32_t> zero(std::vector<int32_t>{0}), p1(std::vector<int32_t>{pos[t]});
      moesq::ops::AttentionArgs b = a;
      b.q = dq.p + t * nh * hd, b.k_cache = k1.p, b.v_cache = v1.p, b.tok_slot = zero.p, b.tok_pos = p1.p;
      b.out = o1.p, b.out_lo = l1.p, b.T = 1;
      moesq::ops::attention(b, nullptr);
      const auto oo = o1.download(), ol = l1.download();
      for (int i = 0; i < nh * hd; ++i) {
        const size_t r = t * nh * hd + i;
        ASSERT_EQ(go[r], oo[i]) << "hd=" << hd << " row " << t << " (slot " << slot[t] << ") split-KV elem " << i;
        ASSERT_EQ(gl[r], ol[i]) << "hd=" << hd << " row " << t << " (slot " << slot[t] << ") split-KV lo elem " << i;
        ASSERT_EQ(po[r], oo[i]) << "hd=" << hd << " row " << t << " (slot " << slot[t] << ") prefill elem " << i;
        ASSERT_EQ(pl[r], ol[i]) << "hd=" << hd << " row " << t << " (slot " << slot[t] << ") prefill lo elem " << i;
      }
      EXPECT_NE(std::count(oo.begin(), oo.end(), uint16_t{0}), nh * hd) << "row " << t << " all zeros";
    }
  }
}

// Paged KV (ops/attention/kv_layout.h): the same two sequences written by qk_rope into scrambled
// 64-token blocks of a larger cache (blocks nobody owns, and rows past a sequence's end, hold NaN)
// give the contiguous layout's bits: the appended rows, the prefill path and the split-KV path.
TEST(EngineOps, PagedKvEqualsContiguousBitwise) {
  for (int hd : {64, 128}) {
    const int nh = 8, nkv = 2, slots = 2, W = (nh + 2 * nkv) * hd;
    const int64_t max_len = 200, row_w = nkv * hd, kv_blocks = 11;
    ASSERT_EQ(moesq::ops::kv_blocks_per_slot(max_len), 4);
    const std::vector<int32_t> table = {7, 2, 9, 0, 4, 10, 1, 5};
    const std::vector<int> lens = {130, 200};
    std::vector<int32_t> slot, pos;
    for (int s = 0; s < slots; ++s)
      for (int p = 0; p < lens[s]; ++p) slot.push_back(s), pos.push_back(p);
    const int64_t T = slot.size();
    const std::vector<float> qkv = rand_f32(T * W, 41 + hd, 1.5f), qn = rand_f32(hd, 42, 0.1f, 1.0f),
                             kn = rand_f32(hd, 43, 0.1f, 1.0f);
    std::vector<float> cs(max_len * hd / 2), sn(max_len * hd / 2);
    for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.013f * i), sn[i] = std::sin(0.013f * i);
    const size_t cont_n = slots * max_len * row_w, paged_n = kv_blocks * moesq::ops::kKvBlockTokens * row_w;
    DevBuf<float> dqkv(qkv), dqn(qn), dkn(kn), dcs(cs), dsn(sn), dq(T * nh * hd), dqp(T * nh * hd);
    DevBuf<int32_t> dslot(slot), dpos(pos), dtable(table);
    DevBuf<uint16_t> dk(std::vector<uint16_t>(cont_n, 0x7fc0)), dv(std::vector<uint16_t>(cont_n, 0x7fc0));
    DevBuf<uint16_t> dkp(std::vector<uint16_t>(paged_n, 0x7fc0)), dvp(std::vector<uint16_t>(paged_n, 0x7fc0));
    moesq::ops::QkRopeArgs r;
    r.qkv = dqkv.p, r.q_norm = dqn.p, r.k_norm = dkn.p, r.cos = dcs.p, r.sin = dsn.p, r.tok_slot = dslot.p;
    r.tok_pos = dpos.p, r.q_out = dq.p, r.k_cache = dk.p, r.v_cache = dv.p, r.T = T, r.nh = nh, r.nkv = nkv;
    r.hd = hd, r.max_len = max_len;
    moesq::ops::qk_rope(r, nullptr);
    moesq::ops::QkRopeArgs rp = r;
    rp.q_out = dqp.p, rp.k_cache = dkp.p, rp.v_cache = dvp.p, rp.block_table = dtable.p, rp.kv_blocks = kv_blocks;
    moesq::ops::qk_rope(rp, nullptr);
    const auto gk = dk.download(), gkp = dkp.download(), gv = dv.download(), gvp = dvp.download();
    EXPECT_EQ(dq.download(), dqp.download()) << "hd=" << hd << ": queries differ";
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = moesq::ops::kv_row(table.data(), max_len, slot[t], pos[t]);
      for (int64_t i = 0; i < row_w; ++i) {
        ASSERT_EQ(gkp[row * row_w + i], gk[(slot[t] * max_len + pos[t]) * row_w + i]) << "hd=" << hd << " token " << t;
        ASSERT_EQ(gvp[row * row_w + i], gv[(slot[t] * max_len + pos[t]) * row_w + i]) << "hd=" << hd << " token " << t;
      }
    }
    const std::vector<int32_t> tiles = moesq::ops::attention_tiles(slot.data(), pos.data(), T, nh, nkv);
    DevBuf<int32_t> dtiles(tiles);
    DevBuf<float> dpart(moesq::ops::attention_partial_floats(T, nh, hd, max_len));
    std::vector<std::vector<uint16_t>> outs;
    for (int paged = 0; paged < 2; ++paged)
      for (int split = 0; split < 2; ++split) {
        DevBuf<uint16_t> o(T * nh * hd), lo(T * nh * hd);
        moesq::ops::AttentionArgs a;
        a.q = dq.p, a.k_cache = paged ? dkp.p : dk.p, a.v_cache = paged ? dvp.p : dv.p, a.tok_slot = dslot.p;
        a.tok_pos = dpos.p, a.out = o.p, a.out_lo = lo.p, a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd;
        a.max_len = max_len, a.scale = 1.0f / std::sqrt(float(hd));
        if (paged) a.block_table = dtable.p, a.kv_blocks = kv_blocks;
        if (split) a.partial = dpart.p;
        else a.tiles = dtiles.p, a.n_tiles = static_cast<int64_t>(tiles.size() / 2);
        moesq::ops::attention(a, nullptr);
        std::vector<uint16_t> both = o.download(), l = lo.download();
        both.insert(both.end(), l.begin(), l.end());
        outs.push_back(std::move(both));
      }
    for (size_t i = 0; i < outs[0].size(); ++i) {
      ASSERT_EQ(outs[2][i], outs[0][i]) << "hd=" << hd << " paged vs contiguous prefill, index " << i;
      ASSERT_EQ(outs[3][i], outs[1][i]) << "hd=" << hd << " paged vs contiguous split-KV, index " << i;
      ASSERT_EQ(outs[0][i], outs[1][i]) << "hd=" << hd << " prefill vs split-KV, index " << i;
      ASSERT_TRUE(std::isfinite(moesq::bf16_to_f32(outs[2][i]))) << "hd=" << hd << " a NaN row was read, index " << i;
    }
  }
}

// The dense-MLP SwiGLU (shared experts, dense layers) against its twin: expf vs std::exp is the only
// difference; an ulp there can flip the hi word's rounding, and hi + lo then agree to the lo word's
// precision, ≈ 2^-17 relative: kDenseSwigluRelTol (first device run: 3.8e-6 on 0.74 at 1e-6).
TEST(EngineOps, DenseSwigluMatchesRef) {
  for (bool gated : {false, true}) {
    const int64_t T = 33, I = 200, ld = 2 * I + (gated ? 1 : 0) + 5;
    const std::vector<float> gu = rand_f32(T * ld, gated ? 61 : 60, 2.0f);
    DevBuf<float> dgu(gu);
    DevBuf<uint16_t> da(T * I), dlo(T * I);
    moesq::ops::DenseSwigluArgs a;
    a.gu = dgu.p, a.a = da.p, a.a_lo = dlo.p, a.T = T, a.I = I, a.ld = ld, a.gated = gated;
    moesq::ops::dense_swiglu(a, nullptr);
    std::vector<uint16_t> ra(T * I), rlo(T * I);
    a.gu = gu.data(), a.a = ra.data(), a.a_lo = rlo.data();
    moesq::ops::dense_swiglu_ref(a);
    const auto ga = da.download(), gl = dlo.download();
    for (int64_t i = 0; i < T * I; ++i) {
      const double g = static_cast<double>(moesq::bf16_to_f32(ga[i])) + moesq::bf16_to_f32(gl[i]);
      const double r = static_cast<double>(moesq::bf16_to_f32(ra[i])) + moesq::bf16_to_f32(rlo[i]);
      ASSERT_NEAR(g, r, kDenseSwigluRelTol * (1.0 + std::fabs(r))) << "gated=" << gated << " index " << i;
    }
  }
}

TEST(EngineOps, AttentionRefusesUnbuiltShapes) {
  moesq::ops::AttentionArgs a;
  a.T = 1, a.nh = 4, a.nkv = 4, a.hd = 96, a.max_len = 8;
  EXPECT_THROW(moesq::ops::attention_check(a), moesq::Error);
  a.hd = 64, a.nh = 12, a.nkv = 4;  // G = 3
  EXPECT_THROW(moesq::ops::attention_check(a), moesq::Error);
}

TEST(EngineOps, RouterTopkMatchesRef) {
  for (int E : {32, 128, 160}) {
    for (int k : {1, 4, 8}) {
      const int64_t T = 37;
      const std::vector<float> z = rand_f32(T * E, E * 10 + k, 2.0f);
      DevBuf<float> dz(z), dw(T * k);
      DevBuf<int32_t> di(T * k), dc(std::vector<int32_t>(E, 7));  // counts: set to 0 by the routing
      moesq::ops::RouterTopkArgs a;
      a.logits = dz.p, a.topk_ids = di.p, a.topk_w = dw.p, a.T = T, a.num_experts = E, a.topk = k, a.counts = dc.p;
      moesq::ops::router_topk(a, nullptr);
      ASSERT_EQ(dc.download(), std::vector<int32_t>(E, 0)) << "E=" << E << " k=" << k << ": counts not zeroed";
      a.counts = nullptr;
      std::vector<int32_t> ri(T * k);
      std::vector<float> rw(T * k);
      a.logits = z.data(), a.topk_ids = ri.data(), a.topk_w = rw.data();
      moesq::ops::router_topk_ref(a);
      const auto gi = di.download();
      const auto gw = dw.download();
      for (int64_t i = 0; i < T * k; ++i) {
        ASSERT_EQ(gi[i], ri[i]) << "E=" << E << " k=" << k << " token " << i / k << " slot " << i % k;
        ASSERT_NEAR(gw[i], rw[i], kRouterAtol) << "E=" << E << " k=" << k << " index " << i;
      }
    }
  }
  // Sigmoid scoring with a correction bias, grouped top-k and a routed scaling factor (DeepSeek-V3,
  // Kimi-K2.5 shapes): ids equal to the twin's, weights within expf-vs-std::exp rounding × the scale.
  struct Sig {
    int E, k, G, tg;
    float scale;
  };
  for (const Sig& c : {Sig{256, 8, 8, 4, 2.5f}, Sig{384, 8, 1, 1, 2.827f}, Sig{64, 6, 8, 3, 1.0f}}) {
    const int64_t T = 41;
    const std::vector<float> z = rand_f32(T * c.E, 900 + c.E, 2.0f), bias = rand_f32(c.E, 901 + c.E, 0.2f);
    DevBuf<float> dz(z), db(bias), dw(T * c.k);
    DevBuf<int32_t> di(T * c.k);
    moesq::ops::RouterTopkArgs a;
    a.logits = dz.p, a.topk_ids = di.p, a.topk_w = dw.p, a.T = T, a.num_experts = c.E, a.topk = c.k;
    a.sigmoid = true, a.correction_bias = db.p, a.n_group = c.G, a.topk_group = c.tg, a.routed_scaling_factor = c.scale;
    moesq::ops::router_topk(a, nullptr);
    std::vector<int32_t> ri(T * c.k);
    std::vector<float> rw(T * c.k);
    a.logits = z.data(), a.correction_bias = bias.data(), a.topk_ids = ri.data(), a.topk_w = rw.data();
    moesq::ops::router_topk_ref(a);
    const auto gi = di.download();
    const auto gw = dw.download();
    for (int64_t i = 0; i < T * c.k; ++i) {
      ASSERT_EQ(gi[i], ri[i]) << "sigmoid E=" << c.E << " G=" << c.G << " token " << i / c.k << " slot " << i % c.k;
      ASSERT_NEAR(gw[i], rw[i], 4 * kRouterAtol * c.scale) << "sigmoid E=" << c.E << " index " << i;
    }
  }
  // gpt-oss's router: logit bias, top-k of z + b, softmax over the k (ids equal to the twin's, weights
  // within expf-vs-std::exp rounding).
  for (int E : {32, 128}) {
    const int64_t T = 29, k = 4;
    const std::vector<float> z = rand_f32(T * E, 950 + E, 2.0f), bias = rand_f32(E, 951 + E, 0.5f);
    DevBuf<float> dz(z), db(bias), dw(T * k);
    DevBuf<int32_t> di(T * k);
    moesq::ops::RouterTopkArgs a;
    a.logits = dz.p, a.topk_ids = di.p, a.topk_w = dw.p, a.T = T, a.num_experts = E, a.topk = static_cast<int>(k);
    a.topk_softmax = true, a.logit_bias = db.p;
    moesq::ops::router_topk(a, nullptr);
    std::vector<int32_t> ri(T * k);
    std::vector<float> rw(T * k);
    a.logits = z.data(), a.logit_bias = bias.data(), a.topk_ids = ri.data(), a.topk_w = rw.data();
    moesq::ops::router_topk_ref(a);
    const auto gi = di.download();
    const auto gw = dw.download();
    for (int64_t i = 0; i < T * k; ++i) {
      ASSERT_EQ(gi[i], ri[i]) << "topk_softmax E=" << E << " token " << i / k << " slot " << i % k;
      ASSERT_NEAR(gw[i], rw[i], kRouterAtol) << "topk_softmax E=" << E << " index " << i;
    }
  }
  // Ties: equal logits → lower expert id first, weights 1/k each.
  const int E = 64, k = 4;
  std::vector<float> z(E, 0.5f);
  DevBuf<float> dz(z), dw(k);
  DevBuf<int32_t> di(k);
  moesq::ops::RouterTopkArgs a;
  a.logits = dz.p, a.topk_ids = di.p, a.topk_w = dw.p, a.T = 1, a.num_experts = E, a.topk = k;
  moesq::ops::router_topk(a, nullptr);
  EXPECT_EQ(di.download(), (std::vector<int32_t>{0, 1, 2, 3}));
  for (float w : dw.download()) EXPECT_EQ(w, 0.25f);
}

// The router GEMM running the top-k in its last CTA (GemmBf16Args::fused_topk) against gemm_bf16 then
// router_topk: every logit, id and weight bit equal and the counts zeroed, for the three scorings
// (softmax; sigmoid with a correction bias, groups and a scale; gpt-oss's bias + top-k-softmax), hi + lo
// inputs with split-K, T from 1 to the small-M path's 64 — three calls in a row on one ticket, which
// each leaves at 0.
TEST(EngineOps, RouterGemmFusedTopkBitsEqualTheTwoKernels) {
  struct Case {
    int E, k, G, tg;
    bool sigmoid, topk_softmax;
    float scale;
  };
  const int64_t K = 2048;
  for (const Case& c : {Case{128, 8, 1, 1, false, false, 1.0f}, Case{256, 8, 8, 4, true, false, 2.5f},
                        Case{32, 4, 1, 1, false, true, 1.0f}})
    for (int64_t T : {1, 5, 16, 64}) {
      const std::string at = "E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " T=" + std::to_string(T);
      const std::vector<uint16_t> x = rand_bf16(T * K, 70 + T), xl = rand_bf16(T * K, 71 + T, 1.0f / 256),
                                  w = rand_bf16(c.E * K, 72 + c.E, 0.05f);
      const std::vector<float> bias = rand_f32(c.E, 73 + c.E, 0.2f);
      DevBuf<uint16_t> dx(x), dxl(xl), dw(w);
      DevBuf<float> db(bias), ws(moesq::ops::gemm_bf16_split_floats(T, c.E, K));
      DevBuf<int32_t> ticket(std::vector<int32_t>{0});
      auto run = [&](bool fuse) {
        DevBuf<float> logits(std::vector<float>(T * c.E, std::nanf(""))), tw(std::vector<float>(T * c.k, -1.0f));
        DevBuf<int32_t> ids(std::vector<int32_t>(T * c.k, -1)), counts(std::vector<int32_t>(c.E, 7));
        moesq::ops::RouterTopkArgs r;
        r.logits = logits.p, r.topk_ids = ids.p, r.topk_w = tw.p, r.T = T, r.num_experts = c.E, r.topk = c.k;
        r.counts = counts.p, r.sigmoid = c.sigmoid, r.topk_softmax = c.topk_softmax;
        if (c.sigmoid) r.correction_bias = db.p, r.n_group = c.G, r.topk_group = c.tg, r.routed_scaling_factor = c.scale;
        if (c.topk_softmax) r.logit_bias = db.p;
        moesq::ops::GemmBf16Args g;
        g.x = dx.p, g.x_lo = dxl.p, g.w = dw.p, g.y_f32 = logits.p, g.split_ws = ws.p, g.M = T, g.N = c.E, g.K = K;
        g.ldy = c.E;
        if (fuse) {
          g.fused_topk = &r, g.topk_ticket = ticket.p;
          EXPECT_TRUE(moesq::ops::gemm_bf16_fuses_topk(g)) << at;
        }
        moesq::ops::gemm_bf16(g, nullptr);
        if (!fuse) moesq::ops::router_topk(r, nullptr);
        MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(counts.download(), std::vector<int32_t>(c.E, 0)) << at << (fuse ? " fused" : "") << ": counts";
        std::vector<uint32_t> b;
        for (float v : logits.download()) b.push_back(bits(v));
        for (float v : tw.download()) b.push_back(bits(v));
        for (int32_t v : ids.download()) b.push_back(static_cast<uint32_t>(v));
        return b;
      };
      const std::vector<uint32_t> plain = run(false);
      for (int rep = 0; rep < 3; ++rep) {
        EXPECT_EQ(run(true), plain) << at << " fused call " << rep;
        EXPECT_EQ(ticket.download(), std::vector<int32_t>{0}) << at << " fused call " << rep << ": ticket";
      }
    }
  // Refused where the small-M path does not run (M > 64), and without a ticket.
  DevBuf<uint16_t> dx(rand_bf16(65 * 64, 5)), dw(rand_bf16(32 * 64, 6));
  DevBuf<float> logits(65 * 32), tw(65 * 2);
  DevBuf<int32_t> ids(65 * 2), ticket(std::vector<int32_t>{0});
  moesq::ops::RouterTopkArgs r;
  r.logits = logits.p, r.topk_ids = ids.p, r.topk_w = tw.p, r.T = 65, r.num_experts = 32, r.topk = 2;
  moesq::ops::GemmBf16Args g;
  g.x = dx.p, g.w = dw.p, g.y_f32 = logits.p, g.M = 65, g.N = 32, g.K = 64, g.ldy = 32;
  g.fused_topk = &r, g.topk_ticket = ticket.p;
  EXPECT_FALSE(moesq::ops::gemm_bf16_fuses_topk(g));
  EXPECT_THROW(moesq::ops::gemm_bf16(g, nullptr), moesq::Error);
}

// Slots in a shuffled (atomic-like) order inside every expert and some routes dropped: the combine
// equals its twin bitwise, on the 8-column vector path (H, ldy multiples of 8) and the scalar one.
// The combine running the next norm on each row it updates (MoeCombineArgs::fused_norm) against
// moe_combine then rmsnorm: every bit of h, y and y_lo equal, at H = 96 (the scalar path), 2048 and
// 2056; the norm's weights random.
TEST(EngineOps, MoeCombineFusedNormBitsEqualTheTwoKernels) {
  const int E = 16, k = 4, cap = 24;
  for (int64_t H : {96, 2048, 2056}) {
    const int64_t T = 24, ldy = H;
    std::mt19937_64 g(11 + H);
    std::vector<int32_t> ids(T * k), sor(T * k);
    std::vector<int32_t> fill(E, 0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> perm(E);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), g);
      for (int j = 0; j < k; ++j) ids[t * k + j] = perm[j], sor[t * k + j] = fill[perm[j]]++;
    }
    const std::vector<float> w = rand_f32(T * k, 12, 0.3f, 0.25f), h0 = rand_f32(T * H, 13),
                             nw = rand_f32(H, 14, 0.2f, 1.0f);
    const std::vector<uint16_t> y = rand_bf16(E * cap * ldy, 15);
    DevBuf<uint16_t> dy(y);
    DevBuf<int32_t> di(ids), dsor(sor);
    DevBuf<float> dw(w), dnw(nw);
    auto run = [&](bool fuse) {
      DevBuf<float> dh(h0);
      DevBuf<uint16_t> xb(std::vector<uint16_t>(T * H, 0xffff)), xlo(std::vector<uint16_t>(T * H, 0xffff));
      moesq::ops::RmsNormArgs n;
      n.x = dh.p, n.w = dnw.p, n.y = xb.p, n.y_lo = xlo.p, n.n = T, n.D = H, n.eps = 1e-6;
      moesq::ops::MoeCombineArgs a;
      a.y = dy.p, a.topk_ids = di.p, a.topk_w = dw.p, a.slot_of_route = dsor.p;
      a.h = dh.p, a.T = T, a.H = H, a.ldy = ldy, a.topk = k, a.num_experts = E, a.capacity = cap;
      if (fuse) a.fused_norm = &n;
      moesq::ops::moe_combine(a, nullptr);
      if (!fuse) moesq::ops::rmsnorm(n, nullptr);
      std::vector<uint32_t> b;
      for (float v : dh.download()) b.push_back(bits(v));
      for (uint16_t v : xb.download()) b.push_back(v);
      for (uint16_t v : xlo.download()) b.push_back(v);
      return b;
    };
    EXPECT_EQ(run(true), run(false)) << "H=" << H;
  }
}

TEST(EngineOps, MoeCombineBitwiseAnySlotOrder) {
  const int E = 16, k = 4, cap = 40;
  for (const auto& [H, ldy] : {std::pair<int64_t, int64_t>{96, 100}, {2048, 2056}, {104, 104}}) {
    const int64_t T = 33;
    std::mt19937_64 g(5 + H);
    std::vector<int32_t> ids(T * k);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> perm(E);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), g);
      std::copy(perm.begin(), perm.begin() + k, ids.begin() + t * k);
    }
    const std::vector<float> w = rand_f32(T * k, 6, 0.3f, 0.25f), h0 = rand_f32(T * H, 7);
    const std::vector<uint16_t> y = rand_bf16(E * cap * ldy, 8);
    std::vector<int32_t> counts(E, 0), ros(E * cap, -1);
    std::vector<std::vector<int32_t>> per(E);
    for (int64_t r = 0; r < T * k; ++r) per[ids[r]].push_back(static_cast<int32_t>(r));
    for (int e = 0; e < E; ++e) {
      std::shuffle(per[e].begin(), per[e].end(), g);
      if (e == 3) per[e].resize(per[e].size() / 2);  // expert 3 dropped half its routes
      counts[e] = static_cast<int32_t>(per[e].size());
      std::copy(per[e].begin(), per[e].end(), ros.begin() + e * cap);
    }
    std::vector<int32_t> sor(T * k);
    moesq::ops::invert_route_of_slot(ros.data(), counts.data(), E, cap, T * k, sor.data());
    ASSERT_GT(std::count(sor.begin(), sor.end(), -1), 0);
    DevBuf<uint16_t> dy(y);
    DevBuf<int32_t> di(ids), dsor(sor);
    DevBuf<float> dw(w), dh(h0);
    moesq::ops::MoeCombineArgs a;
    a.y = dy.p, a.topk_ids = di.p, a.topk_w = dw.p, a.slot_of_route = dsor.p;
    a.h = dh.p, a.T = T, a.H = H, a.ldy = ldy, a.topk = k, a.num_experts = E, a.capacity = cap;
    moesq::ops::moe_combine(a, nullptr);
    std::vector<float> rh = h0;
    a.y = y.data(), a.topk_ids = ids.data(), a.topk_w = w.data(), a.slot_of_route = sor.data(), a.h = rh.data();
    moesq::ops::moe_combine_ref(a);
    const auto gh = dh.download();
    for (size_t i = 0; i < rh.size(); ++i)
      ASSERT_EQ(bits(gh[i]), bits(rh[i])) << "H=" << H << " token " << i / H << " col " << i % H;
    EXPECT_NE(gh, h0);
    // gpt-oss's down biases: each kept route adds w · (y + bias[e]); still bitwise, and not the plain sum.
    const std::vector<float> bias = rand_f32(E * H, 9, 0.5f);
    DevBuf<float> db(bias), dh2(h0);
    a.y = dy.p, a.topk_ids = di.p, a.topk_w = dw.p, a.slot_of_route = dsor.p, a.h = dh2.p, a.down_bias = db.p;
    moesq::ops::moe_combine(a, nullptr);
    std::vector<float> rh2 = h0;
    a.y = y.data(), a.topk_ids = ids.data(), a.topk_w = w.data(), a.slot_of_route = sor.data(), a.h = rh2.data();
    a.down_bias = bias.data();
    moesq::ops::moe_combine_ref(a);
    const auto gh2 = dh2.download();
    for (size_t i = 0; i < rh2.size(); ++i)
      ASSERT_EQ(bits(gh2[i]), bits(rh2[i])) << "down bias H=" << H << " token " << i / H << " col " << i % H;
    EXPECT_NE(gh2, gh);
  }
}

// The expert-parallel exchange's pack and unpack (ops/route_rows): kernel = twin bitwise, for a rank
// holding some experts (pack) and for all routes (unpack), dropped routes included; the unpack leaves
// every other y word as it was.
TEST(EngineOps, RouteRowsBitwise) {
  const int E = 12, k = 3, cap = 30;
  for (const auto& [H, ldy] : {std::pair<int64_t, int64_t>{96, 100}, {2048, 2048}, {2, 2}}) {
    const int64_t T = 29, R = T * k;
    std::mt19937_64 g(40 + H);
    const moesq::test::RandomRouting rr = moesq::test::random_routing(T, E, k, cap, g, 5, 3);  // expert 5 keeps 3
    const std::vector<int32_t>& ids = rr.ids;
    const std::vector<int32_t>& sor = rr.sor;
    ASSERT_GT(std::count(sor.begin(), sor.end(), -1), 0);
    const std::vector<uint16_t> y = rand_bf16(E * cap * ldy, 41), routes0 = rand_bf16(R * H, 42);
    DevBuf<uint16_t> dy(y), droutes(std::vector<uint16_t>(R * H, 0x7fc1));
    DevBuf<int32_t> di(ids), dsor(sor);
    moesq::ops::RouteRowsArgs a;
    a.y = dy.p, a.ldy = ldy, a.topk_ids = di.p, a.slot_of_route = dsor.p, a.routes = droutes.p;
    a.T = T, a.H = H, a.topk = k, a.num_experts = E, a.capacity = cap, a.expert_begin = 4, a.expert_end = 9;
    moesq::ops::route_rows(a, nullptr);
    std::vector<uint16_t> ry = y, rroutes(R * H, 0x7fc1);
    moesq::ops::RouteRowsArgs h = a;
    h.y = ry.data(), h.topk_ids = ids.data(), h.slot_of_route = sor.data(), h.routes = rroutes.data();
    moesq::ops::route_rows_ref(h);
    EXPECT_EQ(droutes.download(), rroutes) << "pack, H=" << H;
    // Unpack other rows (as if summed over the ranks) into y.
    DevBuf<uint16_t> dsum(routes0);
    a.routes = dsum.p, a.pack = false;
    moesq::ops::route_rows(a, nullptr);
    std::vector<uint16_t> sum = routes0;
    h.routes = sum.data(), h.pack = false;
    moesq::ops::route_rows_ref(h);
    const std::vector<uint16_t> gy = dy.download();
    EXPECT_EQ(gy, ry) << "unpack, H=" << H;
    EXPECT_NE(gy, y);
  }
}

// The o_proj bias add (gpt-oss): kernel = twin bitwise, across a grid-stride wrap (more values than one
// launch's threads cover when rows · cols > 4096 · 256).
TEST(EngineOps, RowBiasBitwise) {
  for (const auto& [R, C] : {std::pair<int64_t, int64_t>{7, 96}, {4100, 300}}) {
    const std::vector<float> y0 = rand_f32(R * C, 31), bias = rand_f32(C, 32);
    DevBuf<float> dy(y0), db(bias);
    moesq::ops::RowBiasArgs a;
    a.y = dy.p, a.bias = db.p, a.rows = R, a.cols = C;
    moesq::ops::row_bias(a, nullptr);
    std::vector<float> ry = y0;
    a.y = ry.data(), a.bias = bias.data();
    moesq::ops::row_bias_ref(a);
    const auto gy = dy.download();
    for (size_t i = 0; i < ry.size(); ++i) ASSERT_EQ(bits(gy[i]), bits(ry[i])) << "R=" << R << " index " << i;
  }
}

TEST(EngineOps, SynthPackBitwise) {
  moesq::ops::SynthBf16Args a;
  a.n = 100003, a.seed = 42, a.scale = 0.02f, a.mean = 0.5f, a.first = 17;  // a slice: the counter offset too
  DevBuf<uint16_t> d(a.n);
  std::vector<uint16_t> r(a.n);
  a.out = d.p;
  moesq::ops::synth_bf16(a, nullptr);
  a.out = r.data();
  moesq::ops::synth_bf16_ref(a);
  const auto g = d.download();
  for (int64_t i = 0; i < a.n; ++i) ASSERT_EQ(g[i], r[i]) << "synth_bf16 index " << i;
  double mean = 0;
  for (auto v : r) mean += moesq::bf16_to_f32(v);
  EXPECT_NEAR(mean / a.n, 0.5, 1e-3);
  moesq::ops::SynthSparseArgs s;
  s.num_chunks = 77, s.seed = 9, s.first = 5;
  DevBuf<uint8_t> ds(s.num_chunks * 1408);
  std::vector<uint8_t> rs(s.num_chunks * 1408);
  s.out = ds.p;
  moesq::ops::synth_sparse48_kl(s, nullptr);
  s.out = rs.data();
  moesq::ops::synth_sparse48_kl_ref(s);
  EXPECT_EQ(ds.download(), rs);
}

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
