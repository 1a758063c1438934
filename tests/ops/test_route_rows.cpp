// CPU tests of the expert-parallel exchange (ops/route_rows: pack, the uint32-sum all-reduce's twin,
// unpack): N simulated ranks, each holding only its own experts' outputs (every other expert's rows are
// garbage it never computed), give after the exchange the combine's bits of one GPU holding them all —
// −0 and NaN payloads included, dropped routes untouched; a partition that is not one is an error
// naming the route row. (The kernel against this twin: tests/gpu/test_engine_ops.cu RouteRows*.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/moe_combine/moe_combine.h"
#include "ops/route_rows/route_rows.h"
#include "support/random_routing.h"

namespace {

using moesq::ops::RouteRowsArgs;

// A rank's experts [begin, end): dist::engine_expert_range's rule (ops may not include dist; the rule
// itself is tested in tests/dist/test_partition.cpp).
struct Range {
  int64_t begin = 0, end = 0;
  bool contains(int64_t e) const { return e >= begin && e < end; }
};
Range shard(int64_t E, int r, int N) { return {E * r / N, E * (r + 1) / N}; }

// A layer's routing and expert outputs: distinct random top-k per token, shuffled slots, the routes of
// expert `drop` past the first two dropped (as a capacity limit would).
struct Layer {
  int E = 10, k = 3, cap = 0;
  int64_t T = 0, H = 0, ldy = 0;
  std::vector<int32_t> ids, sor;  // [T, k]
  std::vector<float> w;           // [T, k]
  std::vector<uint16_t> y;        // [E, cap, ldy]
};

Layer make_layer(int64_t T, int64_t H, uint64_t seed, int drop) {
  Layer L;
  L.T = T, L.H = H, L.ldy = H + 6, L.cap = static_cast<int>(T);
  std::mt19937_64 g(seed);
  moesq::test::RandomRouting r = moesq::test::random_routing(T, L.E, L.k, L.cap, g, drop, 2);
  L.ids = std::move(r.ids), L.sor = std::move(r.sor);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.05f, 0.5f);
  L.w.resize(T * L.k);
  for (auto& v : L.w) v = ud(g);
  L.y.resize(static_cast<size_t>(L.E) * L.cap * L.ldy);
  for (auto& v : L.y) v = moesq::f32_to_bf16(nd(g));
  // Values whose bits an exchange could lose: −0 (an add of +0 in floating point would make it +0)
  // and a NaN payload, in the first kept route's row.
  const int64_t q0 = std::find_if(L.sor.begin(), L.sor.end(), [](int32_t s) { return s >= 0; }) - L.sor.begin();
  uint16_t* r0 = L.y.data() + (static_cast<int64_t>(L.ids[q0]) * L.cap + L.sor[q0]) * L.ldy;
  r0[0] = 0x8000, r0[1] = 0x7fa5;
  return L;
}

RouteRowsArgs args(Layer& L, std::vector<uint16_t>& y, std::vector<uint16_t>& routes, bool pack,
                   Range mine) {
  RouteRowsArgs a;
  a.y = y.data(), a.ldy = L.ldy, a.topk_ids = L.ids.data(), a.slot_of_route = L.sor.data(), a.routes = routes.data();
  a.T = L.T, a.H = L.H, a.topk = L.k, a.num_experts = L.E, a.capacity = L.cap;
  a.expert_begin = mine.begin, a.expert_end = mine.end, a.pack = pack;
  return a;
}

