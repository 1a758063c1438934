// CPU tests of the q/k-norm + RoPE + KV-append twin (ops/qk_rope): rows appended through a
// non-identity slot table (slot_of_row = tok_slot) write, bit for bit, the cache rows and queries
// each row writes alone into slot 0, and touch no other slot's rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "ops/qk_rope/qk_rope.h"

namespace {

using namespace moesq;

TEST(QkRopeRef, SlotTableOnlyMovesTheAppend) {
  const int nh = 4, nkv = 2, hd = 64, slots = 4, heads = nh + 2 * nkv;
  const int64_t max_len = 12, row_w = nkv * hd, slot_w = max_len * row_w;
  const std::vector<int32_t> slot = {3, 1, 3}, pos = {5, 0, 11};
  const int64_t T = slot.size();
  std::mt19937_64 g(23);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> qkv(T * heads * hd), qn(hd), kn(hd), cs(max_len * hd / 2), sn(max_len * hd / 2);
  for (auto& x : qkv) x = 1.5f * d(g);
  for (auto& x : qn) x = 1.0f + 0.1f * d(g);
  for (auto& x : kn) x = 1.0f + 0.1f * d(g);
  for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.37f * i), sn[i] = std::sin(0.37f * i);
  constexpr uint16_t kUntouched = 0x7fc0;  // NaN: a row no token appended
  std::vector<uint16_t> kc(slots * slot_w, kUntouched), vc(kc.size(), kUntouched);
  std::vector<float> q(T * nh * hd);
  ops::QkRopeArgs a;
  a.qkv = qkv.data(), a.q_norm = qn.data(), a.k_norm = kn.data(), a.cos = cs.data(), a.sin = sn.data();
  a.tok_slot = slot.data(), a.tok_pos = pos.data(), a.q_out = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data();
  a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
  ops::qk_rope_ref(a);
  std::vector<char> written(slots * max_len, 0);
  for (int64_t t = 0; t < T; ++t) {
    written[slot[t] * max_len + pos[t]] = 1;
    const int32_t zero = 0;
    std::vector<uint16_t> k1(slot_w, kUntouched), v1(slot_w, kUntouched);
    std::vector<float> q1(nh * hd);
    ops::QkRopeArgs b = a;
    b.qkv = qkv.data() + t * heads * hd, b.tok_slot = &zero, b.tok_pos = pos.data() + t, b.q_out = q1.data();
    b.k_cache = k1.data(), b.v_cache = v1.data(), b.T = 1;
    ops::qk_rope_ref(b);
    for (int i = 0; i < nh * hd; ++i) ASSERT_EQ(q[t * nh * hd + i], q1[i]) << "row " << t << " q elem " << i;
    for (int64_t i = 0; i < row_w; ++i) {
      ASSERT_EQ(kc[slot[t] * slot_w + pos[t] * row_w + i], k1[pos[t] * row_w + i]) << "row " << t << " k elem " << i;
      ASSERT_EQ(vc[slot[t] * slot_w + pos[t] * row_w + i], v1[pos[t] * row_w + i]) << "row " << t << " v elem " << i;
    }
    EXPECT_NE(std::count(k1.begin(), k1.end(), kUntouched), slot_w) << "row " << t << " appended nothing";
  }
  for (int s = 0; s < slots; ++s)
    for (int64_t p = 0; p < max_len; ++p)
      if (!written[s * max_len + p])
        for (int64_t i = 0; i < row_w; ++i)
          ASSERT_EQ(kc[s * slot_w + p * row_w + i], kUntouched) << "slot " << s << " position " << p << " was written";
}

}  // namespace
