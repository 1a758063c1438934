// attention_bias (docs/RELIABILITY.md): the q/k/v/o biases of Qwen3MoeAttention, y = x Wᵀ + b.
// Parity by construction on the embedded model: an o_proj bias b adds exactly b to every row of the
// block's output; a v_proj bias c adds W_o · c (per query head, its kv head's slice) because the
// softmax rows sum to 1; the fast path, its _ref twin and the KV-cached decoder agree with biases.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "io/checkpoint.h"
#include "model/kv_decoder.h"
#include "model/decoder.h"

namespace {

using moesq::model::DecoderModel;

// fp32 sums of 256 terms of O(1): a few ulps of the row magnitude.
constexpr float kAtol = 2e-5f;

std::vector<float> randn(int64_t n, unsigned seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class AttentionBias : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ckpt_ = new moesq::io::Checkpoint(MOESQ_DEFAULT_MODEL); }
  static void TearDownTestSuite() { delete ckpt_; }
  static moesq::io::Checkpoint* ckpt_;
};
moesq::io::Checkpoint* AttentionBias::ckpt_ = nullptr;

TEST_F(AttentionBias, OutputAndValueBiasesAddWhatTheMathSays) {
  DecoderModel m(*ckpt_);
  const auto& s = m.spec();
  const int64_t H = s.hidden_size, T = 5, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  const std::vector<float> h0 = randn(T * H, 1, 1.0f);
  moesq::model::ForwardOptions fo = m.default_forward_options();
  std::vector<float> base = h0;
  m.attention_block(1, base, T, fo);

  const std::vector<float> b = randn(H, 2, 0.1f);
  m.layer(1).o_bias = b;
  std::vector<float> with_o = h0;
  m.attention_block(1, with_o, T, fo);
  for (int64_t i = 0; i < T * H; ++i) ASSERT_NEAR(with_o[i] - base[i], b[i % H], kAtol) << "i=" << i;
  m.layer(1).o_bias.clear();

  const std::vector<float> c = randn(nkv * hd, 3, 0.1f);
  m.layer(1).v_bias = c;
  std::vector<float> with_v = h0;
  m.attention_block(1, with_v, T, fo);
  const std::vector<float>& Wo = m.layer(1).o_proj;  // [H, nh·hd]
  std::vector<float> shift(H, 0.0f);                 // W_o · c expanded to the query heads
  for (int64_t r = 0; r < H; ++r)
    for (int64_t a = 0; a < nh; ++a)
      for (int64_t j = 0; j < hd; ++j) shift[r] += Wo[r * nh * hd + a * hd + j] * c[(a / (nh / nkv)) * hd + j];
  double max_shift = 0.0;
  for (int64_t i = 0; i < T * H; ++i) {
    ASSERT_NEAR(with_v[i] - base[i], shift[i % H], kAtol) << "i=" << i;
    max_shift = std::max(max_shift, std::fabs(double(shift[i % H])));
  }
  EXPECT_GT(max_shift, 1e-3);  // the bias really moved the output
}

TEST_F(AttentionBias, FastPathRefTwinAndDecoderAgree) {
  DecoderModel m(*ckpt_);
  const auto& s = m.spec();
  const int64_t H = s.hidden_size, T = 6;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    auto& L = m.layer(l);
    L.q_bias = randn(s.num_heads * s.head_dim, 10 + l, 0.2f);
    L.k_bias = randn(s.num_kv_heads * s.head_dim, 20 + l, 0.2f);
    L.v_bias = randn(s.num_kv_heads * s.head_dim, 30 + l, 0.2f);
    L.o_bias = randn(H, 40 + l, 0.2f);
  }
  const std::vector<float> h0 = randn(T * H, 5, 1.0f);
  moesq::model::ForwardOptions fo = m.default_forward_options();
  std::vector<float> fast = h0, ref = h0;
  m.attention_block(0, fast, T, fo);
  m.attention_block_ref(0, ref, T);
  for (int64_t i = 0; i < T * H; ++i) ASSERT_NEAR(fast[i], ref[i], kAtol) << "i=" << i;

  const std::vector<int32_t> tokens = {3, 141, 59, 26, 53, 58};
  const std::vector<float> logits = m.forward(tokens, fo);  // [T, V]
  moesq::model::KvDecoder dec(m, T, fo);
  const int64_t V = s.vocab_size;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> z = dec.step(tokens[t]);
    for (int64_t v = 0; v < V; ++v) ASSERT_NEAR(z[v], logits[t * V + v], 1e-3f) << "t=" << t << " v=" << v;
  }
}

}  // namespace
