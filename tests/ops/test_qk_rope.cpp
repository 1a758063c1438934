// CPU tests of ops::qk_rope_ref (the GPU kernel's twin, compared bitwise in tests/gpu/test_engine_ops.cu)
// against the plain definition: per-head RMSNorm of q and k (fp64 mean of squares), then the
// rotate-half RoPE r = (lo·cos − hi·sin, hi·cos + lo·sin) in fp64; q kept fp32, k and v written to the
// bf16 cache at (slot, position), nothing else of the cache touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/qk_rope/qk_rope.h"

namespace {

using moesq::bf16_to_f32;
using moesq::ops::QkRopeArgs;

// q: fp32 roundings of the head norm (1/sqrt, x·inv, w·(·)) and of the rotation's two products and
// sum, each 2^-24 of |lo·cos| + |hi·sin|: ~6·2^-24 ≈ 3.6e-7; 1e-6 leaves a margin.
constexpr double kQRelTol = 1e-6;
// k: the same, then one bf16 rounding (2^-9 relative); 2^-8 covers both.
constexpr double kKRelTol = 1.0 / 256;
constexpr uint16_t kUnwritten = 0x7f7f;  // a finite bf16 sentinel in every cache entry no token writes

struct Problem {
  int nh = 4, nkv = 2, hd = 64, slots = 3;
  int64_t T = 0, max_len = 8;
  std::vector<float> qkv, q_norm, k_norm, cos, sin;  // [T, (nh+2nkv)·hd], [hd], [hd], [max_len, hd/2] ×2
  std::vector<int32_t> slot, pos;                    // [T]
};

Problem make_problem(int hd, int64_t T, uint64_t seed) {
  Problem p;
  p.hd = hd, p.T = T;
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::uniform_real_distribution<float> wd(0.5f, 1.5f);
  p.qkv.resize(T * (p.nh + 2 * p.nkv) * hd);
  for (auto& v : p.qkv) v = nd(g);
  p.q_norm.resize(hd), p.k_norm.resize(hd);
  for (auto& v : p.q_norm) v = wd(g);
  for (auto& v : p.k_norm) v = wd(g);
  const int half = hd / 2;
  p.cos.resize(p.max_len * half), p.sin.resize(p.max_len * half);
  for (int64_t t = 0; t < p.max_len; ++t)
    for (int i = 0; i < half; ++i) {
      const double theta = t * std::pow(10000.0, -2.0 * i / hd);
      p.cos[t * half + i] = static_cast<float>(std::cos(theta));
      p.sin[t * half + i] = static_cast<float>(std::sin(theta));
    }
  // Distinct (slot, position) per token, spread over slots and positions.
  for (int64_t t = 0; t < T; ++t) {
    p.slot.push_back(static_cast<int32_t>(t % p.slots));
    p.pos.push_back(static_cast<int32_t>((t / p.slots * 3 + t) % p.max_len));
  }
  return p;
}

struct Out {
  std::vector<float> q;             // [T, nh·hd]
  std::vector<uint16_t> k, v;       // [slots, max_len, nkv, hd]
};

Out run_ref(const Problem& p, double eps) {
  Out o;
  o.q.assign(p.T * p.nh * p.hd, 0.0f);
  o.k.assign(static_cast<size_t>(p.slots) * p.max_len * p.nkv * p.hd, kUnwritten);
  o.v = o.k;
  QkRopeArgs a;
  a.qkv = p.qkv.data(), a.q_norm = p.q_norm.data(), a.k_norm = p.k_norm.data(), a.cos = p.cos.data();
  a.sin = p.sin.data(), a.tok_slot = p.slot.data(), a.tok_pos = p.pos.data(), a.q_out = o.q.data();
  a.k_cache = o.k.data(), a.v_cache = o.v.data(), a.T = p.T, a.nh = p.nh, a.nkv = p.nkv, a.hd = p.hd;
  a.max_len = p.max_len, a.eps = eps;
  moesq::ops::qk_rope_ref(a);
  return o;
}

// The plain definition of one head: rotated values r [hd] and the error scale |lo·cos| + |hi·sin| [hd].
void plain_head(const float* x, const float* w, const float* c, const float* s, int hd, double eps,
                std::vector<double>& r, std::vector<double>& scale) {
  double ss = 0.0;
  for (int i = 0; i < hd; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / hd + eps);
  const int half = hd / 2;
  r.assign(hd, 0.0), scale.assign(hd, 0.0);
  for (int i = 0; i < half; ++i) {
    const double lo = w[i] * (x[i] * inv), hi = w[i + half] * (x[i + half] * inv);
    r[i] = lo * c[i] - hi * s[i];
    r[i + half] = hi * c[i] + lo * s[i];
    scale[i] = scale[i + half] = std::fabs(lo * c[i]) + std::fabs(hi * s[i]) + std::fabs(hi * c[i]) +
                                 std::fabs(lo * s[i]);
  }
}

TEST(QkRopeRef, MatchesThePlainDefinition) {
  uint64_t seed = 40;
  for (int hd : {64, 128, 256}) {
    for (int64_t T : {1, 2, 7}) {
      const Problem p = make_problem(hd, T, ++seed);
      const double eps = 1e-6;
      const Out o = run_ref(p, eps);
      const int heads = p.nh + 2 * p.nkv, half = hd / 2;
      std::vector<char> written(o.k.size(), 0);
      std::vector<double> r, scale;
      bool nonzero = false;
      for (int64_t t = 0; t < T; ++t) {
        const float* c = p.cos.data() + p.pos[t] * half;
        const float* s = p.sin.data() + p.pos[t] * half;
        for (int j = 0; j < heads; ++j) {
          const float* x = p.qkv.data() + (t * heads + j) * hd;
          const int kv = j < p.nh ? 0 : (j < p.nh + p.nkv ? j - p.nh : j - p.nh - p.nkv);
          const int64_t off = ((p.slot[t] * p.max_len + p.pos[t]) * p.nkv + kv) * hd;
          if (j >= p.nh + p.nkv) {  // v: the bf16 of the projection, bitwise
            for (int i = 0; i < hd; ++i)
              ASSERT_EQ(o.v[off + i], moesq::f32_to_bf16(x[i])) << "v: hd=" << hd << " T=" << T << " token " << t
                                                                << " head " << j << " first bad col " << i;
            continue;
          }
          plain_head(x, j < p.nh ? p.q_norm.data() : p.k_norm.data(), c, s, hd, eps, r, scale);
          for (int i = 0; i < hd; ++i) {
            if (j < p.nh) {
              const double got = o.q[(t * p.nh + j) * hd + i];
              ASSERT_LE(std::fabs(got - r[i]), kQRelTol * scale[i])
                  << "q: hd=" << hd << " T=" << T << " token " << t << " head " << j << " first bad col " << i;
              nonzero |= got != 0.0;
            } else {
              const double got = bf16_to_f32(o.k[off + i]);
              ASSERT_LE(std::fabs(got - r[i]), kKRelTol * scale[i])
                  << "k: hd=" << hd << " T=" << T << " token " << t << " head " << j << " first bad col " << i;
              written[off + i] = 1;
            }
          }
        }
      }
      EXPECT_TRUE(nonzero);
      for (size_t i = 0; i < o.k.size(); ++i)
        if (!written[i]) {
          ASSERT_EQ(o.k[i], kUnwritten) << "k cache entry " << i << " written by no token";
          ASSERT_EQ(o.v[i], kUnwritten) << "v cache entry " << i << " written by no token";
        }
    }
  }
}

// Position 0 (cos = 1, sin = 0), heads of constant ±2 with eps = 0: the norm is exactly 0.5, so q and k
// equal ±w for integer weights, bitwise.
TEST(QkRopeRef, IntegerValuedCaseIsExact) {
  Problem p = make_problem(64, 2, 9);
  for (size_t i = 0; i < p.qkv.size(); ++i) p.qkv[i] = (i / 64) % 2 ? -2.0f : 2.0f;
  for (int i = 0; i < p.hd; ++i) p.q_norm[i] = static_cast<float>(1 + i % 5), p.k_norm[i] = static_cast<float>(2 + i % 3);
  p.pos = {0, 0}, p.slot = {0, 2};
  const Out o = run_ref(p, 0.0);
  const int heads = p.nh + 2 * p.nkv;
  for (int64_t t = 0; t < p.T; ++t)
    for (int j = 0; j < p.nh + p.nkv; ++j) {
      const float sign = ((t * heads + j) % 2) ? -1.0f : 1.0f;
      for (int i = 0; i < p.hd; ++i) {
        if (j < p.nh) {
          ASSERT_EQ(o.q[(t * p.nh + j) * p.hd + i], sign * p.q_norm[i]) << "q token " << t << " head " << j << " col " << i;
        } else {
          const int64_t off = ((p.slot[t] * p.max_len) * p.nkv + (j - p.nh)) * p.hd;
          ASSERT_EQ(bf16_to_f32(o.k[off + i]), sign * p.k_norm[i]) << "k token " << t << " head " << j << " col " << i;
        }
      }
    }
}

TEST(QkRopeRef, RefusesBadShapesAndPositions) {
  Problem p = make_problem(64, 1, 5);
  Out o;
  o.q.assign(p.nh * p.hd, 0.0f);
  o.k.assign(static_cast<size_t>(p.slots) * p.max_len * p.nkv * p.hd, 0);
  o.v = o.k;
  QkRopeArgs a;
  a.qkv = p.qkv.data(), a.q_norm = p.q_norm.data(), a.k_norm = p.k_norm.data(), a.cos = p.cos.data();
  a.sin = p.sin.data(), a.tok_slot = p.slot.data(), a.tok_pos = p.pos.data(), a.q_out = o.q.data();
  a.k_cache = o.k.data(), a.v_cache = o.v.data(), a.T = 1, a.nh = p.nh, a.nkv = p.nkv, a.max_len = p.max_len;
  for (int hd : {0, 16, 48, 320}) {  // not a multiple of 32, or above 256
    a.hd = hd;
    EXPECT_THROW(moesq::ops::qk_rope_ref(a), moesq::Error) << "hd=" << hd;
  }
  a.hd = 64, a.nh = 3;  // not a multiple of nkv
  EXPECT_THROW(moesq::ops::qk_rope_ref(a), moesq::Error);
  a.nh = p.nh;
  p.pos[0] = static_cast<int32_t>(p.max_len);
  EXPECT_THROW(moesq::ops::qk_rope_ref(a), moesq::Error);
}

}  // namespace

