// CPU tests of the attention twin (ops/attention): attention_ref's chunked softmax (64-key chunks
// merged in order, the kernel's formula) against a plain two-pass fp64 softmax on fresh random inputs,
// rows reading their keys through a non-identity slot table (slot_of_row = tok_slot), gpt-oss's
// sliding window and attention sinks, and the prefill tiling rule of attention_tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/attention/attention.h"

namespace {

using namespace moesq;

// fp32 chunk sums + merge vs fp64 two-pass: ~1e-6 relative on O(1) outputs; then bf16 hi + lo output.
constexpr double kRefVsExactTol = 1e-5;

TEST(AttentionRef, ChunkedMergeEqualsPlainSoftmax) {
  const int nh = 4, nkv = 2, hd = 64;
  const std::vector<int32_t> slot = {0, 0, 1, 1, 1}, pos = {0, 63, 64, 129, 200};
  const int64_t T = slot.size(), max_len = 201;
  std::mt19937_64 g(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> q(T * nh * hd);
  for (auto& x : q) x = 0.7f * d(g);
  std::vector<uint16_t> kc(2 * max_len * nkv * hd), vc(kc.size());
  for (auto& x : kc) x = f32_to_bf16(d(g));
  for (auto& x : vc) x = f32_to_bf16(d(g));
  std::vector<uint16_t> out(T * nh * hd), lo(T * nh * hd);
  ops::AttentionArgs a;
  a.q = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data(), a.tok_slot = slot.data(), a.tok_pos = pos.data();
  a.out = out.data(), a.out_lo = lo.data(), a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ops::attention_ref(a);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h) {
      const int kv = h / (nh / nkv);
      std::vector<double> s(pos[t] + 1);
      double mx = -1e300;
      for (int j = 0; j <= pos[t]; ++j) {
        double dot = 0.0;
        for (int c = 0; c < hd; ++c)
          dot += static_cast<double>(q[(t * nh + h) * hd + c]) *
                 bf16_to_f32(kc[((slot[t] * max_len + j) * nkv + kv) * hd + c]);
        s[j] = dot * a.scale;
        mx = std::max(mx, s[j]);
      }
      double l = 0.0;
      for (auto& x : s) l += (x = std::exp(x - mx));
      for (int c = 0; c < hd; ++c) {
        double o = 0.0;
        for (int j = 0; j <= pos[t]; ++j) o += s[j] * bf16_to_f32(vc[((slot[t] * max_len + j) * nkv + kv) * hd + c]);
        o /= l;
        const size_t i = (t * nh + h) * hd + c;
        const double got = static_cast<double>(bf16_to_f32(out[i])) + bf16_to_f32(lo[i]);
        ASSERT_NEAR(got, o, kRefVsExactTol * (1.0 + std::fabs(o))) << "token " << t << " head " << h << " elem " << c;
      }
    }
}

// gpt-oss's attention: a sliding window (row p sees keys p − window < j ≤ p) and one sink logit per
// head in the softmax denominator — the twin's chunk skipping, masking and sink fold against a plain
// fp64 softmax over [scores | sink]; windows that are and are not multiples of the 64-key chunk.
TEST(AttentionRef, SlidingWindowAndSinksEqualPlainSoftmax) {
  const int nh = 4, nkv = 2, hd = 32;
  const std::vector<int32_t> slot = {0, 0, 0, 0, 0, 0}, pos = {0, 5, 63, 64, 130, 299};
  const int64_t T = slot.size(), max_len = 300;
  std::mt19937_64 g(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> q(T * nh * hd), sinks(nh);
  for (auto& x : q) x = 0.7f * d(g);
  for (auto& x : sinks) x = 2.0f * d(g);
  std::vector<uint16_t> kc(max_len * nkv * hd), vc(kc.size());
  for (auto& x : kc) x = f32_to_bf16(d(g));
  for (auto& x : vc) x = f32_to_bf16(d(g));
  for (const int64_t window : {int64_t{0}, int64_t{64}, int64_t{100}, int64_t{1}})
    for (const bool with_sinks : {false, true}) {
      std::vector<uint16_t> out(T * nh * hd), lo(T * nh * hd);
      ops::AttentionArgs a;
      a.q = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data(), a.tok_slot = slot.data(), a.tok_pos = pos.data();
      a.out = out.data(), a.out_lo = lo.data(), a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
      a.scale = 1.0f / std::sqrt(static_cast<float>(hd)), a.window = window, a.sinks = with_sinks ? sinks.data() : nullptr;
      ops::attention_ref(a);
      for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < nh; ++h) {
          const int kv = h / (nh / nkv);
          const int64_t first = window > 0 ? std::max<int64_t>(0, pos[t] - window + 1) : 0;
          std::vector<double> s;
          double mx = with_sinks ? sinks[h] : -1e300;
          for (int64_t j = first; j <= pos[t]; ++j) {
            double dot = 0.0;
            for (int c = 0; c < hd; ++c)
              dot += static_cast<double>(q[(t * nh + h) * hd + c]) * bf16_to_f32(kc[(j * nkv + kv) * hd + c]);
            s.push_back(dot * a.scale);
            mx = std::max(mx, s.back());
          }
          double l = with_sinks ? std::exp(sinks[h] - mx) : 0.0;
          for (auto& x : s) l += (x = std::exp(x - mx));
          for (int c = 0; c < hd; ++c) {
            double o = 0.0;
            for (int64_t j = first; j <= pos[t]; ++j) o += s[j - first] * bf16_to_f32(vc[(j * nkv + kv) * hd + c]);
            o /= l;
            const size_t i = (t * nh + h) * hd + c;
            const double got = static_cast<double>(bf16_to_f32(out[i])) + bf16_to_f32(lo[i]);
            ASSERT_NEAR(got, o, kRefVsExactTol * (1.0 + std::fabs(o)))
                << "window " << window << " sinks " << with_sinks << " token " << t << " head " << h << " elem " << c;
          }
        }
    }
  // A window of 1 without sinks is the key at the row's own position: its v row, exactly.
  std::vector<uint16_t> out(T * nh * hd);
  ops::AttentionArgs a;
  a.q = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data(), a.tok_slot = slot.data(), a.tok_pos = pos.data();
  a.out = out.data(), a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len, a.scale = 0.5f, a.window = 1;
  ops::attention_ref(a);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h)
      for (int c = 0; c < hd; ++c)
        ASSERT_EQ(out[(t * nh + h) * hd + c], vc[(pos[t] * nkv + h / (nh / nkv)) * hd + c]) << "token " << t;
  a.window = -1;
  EXPECT_THROW(ops::attention_check(a), Error);
}

