// CPU tests of ops::finite_check_ref (the twin the GPU kernel is compared with bitwise in
// tests/gpu/test_finite_check.cu) against a plain definition: the first non-finite value in
// (site, group, row, kind) order, found with std::isnan / std::isinf on the values (not on bits), over
// the valid rows only (ungrouped: every row; grouped: the first counts[g] slots of each group, named by
// row_ids / row_div). Also the key layout: its order, its round trip, and the empty record.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/finite_check/finite_check.h"

namespace {

using moesq::ops::FiniteCheckArgs;
using moesq::ops::FiniteKind;
using moesq::ops::kFiniteRecordNone;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float f32_from(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// (site, group, row, kind) of the first non-finite value: the plain definition.
using Finding = std::tuple<uint32_t, int64_t, int64_t, int>;
int kind_of(float v) { return std::isnan(v) ? 0 : v > 0 ? 1 : 2; }

std::optional<Finding> plain_first(const std::vector<float>& x, int64_t cols, int64_t ld, int64_t groups,
                                   int64_t capacity, int64_t rows, const std::vector<int32_t>& counts,
                                   const std::vector<int32_t>& row_ids, int row_div, uint32_t site) {
  std::optional<Finding> best;
  auto visit = [&](int64_t r, int64_t g, int64_t id) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[r * ld + c];
      if (std::isfinite(v)) continue;
      const Finding f{site, g, id, kind_of(v)};
      if (!best || f < *best) best = f;
    }
  };
  if (groups == 0) {
    for (int64_t r = 0; r < rows; ++r) visit(r, 0, r);
  } else {
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t s = 0; s < std::min<int64_t>(std::max(counts[g], 0), capacity); ++s) {
        const int32_t r = row_ids.empty() ? -1 : row_ids[g * capacity + s];
        visit(g * capacity + s, g, r >= 0 ? r / row_div : s);
      }
  }
  return best;
}

std::optional<Finding> decoded(uint64_t record) {
  const moesq::ops::FiniteFinding f = moesq::ops::decode_finite_key(record);
  if (!f.found) return std::nullopt;
  return Finding{f.site, f.group, f.row, static_cast<int>(f.kind)};
}

TEST(FiniteCheck, KeyOrderAndRoundTrip) {
  using moesq::ops::finite_key;
  EXPECT_LT(finite_key(3, 0xffff, 0x3fffffff, FiniteKind::kNegInf), finite_key(4, 0, 0, FiniteKind::kNan));
  EXPECT_LT(finite_key(3, 5, 0x3fffffff, FiniteKind::kNegInf), finite_key(3, 6, 0, FiniteKind::kNan));
  EXPECT_LT(finite_key(3, 5, 9, FiniteKind::kNegInf), finite_key(3, 5, 10, FiniteKind::kNan));
  EXPECT_LT(finite_key(3, 5, 9, FiniteKind::kNan), finite_key(3, 5, 9, FiniteKind::kPosInf));
  const moesq::ops::FiniteFinding f = moesq::ops::decode_finite_key(finite_key(4093, 17, 123456, FiniteKind::kPosInf));
  EXPECT_TRUE(f.found);
  EXPECT_EQ(f.site, 4093u);
  EXPECT_EQ(f.group, 17);
  EXPECT_EQ(f.row, 123456);
  EXPECT_EQ(f.kind, FiniteKind::kPosInf);
  EXPECT_FALSE(moesq::ops::decode_finite_key(kFiniteRecordNone).found);
  EXPECT_STREQ(moesq::ops::finite_kind_name(FiniteKind::kNan), "NaN");
  EXPECT_STREQ(moesq::ops::finite_kind_name(FiniteKind::kNegInf), "-inf");
}

// The bit classification equals std::isnan / std::isinf on every class, in fp32 and bf16: quiet and
// signalling NaN of both signs, ±inf, the largest finite, subnormals, zeros.
TEST(FiniteCheck, BitClassesMatchTheValues) {
  const std::vector<uint32_t> f32 = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f800000u,
                                     0xff800000u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000000u, 0x00000000u,
                                     0x3f800000u};
  for (uint32_t u : f32) {
    const float v = f32_from(u);
    const int want = std::isfinite(v) ? -1 : kind_of(v);
    EXPECT_EQ(moesq::ops::finite_class_f32(u), want) << std::hex << u;
    const uint16_t b = static_cast<uint16_t>(u >> 16);  // a bf16 with the same sign / exponent / top mantissa
    const float bv = moesq::bf16_to_f32(b);
    EXPECT_EQ(moesq::ops::finite_class_bf16(b), std::isfinite(bv) ? -1 : kind_of(bv)) << std::hex << b;
  }
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every bf16
    const float v = moesq::bf16_to_f32(static_cast<uint16_t>(b));
    ASSERT_EQ(moesq::ops::finite_class_bf16(static_cast<uint16_t>(b)), std::isfinite(v) ? -1 : kind_of(v)) << b;
  }
}

