// One MoE layer alone on the GPU (runtime::MoeLayerGpu, bf16 experts: the Python moesq.MoeLayer) for
// the routers and shared experts of families whose attention the engine does not run yet, against the
// CPU model's ffn_block on the same bf16-exact input: DeepSeek-V3 (sigmoid router with correction bias,
// 4 groups of 4 experts with 2 kept, × 2.5, an ungated shared expert), Qwen2-MoE (softmax without
// renormalisation, a shared expert behind its sigmoid gate), and Qwen3-MoE as the baseline. Routes
// equal; weights within the router's expf rounding; outputs within kLayerTol of the largest.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/half.h"
#include "io/checkpoint.h"
#include "model/decoder.h"
#include "runtime/layers/moe_block.h"
#include "runtime/weights.h"
#include "support/gpu_test_main.h"

namespace {

using namespace moesq;

// The bf16 backend rounds the expert activations (the SwiGLU output into the down GEMM) to bf16 where
// the CPU keeps fp32 (≈ 2^-9 relative per element), and sums in another order: 1 % of the largest output.
constexpr double kLayerTol = 1e-2;
// Router weights: expf vs std::exp inside σ / softmax, a renormalisation and a scale: a few fp32 ulps.
constexpr double kWeightRelTol = 1e-5;

void check_layer(const std::string& dir) {
  const io::Checkpoint ckpt(dir);
  const model::DecoderModel cpu(ckpt);
  const io::ModelSpec& s = cpu.spec();
  int64_t l = 0;
  while (!s.is_moe_layer(l)) ++l;
  const runtime::HostMoeLayer host = runtime::load_host_moe_layer(ckpt, l, runtime::ExpertBackend::kBf16);
  const runtime::MoeLayerGpu gpu(host, 0);
  const int64_t T = 19, H = s.hidden_size, k = s.top_k;
  std::mt19937_64 g(123);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> xb(T * H);
  std::vector<float> xf(T * H);
  for (int64_t i = 0; i < T * H; ++i) xb[i] = f32_to_bf16(d(g)), xf[i] = bf16_to_f32(xb[i]);
  DevBuf<uint16_t> dx(xb);
  DevBuf<float> dh(T * H), dw(T * k);
  DevBuf<int32_t> dids(T * k);
  gpu.forward(dx.p, nullptr, T, dh.p, false, dids.p, dw.p, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  const model::Routes r = cpu.route(l, xf, T);
  const std::vector<float> want = cpu.ffn_block(l, xf, T, cpu.default_forward_options());
  EXPECT_EQ(dids.download(), r.expert) << dir;
  const std::vector<float> gw = dw.download();
  for (int64_t i = 0; i < T * k; ++i)
    ASSERT_NEAR(gw[i], r.weight[i], kWeightRelTol * std::fabs(r.weight[i]) + 1e-7) << dir << " route " << i;
  const std::vector<float> got = dh.download();
  double scale = 0.0, worst = 0.0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  ASSERT_GT(scale, 0.0);
  for (int64_t i = 0; i < T * H; ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  std::printf("[moe layer gpu] %s layer %lld: worst |gpu - cpu| %.3g of max %.3g\n", dir.c_str(),
              static_cast<long long>(l), worst, scale);
  EXPECT_LE(worst, kLayerTol * scale) << dir;
}

const std::string kFamilies = std::string(MOESQ_FIXTURES) + "/families/";

TEST(MoeLayerGpu, DeepSeekV3SigmoidGroupedRouterAndSharedExpertMatchCpu) { check_layer(kFamilies + "tiny-deepseek-v3"); }
TEST(MoeLayerGpu, Qwen2MoeGatedSharedExpertMatchesCpu) { check_layer(kFamilies + "tiny-qwen2-moe"); }
TEST(MoeLayerGpu, Qwen3MoeMatchesCpu) { check_layer(MOESQ_DEFAULT_MODEL); }

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
