// The layer's propagation on the GPU (compress::layer_device_cuda) and its scatter op:
//   * ops::scatter_add_f32 against its `_ref` twin, bit for bit (one product, one sum per element);
//   * routed_experts on the GPU against DecoderModel::moe_block on the CPU (the propagation it
//     replaces) on a random layer: without Q_a within fp32 GEMM summation order, with Q_a (blocks 32
//     and 16) within the E2M1 flips that order causes; experts with more rows than one GPU chunk and an
//     expert with no rows; two GPU runs give the same bits; a NaN input is an Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "compress/expert_cuda.h"
#include "compress/pipeline.h"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "model/decoder.h"
#include "ops/scatter_add_f32/scatter_add_f32.h"
#include "support/gpu_test_main.h"

namespace {

using namespace moesq;

// No Q_a: the GPU's and OpenBLAS's fp32 GEMMs sum in different orders (relative Frobenius error).
constexpr double kNoQuantRelFro = 1e-5;
// Q_a on: an ulp-level difference moves a value across an E2M1 rounding boundary in a few elements
// (up to one E2M1 step), as in tests/model/test_forward.cpp.
constexpr double kActQuantRelFro = 2e-2;

std::vector<float> random_vec(size_t n, uint64_t seed, float sd) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  return x;
}

double rel_fro(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

io::ModelSpec layer_spec(int64_t E, int64_t k) {
  io::ModelSpec s;
  s.model_type = "qwen3_moe";
  s.vocab_size = 16;
  s.hidden_size = 128;
  s.intermediate_size = 96;
  s.moe_intermediate_size = 64;
  s.num_layers = 1;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.num_experts = E;
  s.top_k = k;
  s.norm_topk_prob = true;
  s.rms_norm_eps = 1e-6;
  s.rope_theta = 10000.0;
  return s;
}

void randomize_moe(model::DecoderModel& m, uint64_t seed) {
  const io::ModelSpec& s = m.spec();
  model::LayerWeights& L = m.layer(0);
  L.router = random_vec(L.router.size(), seed, 0.5f);
  uint64_t q = seed;
  for (model::ExpertWeights& e : L.experts) {
    e.gate = random_vec(e.gate.size(), ++q, 1.0f / std::sqrt(static_cast<float>(s.hidden_size)));
    e.up = random_vec(e.up.size(), ++q, 1.0f / std::sqrt(static_cast<float>(s.hidden_size)));
    e.down = random_vec(e.down.size(), ++q, 1.0f / std::sqrt(static_cast<float>(s.moe_intermediate_size)));
  }
}

}  // namespace

TEST(ScatterAddF32Gpu, MatchesTheTwinBitwise) {
  for (const int64_t C : {7, 300, 2048})
    for (const int64_t m : {1, 257, 3000}) {
      const int64_t y_rows = 4000;
      std::vector<int64_t> rows(y_rows);
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), std::mt19937_64(C + m));
      const std::vector<int64_t> idx(rows.begin(), rows.begin() + m);
      const auto src = random_vec(m * C, 1 + C, 2.0f), w = random_vec(m, 2 + m, 0.5f);
      std::vector<float> y = random_vec(y_rows * C, 3, 1.0f);
      DevBuf<float> dsrc(src), dw(w), dy(y);
      DevBuf<int64_t> didx(idx);
      ops::scatter_add_f32({.src = dsrc.p, .w = dw.p, .idx = didx.p, .m = m, .C = C, .y = dy.p, .y_rows = y_rows},
                           nullptr);
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
      ops::scatter_add_f32_ref(
          {.src = src.data(), .w = w.data(), .idx = idx.data(), .m = m, .C = C, .y = y.data(), .y_rows = y_rows});
      const std::vector<float> got = dy.download();
      ASSERT_EQ(0, std::memcmp(got.data(), y.data(), y.size() * sizeof(float))) << "C=" << C << " m=" << m;
    }
}

TEST(LayerDeviceCuda, RoutedExpertsMatchTheCpuMoeBlock) {
  // 6 experts, top-2, expert 0 on 5,400 of the 9,000 tokens (more than one GPU chunk of 4,096 rows),
  // expert 5 on none, weights random and normalised as a softmax router's.
  const int64_t E = 6, k = 2, n = 9000;
  model::DecoderModel m(layer_spec(E, k));
  randomize_moe(m, 7);
  const int64_t H = m.spec().hidden_size, I = m.spec().moe_intermediate_size;
  const std::vector<float> X = random_vec(n * H, 11, 1.0f);
  model::Routes r;
  r.n = n;
  r.k = k;
  std::mt19937_64 g(13);
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t a = t % 5 < 3 ? 0 : static_cast<int32_t>(1 + g() % 4);
    int32_t b = static_cast<int32_t>(1 + g() % 4);
    if (b == a) b = b % 4 + 1;
    const float wa = u(g), wb = u(g);
    r.expert.insert(r.expert.end(), {a, b});
    r.weight.insert(r.weight.end(), {wa / (wa + wb), wb / (wa + wb)});
  }
  std::vector<int64_t> per_expert(E, 0);
  for (int32_t e : r.expert) ++per_expert[e];
  EXPECT_EQ(per_expert[5], 0);
  EXPECT_GT(*std::max_element(per_expert.begin(), per_expert.end()), 4096) << "no expert spans two chunks";
  const compress::LayerDevice* dev = compress::layer_device_cuda();
  for (const int block : {0, 32, 16}) {
    model::ForwardOptions fo;
    fo.act_quant = block > 0;
    fo.act_block = block > 0 ? block : 32;
    const std::vector<float> want = m.moe_block(0, X, r, fo);
    const std::vector<float> got = dev->routed_experts(m.layer(0).experts, H, I, X, r, block);
    ASSERT_EQ(got.size(), want.size());
    const double e = rel_fro(got, want);
    EXPECT_LE(e, block > 0 ? kActQuantRelFro : kNoQuantRelFro) << "act block " << block;
    EXPECT_GT(e, 0.0) << "act block " << block << ": the same bits as OpenBLAS would be a surprise";
    const std::vector<float> again = dev->routed_experts(m.layer(0).experts, H, I, X, r, block);
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << "act block " << block;
  }
}

TEST(LayerDeviceCuda, NonFiniteInputIsAnError) {
  model::DecoderModel m(layer_spec(4, 2));
  randomize_moe(m, 3);
  const int64_t H = m.spec().hidden_size, I = m.spec().moe_intermediate_size, n = 50;
  std::vector<float> X = random_vec(n * H, 5, 1.0f);
  const model::Routes r = m.route(0, X, n);
  X[17 * H + 3] = std::numeric_limits<float>::quiet_NaN();
  try {
    compress::layer_device_cuda()->routed_experts(m.layer(0).experts, H, I, X, r, 32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN or an infinity"), std::string::npos) << e.what();
  }
}

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