// Random fp32 rows (row stride ld > cols) with a few non-finite values, some in the stride padding
// (never read): the twin's record equals the plain first, for several seeds.
TEST(FiniteCheck, UngroupedF32EqualsPlainFirst) {
  const int64_t rows = 37, cols = 70, ld = 75;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd;
    std::vector<float> x(rows * ld);
    for (auto& v : x) v = nd(g);
    const int bad = static_cast<int>(seed % 4);  // 0..3 non-finite values (0: a clean tensor)
    for (int i = 0; i < bad; ++i) x[(g() % rows) * ld + g() % cols] = (g() % 3 == 0) ? kNan : (g() % 2 ? kInf : -kInf);
    x[(g() % rows) * ld + cols + 2] = kNan;  // padding: not part of the tensor
    uint64_t record = kFiniteRecordNone;
    FiniteCheckArgs a;
    a.x_f32 = x.data(), a.rows = rows, a.cols = cols, a.ld = ld, a.site = 42, a.record = &record;
    moesq::ops::finite_check_ref(a);
    EXPECT_EQ(decoded(record), plain_first(x, cols, ld, 0, 0, rows, {}, {}, 1, 42)) << "seed " << seed;
    if (bad == 0) {
      EXPECT_EQ(record, kFiniteRecordNone) << "seed " << seed;
    }
  }
}

// Grouped bf16 [groups, capacity, ld]: rows past counts[g] hold NaN (stale slots) and are never read;
// a row is named by its route id / top-k (the token); a slot without a route id by the slot.
TEST(FiniteCheck, GroupedBf16NamesTheTokenAndSkipsStaleSlots) {
  const int64_t groups = 6, capacity = 9, cols = 40, ld = 40;
  const int topk = 4;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 g(seed);
    std::vector<int32_t> counts(groups), row_ids(groups * capacity, -1);
    std::vector<float> x(groups * capacity * ld);
    for (int64_t e = 0; e < groups; ++e) {
      counts[e] = static_cast<int32_t>(g() % (capacity + 1));
      for (int64_t s = 0; s < capacity; ++s) {
        row_ids[e * capacity + s] = s < counts[e] ? static_cast<int32_t>(g() % (capacity * topk)) : -1;
        for (int64_t c = 0; c < cols; ++c)
          x[(e * capacity + s) * ld + c] = s < counts[e] ? moesq::bf16_to_f32(moesq::f32_to_bf16(0.5f + c)) : kNan;
      }
    }
    if (counts[2] > 0) row_ids[2 * capacity] = -1;  // a valid slot without a route id: named by its slot
    for (int i = 0; i < 3; ++i) {
      const int64_t e = g() % groups;
      if (counts[e] == 0) continue;
      x[(e * capacity + g() % counts[e]) * ld + g() % cols] = i == 0 ? kNan : (i == 1 ? kInf : -kInf);
    }
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = moesq::f32_to_bf16(x[i]);
    uint64_t record = kFiniteRecordNone;
    FiniteCheckArgs a;
    a.x_bf16 = xb.data(), a.cols = cols, a.ld = ld, a.groups = groups, a.capacity = capacity, a.counts = counts.data();
    a.row_ids = row_ids.data(), a.row_div = topk, a.site = 7, a.record = &record;
    moesq::ops::finite_check_ref(a);
    EXPECT_EQ(decoded(record), plain_first(x, cols, ld, groups, capacity, 0, counts, row_ids, topk, 7))
        << "seed " << seed;
  }
}

