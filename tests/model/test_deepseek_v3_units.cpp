// DeepSeek-V3 family parts on synthetic inputs: config parsing and its errors, RoPE (default and
// YaRN), multi-head latent attention (fast path vs `_ref` twin on fresh random inputs, plus a property
// that pins the interleaved-RoPE convention independently of either twin), and the framework's
// router on DeepSeek-V3 semantics against an independent transcription of transformers' routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <numeric>
#include <tuple>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/splitmix64.h"
#include "io/config.h"
#include "io/config_deepseek_v3.h"
#include "model/mixers/causal_attention.h"
#include "model/mixers/mla.h"
#include "model/rope.h"
#include "model/router.h"
#include "model/tensor_math.h"

namespace {

using namespace moesq;
using nlohmann::json;

// Fast path vs plain twin, same fp32 inputs: only summation order differs (sgemm blocking vs
// index order over K ≤ 256 products of O(1) values), a few ulps per element.
constexpr double kTwinAtol = 2e-5;
constexpr double kTwinRtol = 1e-5;
constexpr double kTwinRelFrob = 1e-6;

std::vector<float> random_vec(int64_t n, uint64_t seed, float scale = 1.0f) {
  SplitMix64 g(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * (2.0f * g.uniform() - 1.0f);
  return v;
}

// Fills every weight in place with uniform values in ±scale (norm weights around 1).
void randomize(std::vector<float>& v, uint64_t seed, float scale, float offset = 0.0f) {
  const auto r = random_vec(static_cast<int64_t>(v.size()), seed, scale);
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + r[i];
}

struct Compare {
  double max_err = 0, ref_absmax = 0, num = 0, den = 0;
  int64_t bad = -1;
  void add(const std::vector<float>& a, const std::vector<float>& ref) {
    ASSERT_EQ(a.size(), ref.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = std::fabs(static_cast<double>(a[i]) - ref[i]);
      if (!(d <= kTwinAtol + kTwinRtol * std::fabs(ref[i])) && bad < 0) bad = static_cast<int64_t>(i);
      max_err = std::max(max_err, std::isnan(d) ? INFINITY : d);
      ref_absmax = std::max(ref_absmax, std::fabs(static_cast<double>(ref[i])));
      num += d * d;
      den += static_cast<double>(ref[i]) * ref[i];
    }
  }
  void expect(const std::string& what) const {
    EXPECT_LT(bad, 0) << what << ": first element outside atol + rtol·|ref| at flat index " << bad << " (max abs err "
                      << max_err << ")";
    EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), kTwinRelFrob) << what;
    EXPECT_GT(ref_absmax, 1e-3) << what << ": reference output is (nearly) all zero";
  }
};

json fixture_config() {
  std::ifstream in(std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3/config.json");
  return json::parse(in);
}

// ---- config ---------------------------------------------------------------------------------

TEST(DeepseekV3Config, ParsesTheFixture) {
  const auto s = io::parse_deepseek_v3_config(fixture_config(), "config.json");
  EXPECT_EQ(s.model_type, "deepseek_v3");
  EXPECT_EQ(s.hidden_size, 128);
  EXPECT_EQ(s.q_lora_rank, 64);
  EXPECT_EQ(s.kv_lora_rank, 32);
  EXPECT_EQ(s.qk_head_dim(), 48);
  EXPECT_EQ(s.v_head_dim, 32);
  EXPECT_EQ(s.n_routed_experts, 16);
  EXPECT_EQ(s.n_shared_experts, 1);
  EXPECT_EQ(s.n_group, 4);
  EXPECT_EQ(s.topk_group, 2);
  EXPECT_EQ(s.first_k_dense_replace, 1);
  EXPECT_DOUBLE_EQ(s.routed_scaling_factor, 2.5);
  EXPECT_TRUE(s.rope_interleave);
  EXPECT_EQ(s.rope.type, "default");
  EXPECT_DOUBLE_EQ(s.softmax_scale(), 1.0 / std::sqrt(48.0));
  EXPECT_FALSE(s.is_moe_layer(0));
  EXPECT_TRUE(s.is_moe_layer(1));
  // The common view, through io::parse_config (what io::Checkpoint reads).
  const io::ModelSpec m = io::parse_config(fixture_config(), "config.json");
  EXPECT_EQ(m.num_experts, 16);
  EXPECT_EQ(m.first_k_dense_replace, 1);
  EXPECT_EQ(m.router_scoring, io::RouterScoring::Sigmoid);
  EXPECT_TRUE(m.router_correction_bias);
  EXPECT_EQ(m.n_group, 4);
  EXPECT_EQ(m.topk_group, 2);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 2.5);
  EXPECT_EQ(m.num_shared_experts, 1);
  EXPECT_EQ(m.shared_expert_intermediate_size, 64);
  EXPECT_FALSE(m.shared_expert_gate);
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_TRUE(m.is_moe_layer(2));
}