// Decode rows whose sequences live in slots {3, 1} of a 4-slot cache give, bit for bit, what each
// row gives alone with its sequence in slot 0 of a 1-slot cache: the slot table only moves the base
// address, the keys and their fixed 64-key chunks are the same.
TEST(AttentionRef, SlotTableOnlyMovesTheKeys) {
  const int nh = 8, nkv = 2, hd = 128, slots = 4;
  const int64_t max_len = 150;
  const std::vector<int32_t> slot = {3, 1}, pos = {129, 64};
  const int64_t T = slot.size(), row_w = nkv * hd;
  std::mt19937_64 g(17);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> q(T * nh * hd);
  for (auto& x : q) x = 0.7f * d(g);
  std::vector<uint16_t> kc(slots * max_len * row_w), vc(kc.size());
  for (auto& x : kc) x = f32_to_bf16(d(g));
  for (auto& x : vc) x = f32_to_bf16(d(g));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<uint16_t> out(T * nh * hd), lo(T * nh * hd);
  ops::AttentionArgs a;
  a.q = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data(), a.tok_slot = slot.data(), a.tok_pos = pos.data();
  a.out = out.data(), a.out_lo = lo.data(), a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
  a.scale = scale;
  ops::attention_ref(a);
  for (int64_t t = 0; t < T; ++t) {
    const auto first = kc.begin() + slot[t] * max_len * row_w, vfirst = vc.begin() + slot[t] * max_len * row_w;
    const std::vector<uint16_t> k1(first, first + max_len * row_w), v1(vfirst, vfirst + max_len * row_w);
    const int32_t zero = 0;
    std::vector<uint16_t> o1(nh * hd), lo1(nh * hd);
    ops::AttentionArgs b = a;
    b.q = q.data() + t * nh * hd, b.k_cache = k1.data(), b.v_cache = v1.data(), b.tok_slot = &zero;
    b.tok_pos = pos.data() + t, b.out = o1.data(), b.out_lo = lo1.data(), b.T = 1;
    ops::attention_ref(b);
    for (int i = 0; i < nh * hd; ++i) {
      ASSERT_EQ(out[t * nh * hd + i], o1[i]) << "row " << t << " (slot " << slot[t] << ") elem " << i;
      ASSERT_EQ(lo[t * nh * hd + i], lo1[i]) << "row " << t << " (slot " << slot[t] << ") lo elem " << i;
    }
    EXPECT_NE(std::count(o1.begin(), o1.end(), uint16_t{0}), nh * hd);
  }
}

