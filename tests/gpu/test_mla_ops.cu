// GPU tests of the MLA ops (src/ops/mla) against their CPU twins on fresh random inputs with fixed
// seeds: mla_prep, mla_q and mla_heads_to_rows BITWISE (same rounding order), mla_attention within a
// named tolerance (expf vs std::exp) — and BITWISE against itself across calls: a token's output is
// the same whether it comes alone (decode), inside a prompt, or beside other sequences, contiguous or
// paged, through the sequential or the split-KV path (the batch-invariance contract of ops/mla/mla.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/cuda/dev_buf.cuh"
#include "core/half.h"
#include "ops/mla/mla.h"
#include "support/gpu_test_main.h"

using moesq::DevBuf;
namespace ops = moesq::ops;

namespace {

// Attention outputs are bf16 hi + lo of Σ p·ĉ / Σ p: expf vs std::exp (≤ 2 ulp per probability) and
// the same fma chains otherwise — a few fp32 ulp, but hi + lo holds ≈ 16 significant bits, and one ulp
// can flip lo's rounding: up to 2^-16 of the value. Relative to the output's scale.
constexpr double kMlaAttnRelTol = 3e-5;

std::vector<float> rand_f32(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
std::vector<uint16_t> rand_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  const std::vector<float> f = rand_f32(n, seed);
  for (size_t i = 0; i < n; ++i) v[i] = moesq::f32_to_bf16(f[i]);
  return v;
}
std::vector<float> tables(int64_t max_len, int rope, bool sin) {
  std::vector<float> t(max_len * (rope / 2));
  for (int64_t p = 0; p < max_len; ++p)
    for (int i = 0; i < rope / 2; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / rope);
      t[p * (rope / 2) + i] = static_cast<float>(sin ? std::sin(a) : std::cos(a)) * 1.1f;
    }
  return t;
}

struct Shape {
  int nh, r_q, r_kv, rope, nope, v;
  bool interleave;
};
// Kimi-K2.5's MLA (64 heads, r_q 1536, r_kv 512, rope 64, nope 128, v 128), the tiny fixture's, and a
// no-q-LoRA one with an odd head count (heads beyond nh in the last CTA).
const Shape kShapes[] = {{64, 1536, 512, 64, 128, 128, true}, {4, 64, 32, 16, 32, 32, true}, {13, 0, 64, 32, 16, 16, false}};

}  // namespace