std::vector<float> combine(const Layer& L, const std::vector<uint16_t>& y) {
  std::vector<float> h(L.T * L.H, 0.25f);
  moesq::ops::MoeCombineArgs c;
  c.y = y.data(), c.topk_ids = L.ids.data(), c.topk_w = L.w.data(), c.slot_of_route = L.sor.data(), c.h = h.data();
  c.T = L.T, c.H = L.H, c.ldy = L.ldy, c.topk = L.k, c.num_experts = L.E, c.capacity = L.cap;
  moesq::ops::moe_combine_ref(c);
  return h;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// N ranks with garbage in every expert row they do not own: after pack → exchange → unpack, each rank's
// kept y rows and its combine are the one-GPU bits.
TEST(RouteRows, ExpertParallelExchangeGivesTheOneGpuBits) {
  for (int N : {1, 2, 3, 4, 7}) {
    Layer L = make_layer(23, 40, 100 + N, 4);
    const std::vector<float> want = combine(L, L.y);
    const int64_t R = L.T * L.k;
    std::vector<std::vector<uint16_t>> y(N), packed(N, std::vector<uint16_t>(R * L.H, 0x5555));
    std::mt19937_64 g(7 + N);
    for (int r = 0; r < N; ++r) {
      const Range mine = shard(L.E, r, N);
      y[r] = L.y;
      for (int e = 0; e < L.E; ++e) {
        if (mine.contains(e)) continue;
        uint16_t* first = y[r].data() + static_cast<int64_t>(e) * L.cap * L.ldy;
        std::generate(first, first + L.cap * L.ldy, [&] { return static_cast<uint16_t>(g()); });
      }
      moesq::ops::route_rows_ref(args(L, y[r], packed[r], true, mine));
    }
    std::vector<const uint16_t*> parts;
    for (const auto& p : packed) parts.push_back(p.data());
    std::vector<uint16_t> summed(R * L.H);
    moesq::ops::route_rows_sum_ref(parts.data(), N, R * L.H / 2, L.H, summed.data());
    for (int r = 0; r < N; ++r) {
      moesq::ops::route_rows_ref(args(L, y[r], summed, false, {}));
      for (int64_t q = 0; q < R; ++q) {
        if (L.sor[q] < 0) continue;
        const int64_t off = (static_cast<int64_t>(L.ids[q]) * L.cap + L.sor[q]) * L.ldy;
        ASSERT_TRUE(std::equal(L.y.begin() + off, L.y.begin() + off + L.H, y[r].begin() + off))
            << "N=" << N << " rank " << r << " route " << q;
      }
      EXPECT_TRUE(same_bits(combine(L, y[r]), want)) << "N=" << N << " rank " << r;
    }
  }
}

// Pack writes zero words for routes that are not this rank's (other experts, dropped routes) and the
// expert's row for its own; unpack leaves dropped routes' slots alone.
TEST(RouteRows, PackZeroesWhatIsNotMineAndUnpackSkipsDroppedRoutes) {
  Layer L = make_layer(30, 8, 5, 1);  // ≈ 9 routes per expert: expert 1 drops some
  const Range mine{3, 7};
  std::vector<uint16_t> routes(L.T * L.k * L.H, 0xffff);
  moesq::ops::route_rows_ref(args(L, L.y, routes, true, mine));
  int dropped = 0;
  for (int64_t q = 0; q < L.T * L.k; ++q) {
    const uint16_t* row = routes.data() + q * L.H;
    const bool own = L.sor[q] >= 0 && mine.contains(L.ids[q]);
    dropped += L.sor[q] < 0;
    if (!own) {
      EXPECT_TRUE(std::all_of(row, row + L.H, [](uint16_t v) { return v == 0; })) << "route " << q;
      continue;
    }
    const uint16_t* yrow = L.y.data() + (static_cast<int64_t>(L.ids[q]) * L.cap + L.sor[q]) * L.ldy;
    EXPECT_TRUE(std::equal(row, row + L.H, yrow)) << "route " << q;
  }
  EXPECT_GT(dropped, 0);
  std::vector<uint16_t> y2(L.y.size(), 0x1234);
  moesq::ops::route_rows_ref(args(L, y2, routes, false, {}));
  EXPECT_EQ(std::count(y2.begin(), y2.end(), uint16_t{0x1234}),
            static_cast<std::ptrdiff_t>(y2.size()) - static_cast<std::ptrdiff_t>((L.T * L.k - dropped) * L.H))
      << "unpack writes the H columns of each kept route's slot and nothing else";
}

TEST(RouteRows, TwoRanksPackingOneRouteIsAnErrorNamingTheRow) {
  Layer L = make_layer(5, 8, 9, -1);
  const int64_t R = L.T * L.k, both = L.ids[0];  // route 0's expert (nothing dropped) on both ranks
  std::vector<uint16_t> a(R * L.H), b(R * L.H), out(R * L.H);
  moesq::ops::route_rows_ref(args(L, L.y, a, true, {0, both + 1}));
  moesq::ops::route_rows_ref(args(L, L.y, b, true, {both, 10}));
  const uint16_t* parts[] = {a.data(), b.data()};
  try {
    moesq::ops::route_rows_sum_ref(parts, 2, R * L.H / 2, L.H, out.data());
    FAIL() << "an overlapping partition was summed";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("was packed by 2 ranks"), std::string::npos) << e.what();
  }
}

TEST(RouteRows, BadArgumentsAreNamed) {
  Layer L = make_layer(4, 8, 11, -1);
  std::vector<uint16_t> routes(L.T * L.k * L.H);
  RouteRowsArgs a = args(L, L.y, routes, true, {0, 10});
  a.H = 7;
  EXPECT_THROW(moesq::ops::route_rows_ref(a), moesq::Error);
  a = args(L, L.y, routes, true, {0, 11});
  EXPECT_THROW(moesq::ops::route_rows_ref(a), moesq::Error);
  a = args(L, L.y, routes, true, {0, 10});
  L.ids[3] = 10;
  EXPECT_THROW(moesq::ops::route_rows_ref(a), moesq::Error);
}
