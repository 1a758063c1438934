// CPU tests of the paged-KV accounting (runtime/kv_blocks.h): blocks handed out lowest first as slots
// grow, all-or-nothing growth (KvCacheFull leaves the table as it was), release and reuse, and the
// constructor's refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "runtime/kv_blocks.h"

namespace {

using namespace moesq;
using runtime::KvBlockPool;

TEST(KvBlocks, BlocksFor) {
  EXPECT_EQ(runtime::kv_blocks_for(0), 0);
  EXPECT_EQ(runtime::kv_blocks_for(1), 1);
  EXPECT_EQ(runtime::kv_blocks_for(64), 1);
  EXPECT_EQ(runtime::kv_blocks_for(65), 2);
}

TEST(KvBlocks, GrowTakesLowestFreeBlocksAndReleaseReturnsThem) {
  KvBlockPool p(3, 200, 6);  // 4 blocks per slot
  ASSERT_EQ(p.blocks_per_slot(), 4);
  EXPECT_EQ(p.need(0, 65), 2);
  p.grow({{0, 65}});
  p.grow({{2, 1}, {1, 64}});
  EXPECT_EQ(p.free_blocks(), 2);
  const std::vector<int32_t>& t = p.table();
  EXPECT_EQ(t[0], 0);
  EXPECT_EQ(t[1], 1);
  EXPECT_EQ(t[4], 2);  // slot 1 (std::map order: lower slot first)
  EXPECT_EQ(t[8], 3);  // slot 2
  EXPECT_EQ(t[2], -1);
  EXPECT_EQ(p.need(0, 128), 0);  // still within its 2 blocks
  const uint64_t v = p.version();
  p.grow({{0, 100}});  // nothing new
  EXPECT_EQ(p.version(), v);
  p.release(0);
  EXPECT_EQ(p.free_blocks(), 4);
  EXPECT_EQ(p.held(0), 0);
  EXPECT_GT(p.version(), v);
  p.grow({{1, 200}});  // 3 more: lowest free are 0, 1, 4
  EXPECT_EQ(t[4], 2);
  EXPECT_EQ(t[5], 0);
  EXPECT_EQ(t[6], 1);
  EXPECT_EQ(t[7], 4);
  std::set<int32_t> used;
  for (int32_t b : t)
    if (b >= 0) EXPECT_TRUE(used.insert(b).second) << "block " << b << " handed out twice";
  EXPECT_EQ(static_cast<int64_t>(used.size()) + p.free_blocks(), p.num_blocks());
}

TEST(KvBlocks, GrowIsAllOrNothing) {
  KvBlockPool p(2, 128, 3);
  p.grow({{0, 64}});
  const std::vector<int32_t> before = p.table();
  const uint64_t v = p.version();
  EXPECT_THROW(p.grow({{1, 64}, {0, 128}, {1, 128}}), runtime::KvCacheFull);  // needs 1 + 2 > 2 free
  EXPECT_EQ(p.table(), before);
  EXPECT_EQ(p.version(), v);
  EXPECT_EQ(p.free_blocks(), 2);
  p.grow({{1, 128}});
  EXPECT_EQ(p.free_blocks(), 0);
  try {
    p.grow({{0, 65}});
    FAIL();
  } catch (const runtime::KvCacheFull& e) {
    EXPECT_NE(std::string(e.what()).find("0 of 3 are free"), std::string::npos) << e.what();
  }
  p.release_all();
  EXPECT_EQ(p.free_blocks(), 3);
  EXPECT_TRUE(std::all_of(p.table().begin(), p.table().end(), [](int32_t b) { return b == -1; }));
}

TEST(KvBlocks, Refusals) {
  EXPECT_THROW(KvBlockPool(0, 64, 1), Error);
  EXPECT_THROW(KvBlockPool(1, 0, 1), Error);
  EXPECT_THROW(KvBlockPool(4, 129, 2), Error);  // one sequence of 129 tokens needs 3 blocks
  KvBlockPool p(2, 100, 4);
  EXPECT_THROW(p.grow({{2, 1}}), Error);
  EXPECT_THROW(p.grow({{0, 101}}), Error);
  EXPECT_THROW(p.need(-1, 1), Error);
  EXPECT_THROW(p.release(5), Error);
}

}  // namespace