TEST(MlaOps, PrepAndQMatchTheirTwinsBitwise) {
  for (const Shape& s : kShapes) {
    const int64_t T = 37, max_len = 200, D = s.r_kv + s.rope, dqk = s.nope + s.rope;
    const int64_t q_cols = s.r_q > 0 ? s.r_q : s.nh * dqk, lda = q_cols + D + 8;
    const std::vector<float> a = rand_f32(T * lda, 1), qn = rand_f32(std::max(s.r_q, 1), 2), kn = rand_f32(s.r_kv, 3);
    const std::vector<float> cs = tables(max_len, s.rope, false), sn = tables(max_len, s.rope, true);
    std::vector<int32_t> slot(T), pos(T);
    for (int64_t t = 0; t < T; ++t) slot[t] = static_cast<int32_t>(t % 3), pos[t] = static_cast<int32_t>((t * 7) % max_len);
    DevBuf<float> da, dqn, dkn, dcs, dsn;
    DevBuf<int32_t> dslot, dpos;
    da.upload(a), dqn.upload(qn), dkn.upload(kn), dcs.upload(cs), dsn.upload(sn), dslot.upload(slot), dpos.upload(pos);
    DevBuf<uint16_t> dqa, dqa_lo, dcache;
    dqa.alloc(T * std::max(s.r_q, 1)), dqa_lo.alloc(T * std::max(s.r_q, 1)), dcache.alloc(3 * max_len * D);
    dcache.upload(std::vector<uint16_t>(3 * max_len * D, 0));
    ops::MlaPrepArgs p;
    p.lda = lda, p.q_cols = q_cols, p.r_q = s.r_q, p.r_kv = s.r_kv, p.rope = s.rope, p.rope_interleave = s.interleave;
    p.kv.max_len = max_len, p.T = T;
    ops::MlaPrepArgs pd = p;
    pd.a = da.p, pd.q_a_norm = dqn.p, pd.qa_out = dqa.p, pd.qa_out_lo = dqa_lo.p, pd.kv_a_norm = dkn.p;
    pd.cos = dcs.p, pd.sin = dsn.p, pd.tok_slot = dslot.p, pd.tok_pos = dpos.p, pd.kv.cache = dcache.p;
    ops::mla_prep(pd, nullptr);
    std::vector<uint16_t> qa(T * std::max(s.r_q, 1)), qa_lo(qa.size()), cache(3 * max_len * D, 0);
    ops::MlaPrepArgs ph = p;
    ph.a = a.data(), ph.q_a_norm = qn.data(), ph.qa_out = qa.data(), ph.qa_out_lo = qa_lo.data(), ph.kv_a_norm = kn.data();
    ph.cos = cs.data(), ph.sin = sn.data(), ph.tok_slot = slot.data(), ph.tok_pos = pos.data(), ph.kv.cache = cache.data();
    ops::mla_prep_ref(ph);
    EXPECT_TRUE(dcache.download() == cache) << "mla_prep cache, nh " << s.nh;
    if (s.r_q > 0) {
      EXPECT_TRUE(dqa.download() == qa) << "mla_prep q_a hi";
      EXPECT_TRUE(dqa_lo.download() == qa_lo) << "mla_prep q_a lo";
    }
    // mla_q on q rows with a row stride (the q_b GEMM's output, or the fused GEMM's q columns).
    const int64_t ldq = s.nh * dqk + 8;
    const std::vector<float> qrows = rand_f32(T * ldq, 8);
    DevBuf<float> dqrows;
    dqrows.upload(qrows);
    ops::MlaQArgs q;
    q.ldq = ldq, q.nh = s.nh, q.nope = s.nope, q.rope = s.rope, q.r_kv = s.r_kv, q.rope_interleave = s.interleave;
    q.max_len = max_len, q.T = T;
    DevBuf<uint16_t> dn, dn_lo;
    DevBuf<float> datt;
    dn.alloc(s.nh * T * s.nope), dn_lo.alloc(s.nh * T * s.nope);
    datt.upload(std::vector<float>(s.nh * T * D, 0.0f));
    ops::MlaQArgs qd = q;
    qd.q = dqrows.p, qd.q_nope = dn.p, qd.q_nope_lo = dn_lo.p, qd.q_att = datt.p, qd.cos = dcs.p, qd.sin = dsn.p;
    qd.tok_pos = dpos.p;
    ops::mla_q(qd, nullptr);
    std::vector<uint16_t> n(s.nh * T * s.nope), n_lo(n.size());
    std::vector<float> att(s.nh * T * D, 0.0f);
    ops::MlaQArgs qh = q;
    qh.q = qrows.data(), qh.q_nope = n.data(), qh.q_nope_lo = n_lo.data(), qh.q_att = att.data(), qh.cos = cs.data();
    qh.sin = sn.data(), qh.tok_pos = pos.data();
    ops::mla_q_ref(qh);
    EXPECT_TRUE(dn.download() == n && dn_lo.download() == n_lo) << "mla_q q_nope, nh " << s.nh;
    const std::vector<float> gatt = datt.download();
    EXPECT_EQ(std::memcmp(gatt.data(), att.data(), att.size() * sizeof(float)), 0) << "mla_q q_pe, nh " << s.nh;
  }
}

TEST(MlaOps, HeadsToRowsMatchesTwinBitwise) {
  const int nh = 5, v = 24;
  const int64_t T = 9;
  const std::vector<float> x = rand_f32(nh * T * v, 4);
  DevBuf<float> dx;
  dx.upload(x);
  DevBuf<uint16_t> dy, dy_lo;
  dy.alloc(T * nh * v), dy_lo.alloc(T * nh * v);
  ops::MlaHeadsToRowsArgs a;
  a.nh = nh, a.v = v, a.T = T;
  ops::MlaHeadsToRowsArgs ad = a;
  ad.x = dx.p, ad.y = dy.p, ad.y_lo = dy_lo.p;
  ops::mla_heads_to_rows(ad, nullptr);
  std::vector<uint16_t> y(T * nh * v), y_lo(y.size());
  ops::MlaHeadsToRowsArgs ah = a;
  ah.x = x.data(), ah.y = y.data(), ah.y_lo = y_lo.data();
  ops::mla_heads_to_rows_ref(ah);
  EXPECT_TRUE(dy.download() == y && dy_lo.download() == y_lo);
}