// Rows appended through a non-identity slot table (slot_of_row = tok_slot) write, bit for bit, the cache
// rows and queries each row writes alone into slot 0, and touch no other slot's rows.
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


// Paged KV (ops/attention/kv_layout.h): the append lands at the row the block table names, with the
// bits the contiguous layout gets; the queries do not change; rows of other blocks stay untouched.
TEST(QkRopeRef, PagedAppendWritesTheTablesRow) {
  const int nh = 4, nkv = 2, hd = 64, slots = 2, heads = nh + 2 * nkv;
  const int64_t max_len = 130, row_w = nkv * hd, bps = ops::kv_blocks_per_slot(max_len), kv_blocks = 7;
  const std::vector<int32_t> slot = {1, 0, 1}, pos = {129, 3, 64};
  const std::vector<int32_t> table = {5, -1, -1,  // slot 0 owns one block; -1: none (never read)
                                      2, 6, 0};
  const int64_t T = slot.size();
  std::mt19937_64 g(31);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> qkv(T * heads * hd), qn(hd, 1.0f), kn(hd, 1.0f), cs(max_len * hd / 2), sn(max_len * hd / 2);
  for (auto& x : qkv) x = 1.5f * d(g);
  for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.11f * i), sn[i] = std::sin(0.11f * i);
  constexpr uint16_t kUntouched = 0x7fc0;
  std::vector<uint16_t> kc(slots * max_len * row_w, kUntouched), vc(kc.size(), kUntouched);
  std::vector<uint16_t> kp(kv_blocks * ops::kKvBlockTokens * row_w, kUntouched), vp(kp.size(), kUntouched);
  std::vector<float> q(T * nh * hd), qp(q.size());
  ops::QkRopeArgs a;
  a.qkv = qkv.data(), a.q_norm = qn.data(), a.k_norm = kn.data(), a.cos = cs.data(), a.sin = sn.data();
  a.tok_slot = slot.data(), a.tok_pos = pos.data(), a.q_out = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data();
  a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
  ops::qk_rope_ref(a);
  ops::QkRopeArgs b = a;
  b.q_out = qp.data(), b.k_cache = kp.data(), b.v_cache = vp.data(), b.block_table = table.data(), b.kv_blocks = kv_blocks;
  ops::qk_rope_ref(b);
  EXPECT_EQ(q, qp);
  int64_t written = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = table[slot[t] * bps + pos[t] / 64] * 64 + pos[t] % 64;
    for (int64_t i = 0; i < row_w; ++i) {
      ASSERT_EQ(kp[row * row_w + i], kc[(slot[t] * max_len + pos[t]) * row_w + i]) << "token " << t << " k " << i;
      ASSERT_EQ(vp[row * row_w + i], vc[(slot[t] * max_len + pos[t]) * row_w + i]) << "token " << t << " v " << i;
    }
    written += row_w;
  }
  EXPECT_EQ(static_cast<int64_t>(std::count(kp.begin(), kp.end(), kUntouched)), static_cast<int64_t>(kp.size()) - written);
  std::vector<int32_t> bad = table;
  bad[1 * bps + 2] = -1;  // the position-129 token's block
  b.block_table = bad.data();
  EXPECT_THROW(ops::qk_rope_ref(b), Error);
}

}  // namespace