// A slice of a larger batch (the engine's MoE block in slices of tokens): row0 is added to the reported
// row, ungrouped and grouped (route id / top-k, then + row0).
TEST(FiniteCheck, Row0NamesTheRowInTheWholeBatch) {
  std::vector<float> x(5 * 3, 1.0f);
  x[2 * 3 + 1] = kNan;
  uint64_t record = kFiniteRecordNone;
  FiniteCheckArgs a;
  a.x_f32 = x.data(), a.rows = 5, a.cols = 3, a.ld = 3, a.site = 2, a.record = &record, a.row0 = 1000;
  moesq::ops::finite_check_ref(a);
  EXPECT_EQ(moesq::ops::decode_finite_key(record).row, 1002);
  const std::vector<int32_t> counts = {0, 2}, row_ids = {-1, -1, 5, 9};  // expert 1's slots: routes 5, 9
  record = kFiniteRecordNone;
  FiniteCheckArgs g;
  g.x_f32 = x.data(), g.cols = 3, g.ld = 3, g.groups = 2, g.capacity = 2, g.counts = counts.data();
  g.row_ids = row_ids.data(), g.row_div = 4, g.site = 2, g.record = &record, g.row0 = 64;
  x[2 * 3 + 1] = 1.0f, x[3 * 3] = kNan;  // expert 1, slot 1: route 9 = token 2 of the slice
  moesq::ops::finite_check_ref(g);
  const moesq::ops::FiniteFinding f = moesq::ops::decode_finite_key(record);
  EXPECT_EQ(f.group, 1);
  EXPECT_EQ(f.row, 66);
  // The groups as a slice of the experts (an expert-parallel shard from expert 40): the whole layer's id.
  record = kFiniteRecordNone;
  g.group0 = 40;
  moesq::ops::finite_check_ref(g);
  EXPECT_EQ(moesq::ops::decode_finite_key(record).group, 41);
  g.row0 = -1;
  EXPECT_THROW(moesq::ops::finite_check_ref(g), moesq::Error);
}

// One record over several checks: the smallest site wins whatever the order the checks ran in, and a
// later finding of a larger site leaves it as it is.
TEST(FiniteCheck, TheEarliestSiteWinsWhateverTheOrder) {
  std::vector<float> a_rows(4 * 8, 1.0f), b_rows(4 * 8, 1.0f);
  a_rows[3 * 8 + 1] = kInf;  // site 9, row 3
  b_rows[0 * 8 + 5] = kNan;  // site 12, row 0
  auto run = [](const std::vector<float>& x, uint32_t site, uint64_t& record) {
    FiniteCheckArgs a;
    a.x_f32 = x.data(), a.rows = 4, a.cols = 8, a.ld = 8, a.site = site, a.record = &record;
    moesq::ops::finite_check_ref(a);
  };
  uint64_t forward_order = kFiniteRecordNone, reverse_order = kFiniteRecordNone;
  run(a_rows, 9, forward_order), run(b_rows, 12, forward_order);
  run(b_rows, 12, reverse_order), run(a_rows, 9, reverse_order);
  EXPECT_EQ(forward_order, reverse_order);
  EXPECT_EQ(decoded(forward_order), (Finding{9, 0, 3, 1}));
}

TEST(FiniteCheck, BadArgumentsAreErrors) {
  std::vector<float> x(16, 1.0f);
  std::vector<uint16_t> xb(16, 0);
  uint64_t record = kFiniteRecordNone;
  auto args = [&] {
    FiniteCheckArgs a;
    a.x_f32 = x.data(), a.rows = 2, a.cols = 8, a.ld = 8, a.record = &record;
    return a;
  };
  FiniteCheckArgs a = args();
  a.x_bf16 = xb.data();  // both inputs
  EXPECT_THROW(moesq::ops::finite_check_ref(a), moesq::Error);
  a = args(), a.x_f32 = nullptr;  // neither
  EXPECT_THROW(moesq::ops::finite_check_ref(a), moesq::Error);
  a = args(), a.ld = 7;
  EXPECT_THROW(moesq::ops::finite_check_ref(a), moesq::Error);
  a = args(), a.groups = 2, a.capacity = 1;  // grouped without counts
  EXPECT_THROW(moesq::ops::finite_check_ref(a), moesq::Error);
  a = args(), a.site = moesq::ops::kFiniteMaxSite + 1;
  EXPECT_THROW(moesq::ops::finite_check_ref(a), moesq::Error);
  a = args(), a.record = nullptr;
  EXPECT_THROW(moesq::ops::finite_check_ref(a), moesq::Error);
  a = args(), a.rows = 0;  // an empty tensor: nothing
  moesq::ops::finite_check_ref(a);
  EXPECT_EQ(record, kFiniteRecordNone);
}

}  // namespace