// Attention vs the twin on a paged cache of 3 slots, then each token's bits alone equal to its bits in
// the mixed call (positions in 1–13 key ranges, slots in any order).
TEST(MlaOps, AttentionMatchesTwinAndIsBatchInvariant) {
  for (const Shape& s : kShapes) {
    // Twelve 256-key ranges (the split unit) and a partial thirteenth: positions at range edges and inside.
    const int64_t max_len = 3200, D = s.r_kv + s.rope, bps = ops::kv_blocks_per_slot(max_len), blocks = 3 * bps;
    const std::vector<uint16_t> cache = rand_bf16(blocks * ops::kKvBlockTokens * D, 5);
    std::vector<int32_t> table(3 * bps);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937_64(6));
    const std::vector<int32_t> slot = {2, 0, 1, 0, 2, 1, 1}, pos = {0, 63, 1024, 2200, 3199, 1023, 17};
    const int64_t T = static_cast<int64_t>(slot.size());
    const std::vector<float> q = rand_f32(s.nh * T * D, 7, 0.1f);
    DevBuf<uint16_t> dcache, dout, dout_lo;
    DevBuf<int32_t> dtable, dslot, dpos;
    DevBuf<float> dq;
    dcache.upload(cache), dtable.upload(table), dslot.upload(slot), dpos.upload(pos), dq.upload(q);
    dout.alloc(s.nh * T * s.r_kv), dout_lo.alloc(s.nh * T * s.r_kv);
    ops::MlaAttentionArgs a;
    a.nh = s.nh, a.r_kv = s.r_kv, a.rope = s.rope, a.scale = 0.3f, a.T = T;
    a.kv.max_len = max_len, a.kv.kv_blocks = blocks;
    ops::MlaAttentionArgs ad = a;
    ad.q = dq.p, ad.kv.cache = dcache.p, ad.kv.block_table = dtable.p, ad.tok_slot = dslot.p, ad.tok_pos = dpos.p;
    ad.out = dout.p, ad.out_lo = dout_lo.p;
    ops::mla_attention(ad, nullptr);
    const std::vector<uint16_t> g = dout.download(), g_lo = dout_lo.download();
    std::vector<uint16_t> w(g.size()), w_lo(g.size());
    std::vector<uint16_t> hcache = cache;
    ops::MlaAttentionArgs ah = a;
    ah.q = q.data(), ah.kv.cache = hcache.data(), ah.kv.block_table = table.data(), ah.tok_slot = slot.data();
    ah.tok_pos = pos.data(), ah.out = w.data(), ah.out_lo = w_lo.data();
    ops::mla_attention_ref(ah);
    double err = 0, scale = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double gv = double(moesq::bf16_to_f32(g[i])) + moesq::bf16_to_f32(g_lo[i]);
      const double wv = double(moesq::bf16_to_f32(w[i])) + moesq::bf16_to_f32(w_lo[i]);
      err = std::max(err, std::fabs(gv - wv)), scale = std::max(scale, std::fabs(wv));
    }
    EXPECT_LT(err / scale, kMlaAttnRelTol) << "nh " << s.nh << " r_kv " << s.r_kv << ": max error " << err;
    // The split-KV path (partials per chunk, then the combine kernel) gives the sequential path's bits.
    {
      DevBuf<float> dpart;
      DevBuf<uint16_t> ds, ds_lo;
      dpart.alloc(ops::mla_attention_partial_floats(T, s.nh, s.r_kv, ops::mla_attention_ranges(max_len)));
      ds.alloc(g.size()), ds_lo.alloc(g.size());
      ops::MlaAttentionArgs as = ad;
      as.partial = dpart.p, as.partial_ranges = ops::mla_attention_ranges(max_len), as.out = ds.p, as.out_lo = ds_lo.p;
      ops::mla_attention(as, nullptr);
      EXPECT_TRUE(ds.download() == g && ds_lo.download() == g_lo) << "split-KV differs from sequential, nh " << s.nh;
    }
    // Each token alone (T = 1, its own query rows) gives the bits it had in the mixed call.
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> q1(s.nh * D);
      for (int h = 0; h < s.nh; ++h)
        std::copy_n(&q[(h * T + t) * D], D, &q1[h * D]);
      DevBuf<float> dq1;
      DevBuf<int32_t> ds1, dp1;
      DevBuf<uint16_t> do1;
      dq1.upload(q1), ds1.upload(std::vector<int32_t>{slot[t]}), dp1.upload(std::vector<int32_t>{pos[t]});
      do1.alloc(s.nh * s.r_kv);
      ops::MlaAttentionArgs a1 = ad;
      a1.q = dq1.p, a1.tok_slot = ds1.p, a1.tok_pos = dp1.p, a1.out = do1.p, a1.out_lo = nullptr, a1.T = 1;
      ops::mla_attention(a1, nullptr);
      const std::vector<uint16_t> o1 = do1.download();
      for (int h = 0; h < s.nh; ++h)
        ASSERT_TRUE(std::equal(o1.begin() + h * s.r_kv, o1.begin() + (h + 1) * s.r_kv, g.begin() + (h * T + t) * s.r_kv))
            << "token " << t << " head " << h << " alone differs from the mixed call";
    }
  }
}

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