// Paged KV (ops/attention/kv_layout.h): the same sequences stored in scattered 64-token blocks of a
// larger cache (a scrambled block table, the blocks nobody owns filled with other values) give the
// contiguous layout's outputs bit for bit; a table entry outside the cache is refused by name.
TEST(AttentionRef, PagedBlocksGiveTheContiguousBits) {
  const int nh = 8, nkv = 2, hd = 64, slots = 2;
  const int64_t max_len = 200, row_w = nkv * hd, bps = ops::kv_blocks_per_slot(max_len);  // 4 blocks per slot
  ASSERT_EQ(bps, 4);
  const std::vector<int32_t> slot = {1, 0, 1, 0}, pos = {199, 63, 64, 130};
  const int64_t T = slot.size();
  std::mt19937_64 g(29);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> q(T * nh * hd);
  for (auto& x : q) x = 0.7f * d(g);
  std::vector<uint16_t> kc(slots * max_len * row_w), vc(kc.size());
  for (auto& x : kc) x = f32_to_bf16(d(g));
  for (auto& x : vc) x = f32_to_bf16(d(g));
  const int64_t kv_blocks = 11;
  const std::vector<int32_t> table = {7, 2, 9, 0,    // slot 0: blocks 0..3
                                      4, 10, 1, 5};  // slot 1
  std::vector<uint16_t> kp(kv_blocks * ops::kKvBlockTokens * row_w), vp(kp.size());
  for (auto& x : kp) x = f32_to_bf16(d(g));  // blocks 3, 6, 8 stay foreign
  for (auto& x : vp) x = f32_to_bf16(d(g));
  for (int s = 0; s < slots; ++s)
    for (int64_t p = 0; p < max_len; ++p) {
      const int64_t row = ops::kv_row(table.data(), max_len, s, p);
      EXPECT_EQ(row, table[s * bps + p / 64] * 64 + p % 64);
      std::copy_n(kc.begin() + (s * max_len + p) * row_w, row_w, kp.begin() + row * row_w);
      std::copy_n(vc.begin() + (s * max_len + p) * row_w, row_w, vp.begin() + row * row_w);
    }
  std::vector<uint16_t> out(T * nh * hd), lo(out.size()), out_p(out.size()), lo_p(out.size());
  ops::AttentionArgs a;
  a.q = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data(), a.tok_slot = slot.data(), a.tok_pos = pos.data();
  a.out = out.data(), a.out_lo = lo.data(), a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ops::attention_ref(a);
  ops::AttentionArgs b = a;
  b.k_cache = kp.data(), b.v_cache = vp.data(), b.block_table = table.data(), b.kv_blocks = kv_blocks;
  b.out = out_p.data(), b.out_lo = lo_p.data();
  ops::attention_ref(b);
  EXPECT_EQ(out, out_p);
  EXPECT_EQ(lo, lo_p);
  EXPECT_NE(std::count(out.begin(), out.end(), uint16_t{0}), static_cast<long>(out.size()));
  std::vector<int32_t> bad = table;
  bad[1 * bps + 3] = static_cast<int32_t>(kv_blocks);  // slot 1's last block: read by the position-199 row
  b.block_table = bad.data();
  try {
    ops::attention_ref(b);
    FAIL() << "a block outside the cache was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV block 11"), std::string::npos) << e.what();
  }
}

TEST(AttentionTiles, SplitOnSlotGapAndSize) {
  // G = 8 (32 / 4): at most 64 / 8 = 8 tokens per tile.
  std::vector<int32_t> slot, pos;
  for (int p = 0; p < 10; ++p) slot.push_back(0), pos.push_back(p);  // 10 → 8 + 2
  slot.push_back(1), pos.push_back(5);                                // new slot
  slot.push_back(1), pos.push_back(7);                                // position gap
  slot.push_back(1), pos.push_back(8);
  const std::vector<int32_t> t = ops::attention_tiles(slot.data(), pos.data(), slot.size(), 32, 4);
  const std::vector<int32_t> want = {0, 8, 8, 2, 10, 1, 11, 2};
  EXPECT_EQ(t, want);
  EXPECT_THROW(ops::attention_tiles(slot.data(), pos.data(), slot.size(), 32, 5), Error);
}

TEST(AttentionRef, RefusesUnbuiltShapes) {
  ops::AttentionArgs a;
  a.T = 0, a.nh = 4, a.nkv = 4, a.hd = 96, a.max_len = 8;
  EXPECT_THROW(ops::attention_ref(a), Error);
  a.hd = 64, a.nh = 12, a.nkv = 4;
  EXPECT_THROW(ops::attention_ref(a), Error);
}

}  // namespace