void expect_error(const json& j, const std::string& needle) {
  try {
    io::parse_deepseek_v3_config(j, "cfg.json");
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
  }
}

TEST(DeepseekV3Config, ErrorsNameTheKey) {
  for (const char* key : {"kv_lora_rank", "qk_rope_head_dim", "n_routed_experts", "n_group", "topk_group",
                          "routed_scaling_factor", "first_k_dense_replace", "q_lora_rank"}) {
    json j = fixture_config();
    j.erase(key);
    expect_error(j, key);
  }
  json j = fixture_config();
  j["n_group"] = 3;  // 16 experts are not 3 groups
  expect_error(j, "n_group");
  j = fixture_config();
  j["topk_group"] = 5;
  expect_error(j, "topk_group");
  j = fixture_config();
  j["scoring_func"] = "softmax";
  expect_error(j, "scoring_func");
  j = fixture_config();
  j["moe_layer_freq"] = 2;
  expect_error(j, "moe_layer_freq");
  j = fixture_config();
  j["num_key_value_heads"] = 2;
  expect_error(j, "num_key_value_heads");
  j = fixture_config();
  j["head_dim"] = 48;
  expect_error(j, "head_dim");
  j = fixture_config();
  j["rope_parameters"]["rope_type"] = "llama3";
  expect_error(j, "llama3");
  j = fixture_config();
  j["num_experts_per_tok"] = 9;  // 2 kept groups × 4 experts
  expect_error(j, "num_experts_per_tok");
}

TEST(DeepseekV3Config, NullQLoraRankMeansPlainQProj) {
  json j = fixture_config();
  j["q_lora_rank"] = nullptr;
  EXPECT_EQ(io::parse_deepseek_v3_config(j, "c").q_lora_rank, 0);
}

// DeepSeek-V3's hub rope_scaling: YaRN factor 40, mscale = mscale_all_dim = 1, original 4096.
json deepseek_yarn() {
  json j = fixture_config();
  j.erase("rope_parameters");
  j["rope_theta"] = 10000.0;
  j["max_position_embeddings"] = 163840;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 40}, {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0},
                       {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}};
  return j;
}

TEST(DeepseekV3Config, YarnSoftmaxScaleUsesMscaleAllDim) {
  const auto s = io::parse_deepseek_v3_config(deepseek_yarn(), "c");
  EXPECT_EQ(s.rope.type, "yarn");
  EXPECT_EQ(s.rope.original_max_position_embeddings, 4096);
  const double m = 0.1 * std::log(40.0) + 1.0;  // yarn_get_mscale(40, 1) = 1.36889
  EXPECT_NEAR(s.softmax_scale(), m * m / std::sqrt(48.0), 1e-12);
  EXPECT_NEAR(s.softmax_scale() * std::sqrt(48.0), 1.873854, 1e-6);  // (1 + 0.1·ln 40)²
}

