// Tile schedules: the paper-000 numbers (G = 246 and 200 at N = 1536, K = 2048, 50 blocks), the
// invariant and invariant-split schedules, the slice rule on other shapes, and the thread-config selector with overrides.
#include <gtest/gtest.h>

#include "core/error.h"
#include "ops/awq_gemm/awq_schedule.h"

using namespace moesq::ops;

TEST(Schedule, NativeGrid246MatchesPaper) {
  const auto s = make_schedule(ScheduleKind::Native, 50, 1536, 2048, 64, 128, 246);
  EXPECT_EQ(s.n_tiles, 12);
  EXPECT_EQ(s.k_tiles, 32);
  EXPECT_EQ(s.tiles, 600);
  EXPECT_EQ(s.direct_tiles, 492);
  EXPECT_EQ(s.split_tiles, 108);
  EXPECT_EQ(s.first_split_block, 41);
  EXPECT_EQ(s.slices, 2);
  EXPECT_EQ(s.tile_slices(40 * 12 + 11), 1);  // block 40 direct
  EXPECT_EQ(s.tile_slices(41 * 12), 2);       // block 41 split
}

TEST(Schedule, NativeGrid200HasNoReduction) {
  const auto s = make_schedule(ScheduleKind::Native, 50, 1536, 2048, 64, 128, 200);
  EXPECT_EQ(s.direct_tiles, 400);
  EXPECT_EQ(s.first_split_block, 33);
  EXPECT_EQ(s.slices, 1);
  for (int64_t t = 0; t < s.tiles; ++t) ASSERT_EQ(s.tile_slices(t), 1) << "tile " << t;
}

TEST(Schedule, InvariantIgnoresGrid) {
  for (int64_t G : {1, 7, 200, 246, 1000}) {
    const auto s = make_schedule(ScheduleKind::Invariant, 50, 1536, 2048, 64, 128, G);
    EXPECT_EQ(s.direct_tiles, s.tiles);
    EXPECT_EQ(s.split_tiles, 0);
    EXPECT_EQ(s.first_split_block, -1);
    EXPECT_EQ(s.slices, 1);
  }
}

TEST(Schedule, InvariantSplitDependsOnlyOnKAndThreadK) {
  // The slice count must be the same for every (blocks, N, grid) at a given (K, thread_k), every tile
  // must carry it, and it must be the largest divisor of k_tiles <= kMaxInvariantSlices (brute force).
  for (int64_t K : {128, 448, 704, 768, 2048, 4096}) {
    const int64_t k_tiles = K / 64;
    int expect = 1;
    for (int d = 1; d <= kMaxInvariantSlices; ++d)
      if (k_tiles % d == 0) expect = d;
    for (int64_t P : {1, 8, 50, 333})
      for (int64_t N : {128, 1536})
        for (int64_t G : {1, 17, 246, 1188}) {
          const auto s = make_schedule(ScheduleKind::InvariantSplit, P, N, K, 64, 128, G);
          ASSERT_EQ(s.slices, expect) << "K=" << K << " P=" << P << " N=" << N << " G=" << G;
          ASSERT_EQ(s.direct_tiles, 0);
          ASSERT_EQ(s.split_tiles, s.tiles);
          ASSERT_EQ(s.first_split_block, 0);
          for (int64_t t = 0; t < s.tiles; t += 7) ASSERT_EQ(s.tile_slices(t), expect) << "tile " << t;
        }
  }
  // Qwen3 shapes: w13 K = 2048 → 32 K-tiles → 8 slices; w2 K = 768 → 12 K-tiles → 6 slices.
  EXPECT_EQ(make_schedule(ScheduleKind::InvariantSplit, 8, 1536, 2048, 64, 128, 1188).slices, 8);
  EXPECT_EQ(make_schedule(ScheduleKind::InvariantSplit, 8, 2048, 768, 64, 128, 1188).slices, 6);
  EXPECT_EQ(parse_schedule_kind("invariant-split"), ScheduleKind::InvariantSplit);
  EXPECT_STREQ(schedule_kind_name(ScheduleKind::InvariantSplit), "invariant-split");
  const auto empty = make_schedule(ScheduleKind::InvariantSplit, 0, 1536, 2048, 64, 128, 246);
  EXPECT_EQ(empty.tiles, 0);
  EXPECT_EQ(empty.first_split_block, -1);
}

TEST(Schedule, SliceRuleIsLargestDivisorBelowCap) {
  // Brute force over grids: s divides k_tiles, s <= max(1, G/R), and no larger divisor qualifies.
  for (int64_t G = 1; G <= 700; G += 3) {
    const auto s = make_schedule(ScheduleKind::Native, 13, 768, 2048, 64, 128, G);  // 6 N-tiles, 32 K-tiles
    ASSERT_EQ(s.direct_tiles + s.split_tiles, s.tiles);
    ASSERT_GT(s.split_tiles, 0);
    ASSERT_LE(s.split_tiles, G);
    const int64_t cap = std::max<int64_t>(1, G / s.split_tiles);
    ASSERT_EQ(s.k_tiles % s.slices, 0) << "G=" << G;
    ASSERT_LE(s.slices, cap) << "G=" << G;
    for (int64_t d = s.slices + 1; d <= std::min(cap, s.k_tiles); ++d) ASSERT_NE(s.k_tiles % d, 0) << "G=" << G;
  }
}

TEST(Schedule, SelectorDefaultsAndOverrides) {
  const auto c = select_thread_config(1536, 2048);
  EXPECT_EQ(c.thread_k, 64);
  EXPECT_EQ(c.thread_n, 128);
  EXPECT_EQ(c.threads, 128);
  EXPECT_EQ(c.blocks_per_sm, 3);
  const auto d = select_thread_config(192, 2048);  // 192 % 128 != 0 → (128, 64)
  EXPECT_EQ(d.thread_k, 128);
  EXPECT_EQ(d.thread_n, 64);
  ThreadConfigOverrides ov;
  ov.thread_k = 128;
  ov.blocks_per_sm = 2;
  const auto e = select_thread_config(1536, 2048, ov);
  EXPECT_EQ(e.thread_k, 128);
  EXPECT_EQ(e.blocks_per_sm, 2);
  ov.thread_k = 96;  // does not divide 2048
  EXPECT_THROW(select_thread_config(1536, 2048, ov), moesq::Error);
  EXPECT_THROW(make_schedule(ScheduleKind::Native, 50, 1536, 2048, 64, 128, 0), moesq::Error);
}
