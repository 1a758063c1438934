// CPU tests of the MLA ops' twins (src/ops/mla/mla.h): mla_attention_ref against softmax attention over
// the latent rows computed directly in fp64, and the argument checks the launchers share. The GPU
// kernels are compared with these twins in tests/gpu/test_mla_ops.cu; the whole block's twin with the
// CPU model in tests/runtime/test_mla_block.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/mla/mla.h"

using namespace moesq;

namespace {

std::vector<float> random_rows(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace

// mla_attention's twin (64-key chunks merged into 256-key ranges, ranges merged in order) is the
// softmax attention over the latent rows, computed directly in fp64, for positions in 1, 6 and 10 ranges.
TEST(MlaOpsRef, AttentionTwinIsSoftmaxAttentionOverTheLatentRows) {
  constexpr double kRelTol = 2e-5;  // fp32 chunk sums and merges, bf16 hi + lo output (≈ 2^-16)
  const int nh = 3, r_kv = 32, rope = 16, D = r_kv + rope;
  const int64_t max_len = 2500;
  const std::vector<int32_t> slot = {0, 0, 0}, pos = {5, 1500, 2499};
  const int64_t T = 3;
  const std::vector<float> qf = random_rows(nh * T * D, 1), cf = random_rows(max_len * D, 2);
  std::vector<float> q(qf.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.2f * qf[i];
  std::vector<uint16_t> cache(cf.size()), out(nh * T * r_kv), out_lo(out.size());
  for (size_t i = 0; i < cf.size(); ++i) cache[i] = f32_to_bf16(cf[i]);
  ops::MlaAttentionArgs a;
  a.q = q.data(), a.kv.cache = cache.data(), a.kv.max_len = max_len, a.tok_slot = slot.data(), a.tok_pos = pos.data();
  a.out = out.data(), a.out_lo = out_lo.data(), a.nh = nh, a.r_kv = r_kv, a.rope = rope, a.scale = 0.5f, a.T = T;
  ops::mla_attention_ref(a);
  double err = 0, scale = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h) {
      const float* qh = &q[(h * T + t) * D];
      std::vector<double> sc(pos[t] + 1);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= pos[t]; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(qh[d]) * bf16_to_f32(cache[j * D + d]);
        sc[j] = dot * 0.5;
        mx = std::max(mx, sc[j]);
      }
      for (double& v : sc) sum += (v = std::exp(v - mx));
      for (int d = 0; d < r_kv; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= pos[t]; ++j) o += sc[j] * bf16_to_f32(cache[j * D + d]);
        o /= sum;
        const size_t i = (h * T + t) * r_kv + d;
        const double got = double(bf16_to_f32(out[i])) + bf16_to_f32(out_lo[i]);
        err = std::max(err, std::fabs(got - o)), scale = std::max(scale, std::fabs(o));
      }
    }
  EXPECT_LT(err / scale, kRelTol) << "max error " << err << " of scale " << scale;
}

TEST(MlaOpsRef, ChecksNameWhatIsNotBuilt) {
  // The ops name the dims they are not built for.
  ops::MlaAttentionArgs a;
  a.nh = 4, a.r_kv = 40, a.rope = 16;
  try {
    ops::mla_attention_check(a);
    ADD_FAILURE() << "accepted r_kv 40";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_lora_rank 40"), std::string::npos) << e.what();
  }
  // A split-KV workspace with fewer key ranges than max_len's is refused before any launch.
  std::vector<float> q(1), part(1);
  std::vector<uint16_t> cache(1), out(1);
  std::vector<int32_t> tok(1);
  a.r_kv = 32, a.q = q.data(), a.out = out.data(), a.kv.cache = cache.data(), a.kv.max_len = 2049;
  a.tok_slot = tok.data(), a.tok_pos = tok.data(), a.partial = part.data(), a.partial_ranges = 8;
  EXPECT_EQ(ops::mla_attention_ranges(2049), 9);  // 256-key ranges
  EXPECT_EQ(ops::mla_attention_ranges(2048), 8);
  try {
    ops::mla_attention_check(a);
    ADD_FAILURE() << "accepted 8 key ranges for max_len 2049";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("partial_ranges 8 < the 9 key ranges"), std::string::npos) << e.what();
  }
  ops::MlaQArgs q_args;
  q_args.nh = 2, q_args.nope = 12, q_args.rope = 16, q_args.r_kv = 32, q_args.ldq = 56;
  try {
    ops::mla_q_check(q_args);
    ADD_FAILURE() << "accepted qk_nope_head_dim 12";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qk_nope_head_dim 12"), std::string::npos) << e.what();
  }
  ops::MlaPrepArgs p;
  p.r_kv = 32, p.rope = 66;
  try {
    ops::mla_prep_check(p);
    ADD_FAILURE() << "accepted qk_rope_head_dim 66";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qk_rope_head_dim 66"), std::string::npos) << e.what();
  }
}