// A Kimi-K2-shaped config (model_type kimi_k2, hub key spellings: rope_theta + rope_scaling, no
// head_dim, ungrouped routing n_group = topk_group = 1, YaRN factor 32 with beta_fast 1).
TEST(DeepseekV3Config, KimiK2StyleConfig) {
  const json j = {{"model_type", "kimi_k2"}, {"vocab_size", 163840}, {"hidden_size", 7168},
                  {"intermediate_size", 18432}, {"moe_intermediate_size", 2048}, {"num_hidden_layers", 61},
                  {"num_attention_heads", 64}, {"num_key_value_heads", 64}, {"q_lora_rank", 1536},
                  {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
                  {"n_routed_experts", 384}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8}, {"n_group", 1},
                  {"topk_group", 1}, {"routed_scaling_factor", 2.827}, {"first_k_dense_replace", 1},
                  {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}, {"moe_layer_freq", 1},
                  {"rope_theta", 50000.0}, {"max_position_embeddings", 131072},
                  {"rope_scaling", {{"type", "yarn"}, {"factor", 32.0}, {"beta_fast", 1.0}, {"beta_slow", 1.0},
                                    {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                                    {"original_max_position_embeddings", 4096}}}};
  const auto s = io::parse_deepseek_v3_config(j, "kimi.json");
  EXPECT_EQ(s.model_type, "kimi_k2");
  EXPECT_EQ(s.qk_head_dim(), 192);
  EXPECT_EQ(s.n_routed_experts, 384);
  EXPECT_TRUE(s.rope_interleave);  // transformers' default when the key is absent
  EXPECT_EQ(s.rope.type, "yarn");
  EXPECT_EQ(s.rope.beta_fast, 1.0);
  const double m = 0.1 * std::log(32.0) + 1.0;
  EXPECT_NEAR(s.softmax_scale(), m * m / std::sqrt(192.0), 1e-12);
  const io::ModelSpec ms = io::parse_config(j, "kimi.json");
  EXPECT_EQ(ms.num_experts, 384);
  EXPECT_EQ(ms.head_dim, 192);
  // YaRN tables over the 64 rope dims: finite, attention_factor 1 (mscale == mscale_all_dim).
  const auto f = model::rope_frequencies(s.rope, 64, s.max_position_embeddings);
  EXPECT_EQ(f.attention_factor, 1.0f);
  for (float v : f.inv_freq) EXPECT_TRUE(std::isfinite(v) && v > 0);
}

// ---- RoPE -----------------------------------------------------------------------------------

TEST(DeepseekV3Rope, DefaultMatchesTheQwenTables) {
  io::RopeSpec r;
  r.theta = 10000.0;
  const auto f = model::rope_frequencies(r, 16, 512);
  std::vector<float> c1, s1, c2, s2;
  model::rope_tables(70, f, c1, s1);
  model::rope_tables(70, 16, 10000.0, c2, s2);  // default RoPE, checked against transformers by Qwen3 parity
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(f.attention_factor, 1.0f);
}

TEST(DeepseekV3Rope, YarnBlendsExtrapolationAndInterpolation) {
  const auto s = io::parse_deepseek_v3_config(deepseek_yarn(), "c");
  const int64_t dim = 64;
  const auto f = model::rope_frequencies(s.rope, dim, s.max_position_embeddings);
  io::RopeSpec plain;
  plain.theta = s.rope.theta;
  const auto base = model::rope_frequencies(plain, dim, 0);
  // Correction range (YaRN Eq. 17) for beta 32 / 1, dim 64, θ 1e4, 4096 positions, truncated:
  // low = floor(10.2) = 10, high = ceil(22.9) = 23 (computed by hand from the formula).
  const double low = std::floor(64 * std::log(4096 / (32 * 2 * std::numbers::pi)) / (2 * std::log(1e4)));
  const double high = std::ceil(64 * std::log(4096 / (1 * 2 * std::numbers::pi)) / (2 * std::log(1e4)));
  ASSERT_EQ(low, 10);
  ASSERT_EQ(high, 23);
  for (int64_t i = 0; i < dim / 2; ++i) {
    if (i <= low) EXPECT_FLOAT_EQ(f.inv_freq[i], base.inv_freq[i]) << i;  // high frequency: kept
    if (i >= high) EXPECT_FLOAT_EQ(f.inv_freq[i], base.inv_freq[i] / 40.0f) << i;  // low: interpolated
    if (i > low && i < high) {
      EXPECT_LT(f.inv_freq[i], base.inv_freq[i]) << i;
      EXPECT_GT(f.inv_freq[i], base.inv_freq[i] / 40.0f) << i;
    }
  }
  // mscale == mscale_all_dim: the cos/sin factor is exactly 1.
  EXPECT_EQ(f.attention_factor, 1.0f);
  io::RopeSpec r2 = s.rope;
  r2.mscale = 0;  // no mscale pair: attention_factor = 0.1·ln(factor) + 1
  EXPECT_NEAR(model::rope_frequencies(r2, dim, s.max_position_embeddings).attention_factor, 0.1 * std::log(40.0) + 1,
              1e-6);
}

// ---- causal attention + MLA -----------------------------------------------------------------

TEST(DeepseekV3Mla, CausalAttentionFastMatchesRef) {
  for (int64_t T : {1, 2, 3, 63, 64, 65, 130}) {
    model::CausalAttentionDesc d;
    d.T = T;
    d.num_heads = 3;
    d.d_qk = 24;
    d.d_v = 16;
    d.q_stride = d.k_stride = 3 * 24 + 5;  // padded rows: strides are honoured
    d.v_stride = 3 * 16;
    d.out_stride = 3 * 16;
    d.scale = 0.2f;
    const auto q = random_vec(T * d.q_stride, 11 + T), k = random_vec(T * d.k_stride, 12 + T),
               v = random_vec(T * d.v_stride, 13 + T);
    std::vector<float> a(T * d.out_stride), b(T * d.out_stride);
    model::causal_attention(d, q.data(), k.data(), v.data(), a.data());
    model::causal_attention_ref(d, q.data(), k.data(), v.data(), b.data());
    Compare c;
    c.add(a, b);
    c.expect("causal attention T=" + std::to_string(T));
    // Row 0 attends to key 0 only: its output is exactly v[0] (softmax of one entry is 1).
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(b[h * 16 + i], v[h * 16 + i]);
  }
}

model::MlaDims small_dims(int64_t q_lora) {
  model::MlaDims d;
  d.hidden = 40;
  d.num_heads = 3;
  d.q_lora_rank = q_lora;
  d.kv_lora_rank = 12;
  d.qk_nope_head_dim = 8;
  d.qk_rope_head_dim = 6;
  d.v_head_dim = 10;
  d.softmax_scale = 1.0f / std::sqrt(14.0f);
  return d;
}

model::MlaWeights random_mla(const model::MlaDims& d, bool bias, uint64_t seed) {
  model::MlaWeights w = model::mla_zero_weights(d, bias);
  uint64_t s = seed;
  for (auto* v : {&w.q_proj, &w.q_a_proj, &w.q_b_proj, &w.kv_a_proj, &w.kv_b_proj, &w.o_proj, &w.q_a_bias,
                  &w.kv_a_bias, &w.o_bias})
    randomize(*v, ++s, 0.3f);
  randomize(w.q_a_norm, ++s, 0.2f, 1.0f);
  randomize(w.kv_a_norm, ++s, 0.2f, 1.0f);
  return w;
}

model::RopeTables tables(int64_t T, int64_t dim) {
  io::RopeSpec r;
  r.theta = 100.0;  // fast rotation: positions matter within a short sequence
  model::RopeTables t;
  model::rope_tables(T, model::rope_frequencies(r, dim, 0), t.cos, t.sin);
  return t;
}

TEST(DeepseekV3Mla, FastMatchesRef) {
  for (int64_t q_lora : {0, 16})
    for (bool bias : {false, true})
      for (bool interleave : {false, true})
        for (int64_t T : {1, 2, 3, 65}) {
          model::MlaDims d = small_dims(q_lora);
          d.rope_interleave = interleave;
          const auto w = random_mla(d, bias, 100 + q_lora + bias);
          const auto x = random_vec(T * d.hidden, 7 + T);
          const auto rope = tables(T, d.qk_rope_head_dim);
          std::vector<float> a(T * d.hidden), b(T * d.hidden);
          model::mla_forward(d, w, rope, x.data(), T, a.data(), 2);
          model::mla_forward_ref(d, w, rope, x.data(), T, b.data());
          Compare c;
          c.add(a, b);
          c.expect("MLA q_lora=" + std::to_string(q_lora) + " bias=" + std::to_string(bias) +
                   " interleave=" + std::to_string(interleave) + " T=" + std::to_string(T));
        }
}

// The latent-cache decode (absorbed form) against the naive full forward of the whole sequence:
// a prefill chunk, a 3-token chunk, then single tokens, each row vs the same row of mla_forward_ref.
// Same sums in another association order (W_UK folded into q, W_UV after the weighted latent sum).
TEST(DeepseekV3Mla, LatentCacheDecodeMatchesForward) {
  for (int64_t q_lora : {0, 16})
    for (bool bias : {false, true})
      for (bool interleave : {false, true}) {
        model::MlaDims d = small_dims(q_lora);
        d.rope_interleave = interleave;
        const int64_t T = 19, H = d.hidden;
        const auto w = random_mla(d, bias, 300 + q_lora + bias + 2 * interleave);
        const auto x = random_vec(T * H, 41 + q_lora);
        const auto rope = tables(T, d.qk_rope_head_dim);
        std::vector<float> full(T * H), dec(T * H);
        model::mla_forward_ref(d, w, rope, x.data(), T, full.data());
        model::MlaLatentCache cache = model::mla_latent_cache(d, T);
        // What the cache holds: r_kv + rope floats per position, not nh·(d_qk + d_v).
        EXPECT_EQ(cache.latent.size() + cache.k_pe.size(),
                  static_cast<size_t>(T * (d.kv_lora_rank + d.qk_rope_head_dim)));
        int64_t p = 0;
        for (int64_t chunk : {7, 3}) {
          model::mla_decode(d, w, rope, &x[p * H], chunk, cache, &dec[p * H]);
          p += chunk;
        }
        for (; p < T; ++p) model::mla_decode(d, w, rope, &x[p * H], 1, cache, &dec[p * H]);
        EXPECT_EQ(cache.len, T);
        Compare c;
        c.add(dec, full);
        c.expect("MLA decode q_lora=" + std::to_string(q_lora) + " bias=" + std::to_string(bias) +
                 " interleave=" + std::to_string(interleave));
        std::vector<float> extra(H);
        EXPECT_THROW(model::mla_decode(d, w, rope, x.data(), 1, cache, extra.data()), Error) << "past max_len";
      }
}

// Interleaved storage is only a layout: rope_interleave = true on weights whose rope output rows
// are in pair order equals rope_interleave = false on the same rows de-interleaved (q_b_proj rows of
// every head, kv_a_proj_with_mqa's k_pe rows). Pins the pairing convention independently of the twins.
TEST(DeepseekV3Mla, InterleavedRopeIsAPermutationOfWeightRows) {
  model::MlaDims d = small_dims(16);
  const int64_t T = 9, dqk = d.qk_head_dim(), rope_d = d.qk_rope_head_dim, nope = d.qk_nope_head_dim;
  const auto w = random_mla(d, false, 5);
  auto permute_rows = [&](std::vector<float> m, int64_t row0, int64_t cols) {
    std::vector<float> out = m;
    for (int64_t i = 0; i < rope_d / 2; ++i)
      for (int64_t c = 0; c < cols; ++c) {
        out[(row0 + i) * cols + c] = m[(row0 + 2 * i) * cols + c];
        out[(row0 + rope_d / 2 + i) * cols + c] = m[(row0 + 2 * i + 1) * cols + c];
      }
    return out;
  };
  model::MlaWeights wp = w;
  for (int64_t h = 0; h < d.num_heads; ++h) wp.q_b_proj = permute_rows(wp.q_b_proj, h * dqk + nope, d.q_lora_rank);
  wp.kv_a_proj = permute_rows(wp.kv_a_proj, d.kv_lora_rank, d.hidden);
  const auto x = random_vec(T * d.hidden, 77);
  const auto rope = tables(T, rope_d);
  std::vector<float> a(T * d.hidden), b(T * d.hidden);
  d.rope_interleave = true;
  model::mla_forward_ref(d, w, rope, x.data(), T, a.data());
  d.rope_interleave = false;
  model::mla_forward_ref(d, wp, rope, x.data(), T, b.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5) << i;
  // And the convention matters: the same weights without interleaving give a different answer.
  model::mla_forward_ref(d, w, rope, x.data(), T, b.data());
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
  EXPECT_GT(diff, 1e-3);
}

TEST(DeepseekV3Mla, WrongWeightShapeIsAnError) {
  model::MlaDims d = small_dims(16);
  auto w = random_mla(d, false, 1);
  w.kv_b_proj.pop_back();
  const auto x = random_vec(2 * d.hidden, 1);
  std::vector<float> out(2 * d.hidden);
  try {
    model::mla_forward(d, w, tables(2, d.qk_rope_head_dim), x.data(), 2, out.data());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_b_proj"), std::string::npos) << e.what();
  }
}

// ---- router (model/router.h, the framework's) on DeepSeek-V3 semantics -----------------------
// An independent transcription of transformers' DeepseekV3 route_tokens_to_experts: full sorts and
// an explicit score mask (dropped groups → 0.0, as transformers' masked_fill), checked against the
// framework's select_routes on random logits and negative biases.
struct OracleRoutes {
  std::vector<int32_t> expert;  // [n, k] sorted ascending per row (a set: torch.topk is unsorted)
  std::vector<float> weight;    // [n, k] in the same order
};
OracleRoutes transformers_deepseek_routes(const model::RouterSpec& p, const std::vector<float>& logits, int64_t n,
                                          const std::vector<float>& bias) {
  const int64_t E = p.num_experts, G = p.n_group, per = E / G, K = p.top_k;
  OracleRoutes r;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> s(E), choice(E);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-logits[t * E + e]));
      choice[e] = s[e] + bias[e];
    }
    std::vector<std::pair<float, int64_t>> gs;  // (top-2 sum, group)
    for (int64_t g = 0; g < G; ++g) {
      std::vector<float> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(v.begin(), v.end(), std::greater<float>());
      gs.emplace_back(v[0] + v[1], g);
    }
    std::stable_sort(gs.begin(), gs.end(), [](const auto& a, const auto& c) { return a.first > c.first; });
    std::vector<std::pair<float, int32_t>> masked;  // (masked choice score, expert)
    for (int32_t e = 0; e < E; ++e) {
      bool kept = false;
      for (int64_t j = 0; j < p.topk_group; ++j) kept |= gs[j].second == e / per;
      masked.emplace_back(kept ? choice[e] : 0.0f, e);
    }
    std::stable_sort(masked.begin(), masked.end(), [](const auto& a, const auto& c) { return a.first > c.first; });
    std::vector<int32_t> ids;
    for (int64_t j = 0; j < K; ++j) ids.push_back(masked[j].second);
    std::sort(ids.begin(), ids.end());
    float sum = 0.0f;
    for (int32_t e : ids) sum += s[e];
    for (int32_t e : ids) {
      r.expert.push_back(e);
      const float w = p.norm_topk_prob ? s[e] / (sum + 1e-20f) : s[e];
      r.weight.push_back(w * static_cast<float>(p.routed_scaling_factor));
    }
  }
  return r;
}

