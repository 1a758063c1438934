// The expert → rank partition (dist/partition.h): every expert owned by exactly one rank, the
// documented round-robin rule, balanced shares, ranks without experts when N > E, clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "dist/gpu_binding.h"
#include "dist/partition.h"

namespace moesq::dist {
namespace {

TEST(Partition, EveryExpertOnExactlyOneRankRoundRobin) {
  for (int64_t E : {1, 2, 7, 32, 128, 384})
    for (int N : {1, 2, 3, 4, 8, 33}) {
      std::vector<int> count(static_cast<size_t>(E), 0);
      size_t smallest = SIZE_MAX, largest = 0;
      for (int r = 0; r < N; ++r) {
        const std::vector<int64_t> mine = experts_of_rank(E, r, N);
        EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end())) << "E=" << E << " N=" << N << " rank " << r;
        for (int64_t e : mine) {
          ASSERT_TRUE(e >= 0 && e < E) << "E=" << E << " N=" << N << " rank " << r << " expert " << e;
          ++count[static_cast<size_t>(e)];
          EXPECT_EQ(expert_owner(e, N), r) << "E=" << E << " N=" << N << " expert " << e;
          EXPECT_EQ(e % N, r) << "the documented rule: expert e on rank e mod N";
        }
        smallest = std::min(smallest, mine.size());
        largest = std::max(largest, mine.size());
      }
      for (int64_t e = 0; e < E; ++e) EXPECT_EQ(count[static_cast<size_t>(e)], 1) << "E=" << E << " N=" << N << " e=" << e;
      EXPECT_LE(largest - smallest, 1u) << "shares within one expert, E=" << E << " N=" << N;
    }
}

TEST(EngineExpertRange, ContiguousSharesWithinOneExpertCoveringEveryExpertOnce) {
  for (int64_t E : {1, 7, 128, 384, 512})
    for (int N : {1, 2, 3, 8, 600}) {
      int64_t next = 0, lo = E, hi = 0;
      for (int r = 0; r < N; ++r) {
        const ExpertRange m = engine_expert_range(E, r, N);
        EXPECT_EQ(m.begin, next) << "E=" << E << " N=" << N << " rank " << r;
        next = m.end;
        lo = std::min(lo, m.size()), hi = std::max(hi, m.size());
      }
      EXPECT_EQ(next, E);
      EXPECT_LE(hi - lo, 1) << "E=" << E << " N=" << N;
    }
  EXPECT_THROW(engine_expert_range(8, 2, 2), Error);
}

TEST(Partition, MoreRanksThanExpertsLeavesEmptyRanks) {
  EXPECT_TRUE(experts_of_rank(4, 5, 8).empty());
  EXPECT_EQ(experts_of_rank(4, 3, 8), std::vector<int64_t>{3});
}

TEST(Partition, BadArgumentsAreErrors) {
  EXPECT_THROW(expert_owner(3, 0), Error);
  EXPECT_THROW(expert_owner(-1, 2), Error);
  EXPECT_THROW(experts_of_rank(8, 2, 2), Error);
  EXPECT_THROW(experts_of_rank(8, -1, 2), Error);
}

TEST(GpuBinding, EachHostRankItsOwnGpuThenRoundRobin) {
  // One GPU per rank: rank r on GPU r, all distinct.
  for (int n : {1, 2, 4, 8})
    for (int r = 0; r < n; ++r) EXPECT_EQ(gpu_for_local_rank(r, n, n), r) << n << " ranks, " << n << " GPUs";
  // More ranks than GPUs: rank mod GPUs, every GPU used by ceil/floor(n / g) ranks.
  for (int g : {1, 2, 3})
    for (int n : {g + 1, 2 * g + 1, 8}) {
      std::vector<int> per(static_cast<size_t>(g), 0);
      for (int r = 0; r < n; ++r) ++per[static_cast<size_t>(gpu_for_local_rank(r, n, g))];
      for (int d = 0; d < g; ++d) EXPECT_EQ(per[static_cast<size_t>(d)], n / g + (d < n % g ? 1 : 0)) << n << " on " << g;
    }
  // Fewer ranks than GPUs: the first ones.
  EXPECT_EQ(gpu_for_local_rank(1, 2, 8), 1);
  EXPECT_TRUE(gpu_sharing_note(2, 8).empty());
  EXPECT_TRUE(gpu_sharing_note(4, 4).empty());
  EXPECT_NE(gpu_sharing_note(2, 1).find("2 ranks on this host share its 1 GPU (rank mod 1)"), std::string::npos)
      << gpu_sharing_note(2, 1);
}

TEST(GpuBinding, BadArgumentsNameTheArgument) {
  auto what = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(what([] { gpu_for_local_rank(0, 1, 0); }).find("device_count 0"), std::string::npos);
  EXPECT_NE(what([] { gpu_for_local_rank(2, 2, 1); }).find("local rank 2 outside [0, 2)"), std::string::npos);
  EXPECT_NE(what([] { gpu_for_local_rank(-1, 2, 1); }).find("local rank -1"), std::string::npos);
}

TEST(LocalCommunicator, IsRankZeroOfOne) {
  const auto c = local_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->local_rank(), 0);
  EXPECT_EQ(c->local_size(), 1);
  const std::vector<std::string> all = c->allgather(std::string("\0ab", 3));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], std::string("\0ab", 3));
  std::string b = "x";
  c->broadcast(b, 0);
  EXPECT_EQ(b, "x");
  EXPECT_THROW(c->broadcast(b, 1), Error);
  // One rank: an exception is not turned into an abort, the caller (the CLI) sees it.
  EXPECT_THROW(run_or_abort_all(*c, [] { throw Error("boom"); }), Error);
}

}  // namespace
}  // namespace moesq::dist
