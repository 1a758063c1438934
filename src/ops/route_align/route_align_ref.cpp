// Route alignment, membership, interventions, validation and the paper-000 fixture (see align.h).
// Non-obvious: the CPU "native" order permutes each expert's routes with a generator seeded by
// (history, expert), so two histories disagree on membership exactly like two GPU atomic orders can.
#include "ops/route_align/route_align.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/hash.h"

namespace moesq::ops {

AlignOrder parse_align_order(const std::string& s) {
  if (s == "native") return AlignOrder::Native;
  if (s == "canonical") return AlignOrder::Canonical;
  MOESQ_FAIL("--align: unknown alignment order '", s, "' (expected native or canonical)");
}

const char* align_order_name(AlignOrder o) { return o == AlignOrder::Native ? "native" : "canonical"; }

RouteAlignment align_routes(const std::vector<int32_t>& topk_ids, int64_t M, int topk, int num_experts,
                            int block_size, AlignOrder order, uint64_t history_seed) {
  MOESQ_CHECK(M >= 0 && topk > 0 && num_experts > 0 && block_size > 0, "align_routes: bad sizes M=", M,
              " k=", topk, " E=", num_experts, " b=", block_size);
  MOESQ_CHECK(static_cast<int64_t>(topk_ids.size()) == M * topk, "align_routes: topk_ids has ",
              topk_ids.size(), " entries, expected M·k = ", M * topk);
  std::vector<std::vector<int32_t>> per_expert(num_experts);
  for (int64_t r = 0; r < M * topk; ++r) {
    const int32_t e = topk_ids[r];
    MOESQ_CHECK(e >= 0 && e < num_experts, "align_routes: route ", r, " has expert id ", e, " outside [0, ",
                num_experts, ")");
    per_expert[e].push_back(static_cast<int32_t>(r));  // ascending route id = canonical order
  }
  RouteAlignment a;
  a.M = M;
  a.topk = topk;
  a.num_experts = num_experts;
  a.block_size = block_size;
  const int32_t sentinel = a.sentinel();
  for (int e = 0; e < num_experts; ++e) {
    auto& v = per_expert[e];
    if (v.empty()) continue;
    if (order == AlignOrder::Native) {
      // Emulated atomic order: Fisher–Yates with a generator seeded by (history, expert).
      SplitMix64 g(history_seed * 0x100000001b3ull + static_cast<uint64_t>(e) + 1);
      for (size_t i = v.size() - 1; i > 0; --i) std::swap(v[i], v[g.below(i + 1)]);
    }
    const int64_t nblocks = (static_cast<int64_t>(v.size()) + block_size - 1) / block_size;
    for (int64_t i = 0; i < nblocks * block_size; ++i)
      a.sorted_ids.push_back(i < static_cast<int64_t>(v.size()) ? v[i] : sentinel);
    for (int64_t j = 0; j < nblocks; ++j) a.block_expert.push_back(e);
  }
  return a;
}

std::vector<BlockMembership> block_membership(const RouteAlignment& a) {
  std::vector<BlockMembership> out;
  int32_t prev = -1, local = 0;
  for (int64_t p = 0; p < a.num_blocks(); ++p) {
    BlockMembership m;
    m.expert = a.block_expert[p];
    local = (m.expert == prev) ? local + 1 : 0;
    prev = m.expert;
    m.local_block = local;
    m.global_block = static_cast<int32_t>(p);
    for (int i = 0; i < a.block_size; ++i) {
      const int32_t r = a.sorted_ids[p * a.block_size + i];
      if (r != a.sentinel()) m.routes.push_back(r);
    }
    std::sort(m.routes.begin(), m.routes.end());
    out.push_back(std::move(m));
  }
  return out;
}

std::string mode_identity_string(const std::vector<BlockMembership>& m) {
  std::ostringstream os;
  for (const auto& b : m) {
    os << b.expert << ':' << b.local_block << ':';
    for (size_t i = 0; i < b.routes.size(); ++i) os << (i ? "," : "") << b.routes[i];
    os << ';';
  }
  return os.str();
}

std::string route_block_fingerprint(const RouteAlignment& a) {
  const std::string s = mode_identity_string(block_membership(a));
  return sha256_hex(s.data(), s.size());
}

RoutePosition find_route(const RouteAlignment& a, int32_t route) {
  MOESQ_CHECK(route >= 0 && route < a.sentinel(), "route ", route, " outside [0, M·k = ", a.sentinel(), ")");
  for (int64_t i = 0; i < a.padded_total(); ++i)
    if (a.sorted_ids[i] == route) return {i, i / a.block_size};
  MOESQ_FAIL("route ", route, " is not in the alignment plan");
}

static void swap_rows(RouteAlignment& a, const RoutePosition& p1, const RoutePosition& p2) {
  std::swap(a.sorted_ids[p1.row], a.sorted_ids[p2.row]);
}

void intervene_reorder(RouteAlignment& a, int32_t r1, int32_t r2) {
  const RoutePosition p1 = find_route(a, r1), p2 = find_route(a, r2);
  MOESQ_CHECK(r1 != r2 && p1.block == p2.block, "reorder intervention: routes ", r1, " (block ", p1.block,
              ") and ", r2, " (block ", p2.block, ") must be two routes of the same block");
  swap_rows(a, p1, p2);
}

void intervene_exchange(RouteAlignment& a, int32_t r1, int32_t r2) {
  const RoutePosition p1 = find_route(a, r1), p2 = find_route(a, r2);
  MOESQ_CHECK(p1.block != p2.block, "exchange intervention: routes ", r1, " and ", r2, " share block ",
              p1.block, "; exchange needs two blocks");
  MOESQ_CHECK(a.block_expert[p1.block] == a.block_expert[p2.block], "exchange intervention: route ", r1,
              " (block ", p1.block, ", expert ", a.block_expert[p1.block], ") and route ", r2, " (block ",
              p2.block, ", expert ", a.block_expert[p2.block], ") belong to different experts");
  swap_rows(a, p1, p2);
}

void validate_alignment(const RouteAlignment& a, const std::vector<int32_t>& topk_ids) {
  const int64_t R = a.num_routes();
  MOESQ_CHECK(static_cast<int64_t>(topk_ids.size()) == R, "route: plan has M·k = ", R, " but top-k ids have ",
              topk_ids.size(), " entries");
  MOESQ_CHECK(a.block_size > 0 && a.padded_total() == a.num_blocks() * a.block_size, "expert block: ",
              a.num_blocks(), " blocks of ", a.block_size, " rows do not cover ", a.padded_total(), " rows");
  MOESQ_CHECK(a.num_experts > 0, "expert block: plan has ", a.num_experts, " experts");
  std::vector<int64_t> count(a.num_experts, 0), blocks(a.num_experts, 0);
  for (int64_t r = 0; r < R; ++r) {
    // A plan claiming fewer experts than the top-k ids use wrote past `count` (found while writing
    // fuzz/fuzz_plan.cpp; docs/RELIABILITY.md).
    MOESQ_CHECK(topk_ids[r] >= 0 && topk_ids[r] < a.num_experts, "expert block: route ", r, " is routed to expert ",
                topk_ids[r], ", outside the plan's [0, ", a.num_experts, ")");
    ++count[topk_ids[r]];
  }
  for (int64_t p = 0; p < a.num_blocks(); ++p) {
    const int32_t e = a.block_expert[p];
    MOESQ_CHECK(e >= 0 && e < a.num_experts, "expert block: block ", p, " names expert ", e);
    MOESQ_CHECK(p == 0 || a.block_expert[p - 1] <= e, "expert block: block ", p, " (expert ", e,
                ") follows a block of expert ", a.block_expert[p - 1], "; the vector must be ascending");
    ++blocks[e];
  }
  for (int e = 0; e < a.num_experts; ++e) {
    const int64_t want = (count[e] + a.block_size - 1) / a.block_size;
    MOESQ_CHECK(blocks[e] == want, "expert block: expert ", e, " has ", count[e], " routes, needs ", want,
                " blocks of ", a.block_size, ", plan gives ", blocks[e]);
  }
  std::vector<int> seen(R, 0);
  int64_t row = 0;
  for (int64_t p = 0; p < a.num_blocks();) {
    const int32_t e = a.block_expert[p];
    int64_t q = p;
    while (q < a.num_blocks() && a.block_expert[q] == e) ++q;
    // Rows [p·b, q·b) are expert e's region: count[e] valid routes, then sentinels.
    for (row = p * a.block_size; row < q * a.block_size; ++row) {
      const int32_t r = a.sorted_ids[row];
      const int64_t i = row - p * a.block_size;
      if (i >= count[e]) {
        MOESQ_CHECK(r == a.sentinel(), "route: row ", row, " (expert ", e, " padding) holds ", r,
                    " instead of the sentinel ", a.sentinel());
        continue;
      }
      MOESQ_CHECK(r >= 0 && r < R, "route: row ", row, " holds ", r, ", outside [0, ", R, ")");
      MOESQ_CHECK(topk_ids[r] == e, "route: route ", r, " in block ", row / a.block_size, " (expert ", e,
                  ") is routed to expert ", topk_ids[r]);
      MOESQ_CHECK(++seen[r] == 1, "route: route ", r, " appears twice");
    }
    p = q;
  }
  for (int64_t r = 0; r < R; ++r) MOESQ_CHECK(seen[r] == 1, "route: route ", r, " is missing from the plan");
}

std::vector<int32_t> make_fixture_topk_ids(uint64_t seed) {
  // 49 active experts: 40 below kFixtureSpanExpert, the span expert itself (12 routes → 2 blocks, so
  // it occupies global blocks 40 and 41), and 8 above it. The other 156 routes go round-robin over the
  // 48 other experts (3 or 4 each → one block each): 40 + 2 + 8 = 50 blocks, 400 rows.
  SplitMix64 g(seed ^ 0xa11a11a11ull);
  auto shuffle = [&](std::vector<int32_t>& v) {
    for (size_t i = v.size() - 1; i > 0; --i) std::swap(v[i], v[g.below(i + 1)]);
  };
  std::vector<int32_t> low(kFixtureSpanExpert), high(kFixtureExperts - kFixtureSpanExpert - 1);
  std::iota(low.begin(), low.end(), 0);
  std::iota(high.begin(), high.end(), kFixtureSpanExpert + 1);
  shuffle(low);
  shuffle(high);
  std::vector<int32_t> others(low.begin(), low.begin() + 40);
  others.insert(others.end(), high.begin(), high.begin() + 8);
  shuffle(others);  // round-robin order
  std::vector<int32_t> tokens(kFixtureM);
  std::iota(tokens.begin(), tokens.end(), 0);
  shuffle(tokens);
  std::vector<bool> has_span(kFixtureM, false);
  for (int i = 0; i < 12; ++i) has_span[tokens[i]] = true;
  std::vector<int32_t> ids(kFixtureM * kFixtureTopk);
  size_t next = 0;
  for (int64_t t = 0; t < kFixtureM; ++t) {
    std::vector<int32_t> row;
    if (has_span[t]) row.push_back(kFixtureSpanExpert);
    while (static_cast<int>(row.size()) < kFixtureTopk) row.push_back(others[next++ % others.size()]);
    shuffle(row);  // the span expert lands in a seeded slot
    std::copy(row.begin(), row.end(), ids.begin() + t * kFixtureTopk);
  }
  return ids;
}

std::vector<float> make_fixture_topk_weights(int64_t M, int topk, uint64_t seed) {
  SplitMix64 g(seed ^ 0x7e1647ull);
  std::vector<float> w(M * topk);
  for (int64_t t = 0; t < M; ++t) {
    float sum = 0.0f;
    for (int s = 0; s < topk; ++s) sum += (w[t * topk + s] = 0.05f + g.uniform());
    for (int s = 0; s < topk; ++s) w[t * topk + s] /= sum;
  }
  return w;
}

}  // namespace moesq::ops