model::RouterSpec deepseek_router(int64_t G, int64_t kg, int64_t k, bool norm) {
  model::RouterSpec p;
  p.num_experts = 16;
  p.top_k = k;
  p.scoring = io::RouterScoring::Sigmoid;
  p.correction_bias = true;
  p.n_group = G;
  p.topk_group = kg;
  p.norm_topk_prob = norm;
  p.routed_scaling_factor = 2.5;
  return p;
}

TEST(DeepseekV3Router, SelectRoutesMatchesTheTransformersTranscription) {
  for (bool norm : {true, false})
    for (auto [G, kg, k] : {std::tuple{4, 2, 4}, std::tuple{1, 1, 6}, std::tuple{8, 3, 5}, std::tuple{2, 2, 16}}) {
      const model::RouterSpec p = deepseek_router(G, kg, k, norm);
      const int64_t n = 300;
      const auto z = random_vec(n * 16, 31 + G + k, 4.0f);
      const auto bias = random_vec(16, 41, 0.6f);  // biased scores are negative for some experts
      const model::Routes r = model::select_routes(p, z, n, bias.data());
      const OracleRoutes o = transformers_deepseek_routes(p, z, n, bias);
      int64_t mismatched = 0;
      for (int64_t t = 0; t < n; ++t) {
        std::vector<std::pair<int32_t, float>> mine;
        for (int64_t j = 0; j < k; ++j) mine.emplace_back(r.expert[t * k + j], r.weight[t * k + j]);
        std::sort(mine.begin(), mine.end());
        for (int64_t j = 0; j < k; ++j) {
          mismatched += mine[j].first != o.expert[t * k + j];
          EXPECT_NEAR(mine[j].second, o.weight[t * k + j], 1e-6) << "row " << t;
        }
      }
      EXPECT_EQ(mismatched, 0) << "G=" << G << " topk_group=" << kg << " k=" << k;
      if (norm) {
        double wsum = 0;
        for (int64_t j = 0; j < k; ++j) wsum += r.weight[j];
        EXPECT_NEAR(wsum, 2.5, 1e-5);  // renormalized, then × routed_scaling_factor
      }
    }
}

