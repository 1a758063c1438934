// GPU tests of ops::finite_check against its CPU twin (finite_check_ref) on fresh random inputs with
// fixed seeds: the record is a minimum of integer keys, so kernel and twin agree BITWISE on every
// input — ungrouped fp32 / bf16 rows of awkward widths (1, 255, 257, 3000 columns; row stride > cols),
// grouped expert buffers with ragged counts, stale NaN slots past them and route-id naming, several
// checks into one record in any order, and a record an earlier site already holds (left as it is).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/half.h"
#include "ops/finite_check/finite_check.h"
#include "support/gpu_test_main.h"

using moesq::DevBuf;
using moesq::ops::FiniteCheckArgs;
using moesq::ops::kFiniteRecordNone;

namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// `n_bad` non-finite values (NaN, +inf, −inf in turn) at random places of the first `cols` columns.
std::vector<float> rand_rows(int64_t rows, int64_t cols, int64_t ld, int n_bad, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(rows * ld);
  for (auto& v : x) v = d(g);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = cols; c < ld; ++c) x[r * ld + c] = kNan;  // the stride's padding is not the tensor
  for (int i = 0; i < n_bad && rows > 0; ++i)
    x[(g() % rows) * ld + g() % cols] = i % 3 == 0 ? kNan : i % 3 == 1 ? kInf : -kInf;
  return x;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = moesq::f32_to_bf16(x[i]);
  return b;
}

// The kernel's record for `a` (host pointers in a, copied to the device) starting from `start`.
uint64_t device_record(FiniteCheckArgs a, size_t n_values, size_t n_groups, uint64_t start) {
  DevBuf<float> xf;
  DevBuf<uint16_t> xb;
  DevBuf<int32_t> counts, ids;
  if (a.x_f32) xf = DevBuf<float>(a.x_f32, n_values), a.x_f32 = xf.p;
  if (a.x_bf16) xb = DevBuf<uint16_t>(a.x_bf16, n_values), a.x_bf16 = xb.p;
  if (a.counts) counts = DevBuf<int32_t>(a.counts, n_groups), a.counts = counts.p;
  if (a.row_ids) ids = DevBuf<int32_t>(a.row_ids, n_groups * a.capacity), a.row_ids = ids.p;
  DevBuf<uint64_t> rec(&start, 1);
  a.record = rec.p;
  moesq::ops::finite_check(a, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  return rec.download()[0];
}

TEST(GpuFiniteCheck, UngroupedMatchesTwinBitwise) {
  int found = 0;
  for (int64_t cols : {1, 255, 257, 3000})
    for (int64_t rows : {1, 2, 3, 129})
      for (int n_bad : {0, 1, 5})
        for (bool bf16 : {false, true}) {
          const int64_t ld = cols + 3;
          const uint64_t seed = 1000 * cols + 10 * rows + n_bad + (bf16 ? 7 : 0);
          const std::vector<float> x = rand_rows(rows, cols, ld, n_bad, seed);
          const std::vector<uint16_t> xb = to_bf16(x);
          FiniteCheckArgs a;
          if (bf16)
            a.x_bf16 = xb.data();
          else
            a.x_f32 = x.data();
          a.rows = rows, a.cols = cols, a.ld = ld, a.site = 300;
          uint64_t want = kFiniteRecordNone;
          a.record = &want;
          moesq::ops::finite_check_ref(a);
          const uint64_t got = device_record(a, x.size(), 0, kFiniteRecordNone);
          ASSERT_EQ(got, want) << "rows=" << rows << " cols=" << cols << " n_bad=" << n_bad << " bf16=" << bf16;
          if (n_bad == 0) ASSERT_EQ(got, kFiniteRecordNone) << "a clean tensor gave a finding";
          found += got != kFiniteRecordNone;
        }
  EXPECT_GT(found, 0) << "no case had a finding: the test checks nothing";
}

TEST(GpuFiniteCheck, GroupedMatchesTwinBitwise) {
  const int topk = 8;
  for (int64_t groups : {1, 3, 128})
    for (int64_t capacity : {1, 2, 65})
      for (bool bf16 : {false, true}) {
        const int64_t cols = 200, ld = 200;
        std::mt19937_64 g(groups * 1000 + capacity * 2 + bf16);
        std::vector<int32_t> counts(groups), ids(groups * capacity, -1);
        for (auto& c : counts) c = static_cast<int32_t>(g() % (capacity + 1));
        for (int64_t e = 0; e < groups; ++e)
          for (int64_t s = 0; s < counts[e]; ++s) ids[e * capacity + s] = static_cast<int32_t>(g() % (capacity * topk));
        std::vector<float> x = rand_rows(groups * capacity, cols, ld, static_cast<int>(groups), g());
        for (int64_t e = 0; e < groups; ++e)  // stale slots past the count: NaN, never read
          for (int64_t s = counts[e]; s < capacity; ++s) x[(e * capacity + s) * ld] = kNan;
        const std::vector<uint16_t> xb = to_bf16(x);
        FiniteCheckArgs a;
        if (bf16)
          a.x_bf16 = xb.data();
        else
          a.x_f32 = x.data();
        a.cols = cols, a.ld = ld, a.groups = groups, a.capacity = capacity, a.counts = counts.data();
        a.row_ids = ids.data(), a.row_div = topk, a.site = 77, a.group0 = groups == 3 ? 100 : 0;  // a shard too
        uint64_t want = kFiniteRecordNone;
        a.record = &want;
        moesq::ops::finite_check_ref(a);
        const uint64_t got = device_record(a, x.size(), counts.size(), kFiniteRecordNone);
        ASSERT_EQ(got, want) << "groups=" << groups << " capacity=" << capacity << " bf16=" << bf16;
      }
}

// Checks of several sites into ONE device record, launched in reverse forward order: the earliest
// site's finding wins; a record an earlier site holds is left as it is by a later site's check.
TEST(GpuFiniteCheck, OneRecordKeepsTheEarliestSite) {
  const int64_t rows = 16, cols = 64;
  const std::vector<float> early = rand_rows(rows, cols, cols, 1, 5), late = rand_rows(rows, cols, cols, 3, 6);
  DevBuf<float> d_early(early), d_late(late);
  const uint64_t none = kFiniteRecordNone;
  DevBuf<uint64_t> rec(&none, 1);
  uint64_t want = kFiniteRecordNone;
  auto check = [&](const std::vector<float>& host, const DevBuf<float>& dev, uint32_t site) {
    FiniteCheckArgs a;
    a.x_f32 = host.data(), a.rows = rows, a.cols = cols, a.ld = cols, a.site = site, a.record = &want;
    moesq::ops::finite_check_ref(a);
    a.x_f32 = dev.p, a.record = rec.p;
    moesq::ops::finite_check(a, nullptr);
  };
  check(late, d_late, 40);
  check(early, d_early, 12);
  check(late, d_late, 41);  // after a finding of site 12: returns at once, the record stays
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  const uint64_t got = rec.download()[0];
  EXPECT_EQ(got, want);
  EXPECT_EQ(moesq::ops::decode_finite_key(got).site, 12u);
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