// Hand-made rows with exact expected ids and weights (binary fractions): the group gate, the bias
// used for the choice only, and transformers' 0.0 mask for dropped groups.
TEST(DeepseekV3Router, GroupsGateTheChoiceAndBiasOnlySelects) {
  model::RouterSpec p = deepseek_router(4, 1, 2, false);
  p.routed_scaling_factor = 1.0;
  // sigmoid(0) = 0.5 everywhere; the bias decides. Group 0 holds the single best expert (bias 0.5),
  // group 2 the best pair (0.375 + 0.375).
  std::vector<float> z(16, 0.0f), bias(16, 0.0f);
  bias[1] = 0.5f;
  bias[9] = 0.375f;
  bias[10] = 0.375f;
  const auto r = model::select_routes(p, z, 1, bias.data());
  EXPECT_EQ(r.expert, (std::vector<int32_t>{9, 10}));     // expert 1 scores best but its group loses
  EXPECT_EQ(r.weight, (std::vector<float>{0.5f, 0.5f}));  // weights from sigmoid, not sigmoid + bias
  // Negative biased scores: experts 4, 5 → 0.125, all others → −0.25, so group 1 is kept. The third
  // expert then comes from a DROPPED group (masked to 0.0 > −0.25): transformers' behaviour, which
  // DeepSeek's reference code (−inf mask) does not share — it would pick expert 6 or 7.
  std::fill(bias.begin(), bias.end(), -0.75f);
  bias[4] = bias[5] = -0.375f;
  p.top_k = 3;
  const auto r3 = model::select_routes(p, z, 1, bias.data());
  EXPECT_EQ(r3.expert[0], 4);
  EXPECT_EQ(r3.expert[1], 5);
  EXPECT_TRUE(r3.expert[2] < 4 || r3.expert[2] > 7) << "third expert " << r3.expert[2];
}

}  // namespace
