// The CUDA step backend of the refinement (compress/refine/cuda_step_backend.h) against the CPU one, end
// to end through compress::refine_expert on a small random expert (H = 64, I = 32, 300 rows): the same
// options (2 epochs, batch 32, seed 1) give the same held-out curves and final loss within a named
// tolerance, nearly the same patterns, and two CUDA runs give the same packed bytes — with the support
// learned and with the V-only ablation (fixed support). And StepBackend::weights_loss (the loss of
// given, already packed weights) and packed_loss (the same, unpacked on the device) on both backends, from
// the same prepared rows; snapshot (the best-epoch state) against the synced parameters.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "compress/refine/cuda_step_backend.h"
#include "compress/refine/gumbel_mask.h"
#include "compress/refine/loop.h"
#include "compress/refine/options.h"
#include "compress/refine/step_backend.h"
#include "format/nvfp4.h"
#include "support/gpu_test_main.h"

namespace {

using namespace moesq;
using compress::ProjInit;
using compress::RefineOptions;
using compress::RefineResult;

// The GPU run follows the CPU run up to fp32 rounding (cuBLAS vs cblas summation order, the device's
// expf / logf, FMA contraction); over ~18 Lion steps the trajectories drift apart slowly: the held-out
// losses stay within 2 % relative, and the argmax patterns agree on almost every group (a pattern
// differs only where two logits end up next to a tie).
constexpr double kLossRelTol = 0.02;
constexpr double kMinPatternAgreement = 0.98;
// Before any step both evaluate the same parameters: only GEMM summation order and the Q_a codes it
// flips separate them.
constexpr double kInitLossRelTol = 1e-3;

struct Expert {
  int64_t n, H, I;
  std::vector<float> X, g, Y;  // [n, H], [n], [n, H]
  std::vector<float> W[3];     // gate [I, H], up [I, H], down [H, I]
  std::vector<uint8_t> prior[3];
};

// A random dense SwiGLU expert and its own outputs as targets; initial patterns by magnitude.
Expert make_expert(int64_t n, int64_t H, int64_t I, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  Expert e{n, H, I, std::vector<float>(n * H), std::vector<float>(n), std::vector<float>(n * H), {}, {}};
  for (auto& v : e.X) v = nd(rng);
  for (auto& v : e.g) v = ud(rng);
  const int64_t N[3] = {I, I, H}, K[3] = {H, H, I};
  for (int j = 0; j < 3; ++j) {
    e.W[j].resize(N[j] * K[j]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(K[j]));
    for (auto& v : e.W[j]) v = scale * nd(rng);
    e.prior[j] = format::magnitude_patterns(e.W[j].data(), N[j], K[j]);
  }
  std::vector<double> h(I);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < I; ++c) {
      double a = 0.0, b = 0.0;
      for (int64_t k = 0; k < H; ++k) {
        a += static_cast<double>(e.X[i * H + k]) * e.W[0][c * H + k];
        b += static_cast<double>(e.X[i * H + k]) * e.W[1][c * H + k];
      }
      h[c] = a / (1.0 + std::exp(-a)) * b;
    }
    for (int64_t o = 0; o < H; ++o) {
      double y = 0.0;
      for (int64_t c = 0; c < I; ++c) y += h[c] * e.W[2][o * I + c];
      e.Y[i * H + o] = static_cast<float>(y);
    }
  }
  return e;
}

RefineResult refine(const Expert& e, const RefineOptions& o) {
  const compress::ExpertData d{e.n, e.H, e.I, e.X.data(), e.g.data(), e.Y.data(), /*stream=*/5};
  const ProjInit gate{e.W[0].data(), e.prior[0].data()}, up{e.W[1].data(), e.prior[1].data()},
      down{e.W[2].data(), e.prior[2].data()};
  return compress::refine_expert(d, gate, up, down, o);
}

RefineOptions options(bool update_A) {
  RefineOptions o;
  o.epochs = 2;
  o.batch = 32;
  o.micro_batch = 32;
  o.seed = 1;
  o.lr_A = 2.5e-3;
  o.lr_V = 2.5e-4;
  o.update_A = update_A;
  return o;
}

bool same_bits(const format::Sparse48Tensor& a, const format::Sparse48Tensor& b) {
  return a.N == b.N && a.K == b.K && a.values == b.values && a.meta == b.meta && a.scales == b.scales &&
         a.global_scale == b.global_scale;
}

double pattern_agreement(const RefineResult& a, const RefineResult& b) {
  const format::Sparse48Tensor* ta[3] = {&a.gate, &a.up, &a.down};
  const format::Sparse48Tensor* tb[3] = {&b.gate, &b.up, &b.down};
  int64_t same = 0, total = 0;
  for (int j = 0; j < 3; ++j) {
    const auto pa = format::sparse48_patterns(*ta[j]), pb = format::sparse48_patterns(*tb[j]);
    for (size_t r = 0; r < pa.size(); ++r, ++total) same += pa[r] == pb[r];
  }
  return static_cast<double>(same) / static_cast<double>(total);
}

void expect_close(double gpu, double cpu, const char* what, size_t epoch) {
  EXPECT_GT(cpu, 0.0) << what << " epoch " << epoch;
  EXPECT_NEAR(gpu, cpu, kLossRelTol * cpu) << what << " epoch " << epoch;
}

}  // namespace

// fp32 GEMMs, and the forward's two GEMMs on bf16 tensor cores over the unscaled NVFP4 operands
// (RefineOptions::bf16_forward: exact products, so the same tolerances hold).
TEST(CudaStepBackend, FollowsTheCpuBackendAndIsReproducible) {
  const Expert e = make_expert(300, 64, 32, 11);
  for (const bool bf16_forward : {false, true})
  for (const bool update_A : {true, false}) {
    RefineOptions o = options(update_A);
    const RefineResult cpu = refine(e, o);
    o.device = compress::refine::make_cuda_step_backend;
    o.bf16_forward = bf16_forward;
    const RefineResult gpu = refine(e, o);
    const RefineResult gpu2 = refine(e, o);
    std::printf("bf16_forward=%d update_A=%d: held-out hard loss init %.6g, final cpu %.6g gpu %.6g; patterns agree "
                "%.4f\n",
                bf16_forward, update_A, cpu.init_hard_loss, cpu.final_hard_loss, gpu.final_hard_loss,
                pattern_agreement(cpu, gpu));
    ASSERT_FALSE(cpu.skipped);
    ASSERT_FALSE(gpu.skipped);
    EXPECT_EQ(gpu.steps, cpu.steps);
    EXPECT_GT(cpu.steps, 0);
    ASSERT_EQ(cpu.curves.soft_loss.size(), 2u);
    ASSERT_EQ(gpu.curves.soft_loss.size(), 2u);
    ASSERT_EQ(gpu.curves.hard_loss.size(), 2u);
    for (size_t ep = 0; ep < 2; ++ep) {
      expect_close(gpu.curves.soft_loss[ep], cpu.curves.soft_loss[ep], "soft loss", ep);
      expect_close(gpu.curves.hard_loss[ep], cpu.curves.hard_loss[ep], "hard loss", ep);
    }
    expect_close(gpu.final_hard_loss, cpu.final_hard_loss, "final hard loss", 2);
    EXPECT_NEAR(gpu.init_hard_loss, cpu.init_hard_loss, kInitLossRelTol * cpu.init_hard_loss);
    EXPECT_NE(cpu.final_hard_loss, cpu.init_hard_loss) << "the refinement moved";
    if (update_A) {
      EXPECT_GE(pattern_agreement(cpu, gpu), kMinPatternAgreement);
      EXPECT_GT(gpu.pattern_change, 0.0);
    } else {
      EXPECT_EQ(pattern_agreement(cpu, gpu), 1.0) << "V only: the support stays the prior on both";
      EXPECT_EQ(gpu.pattern_change, 0.0);
    }
    EXPECT_EQ(gpu.gate.global_scale, gpu.up.global_scale);
    // Bitwise reproducible on the GPU.
    EXPECT_TRUE(same_bits(gpu.gate, gpu2.gate) && same_bits(gpu.up, gpu2.up) && same_bits(gpu.down, gpu2.down))
        << "update_A=" << update_A;
    EXPECT_EQ(gpu.curves.soft_loss, gpu2.curves.soft_loss);
    EXPECT_EQ(gpu.curves.hard_loss, gpu2.curves.hard_loss);
    EXPECT_EQ(gpu.final_hard_loss, gpu2.final_hard_loss);
  }
}

TEST(CudaStepBackend, WeightsLossMatchesTheCpuBackend) {
  const Expert e = make_expert(300, 64, 32, 12);
  const int64_t n = e.n, H = e.H, I = e.I;
  std::vector<int64_t> rows(n);
  double w_sum = 0.0;
  for (int64_t i = 0; i < n; ++i) rows[i] = i, w_sum += e.g[i];
  compress::refine::StepData sd;
  sd.n = n, sd.H = H, sd.I = I, sd.X = e.X.data(), sd.Y_ref = e.Y.data(), sd.w = e.g.data();
  sd.eval_rows = rows.data(), sd.n_eval = n, sd.eval_inv_norm = 1.0 / (w_sum * static_cast<double>(H));
  sd.max_batch = 32, sd.act_block = 32;
  const RefineOptions o = options(true);
  const int64_t N[3] = {I, I, H}, K[3] = {H, H, I};
  // Packed-and-dequantized weights of another random expert: what weights_loss is given.
  const Expert other = make_expert(8, H, I, 13);
  std::vector<float> W[3];
  std::vector<format::Sparse48Tensor> T;
  for (int j = 0; j < 3; ++j) {
    T.push_back(format::sparse48_quantize(other.W[j].data(), N[j], K[j], other.prior[j].data(),
                                          format::nvfp4_tensor_scale(format::amax_abs(other.W[j].data(), N[j] * K[j])),
                                          "test"));
    const format::Sparse48Tensor& t = T.back();
    W[j].resize(N[j] * K[j]);
    format::sparse48_dequantize(t, W[j].data());
  }
  double loss[2], packed[2], packed_host_unpack = 0, eval_before = 0, eval_after = 0;
  for (int dev = 0; dev < 2; ++dev) {
    std::array<compress::refine::ProjState<float>, 3> P;
    for (int j = 0; j < 3; ++j) {
      P[j].N = N[j], P[j].K = K[j], P[j].V = e.W[j];
      P[j].A.assign(static_cast<size_t>(P[j].groups() * 6), 0.0f);
    }
    auto backend = dev ? compress::refine::make_cuda_step_backend() : compress::refine::make_cpu_step_backend();
    backend->start(sd, P, {nullptr, nullptr, nullptr}, o);
    if (dev) eval_before = backend->eval_loss(true, 1.0, 1.0);
    loss[dev] = backend->weights_loss(W[0].data(), W[1].data(), W[2].data());
    if (dev) eval_after = backend->eval_loss(true, 1.0, 1.0);
    // packed_loss: the device unpacks (ops::sparse48_dequant) what the host would, bit for bit, so the
    // loss is weights_loss's exactly; the base class's host unpack on the same backend agrees.
    packed[dev] = backend->packed_loss(T[0], T[1], T[2]);
    if (dev) packed_host_unpack = backend->StepBackend::packed_loss(T[0], T[1], T[2]);
  }
  EXPECT_EQ(packed[0], loss[0]);
  EXPECT_EQ(packed[1], loss[1]);
  EXPECT_EQ(packed_host_unpack, loss[1]);
  std::printf("weights_loss cpu %.8g gpu %.8g\n", loss[0], loss[1]);
  EXPECT_GT(loss[0], 0.0);
  EXPECT_NEAR(loss[1], loss[0], kInitLossRelTol * loss[0]);
  EXPECT_EQ(eval_before, eval_after) << "weights_loss must not disturb the backend's own weights";
}

// snapshot (the best-epoch state and the final patterns): the device's argmax and V, read back without
// A, are the host argmax of the synced A and the synced V, bit for bit — a learned support on gate and
// up, a fixed one on down (its own patterns come back). The prior logits are drawn on the device here
// (draws_prior) and match the host draw within its tolerance of an fp32 ulp, so the argmax agrees.
TEST(CudaStepBackend, SnapshotIsTheArgmaxAndValuesOfTheSyncedState) {
  const Expert e = make_expert(64, 64, 32, 21);
  std::vector<int64_t> rows(e.n);
  for (int64_t i = 0; i < e.n; ++i) rows[i] = i;
  compress::refine::StepData sd;
  sd.n = e.n, sd.H = e.H, sd.I = e.I, sd.X = e.X.data(), sd.Y_ref = e.Y.data(), sd.w = e.g.data();
  sd.eval_rows = rows.data(), sd.n_eval = e.n, sd.eval_inv_norm = 1.0;
  sd.max_batch = 32, sd.act_block = 32;
  const RefineOptions o = options(true);
  const int64_t N[3] = {e.I, e.I, e.H}, K[3] = {e.H, e.H, e.I};
  std::array<compress::refine::ProjState<float>, 3> P;
  for (int j = 0; j < 3; ++j) {
    P[j].N = N[j], P[j].K = K[j], P[j].V = e.W[j];
    P[j].A.assign(static_cast<size_t>(P[j].groups() * 6), 0.0f);
  }
  for (int j = 0; j < 2; ++j) {
    sd.prior[j] = e.prior[j].data();
    sd.prior_key[j] = 1000 + j;
  }
  sd.prior_sigma = 1.0, sd.prior_s = 0.5;  // weak prior: the noise moves many argmaxes off the prior
  auto backend = compress::refine::make_cuda_step_backend();
  ASSERT_TRUE(backend->draws_prior());
  backend->start(sd, P, {nullptr, nullptr, e.prior[2].data()}, o);
  std::array<std::vector<float>, 3> V;
  std::array<std::vector<uint8_t>, 3> pat;
  for (int j = 0; j < 3; ++j) V[j].assign(P[j].V.size(), -1.0f);
  backend->snapshot({V[0].data(), V[1].data(), V[2].data()}, pat);
  backend->sync(P);
  int64_t moved = 0;
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(V[j], P[j].V) << "projection " << j;
    std::vector<uint8_t> want(static_cast<size_t>(P[j].groups()));
    if (j == 2) {
      want = e.prior[2];
    } else {
      compress::refine::hard_mask(P[j].A.data(), P[j].groups(), want.data(), static_cast<float*>(nullptr));
      std::vector<float> A_host(P[j].A.size());
      compress::refine::prior_logits(e.prior[j].data(), P[j].groups(), 1.0, 0.5, 1000 + j, A_host.data());
      for (size_t i = 0; i < A_host.size(); ++i)
        ASSERT_LE(std::fabs(A_host[i] - P[j].A[i]), 1e-6f * (1.0f + std::fabs(A_host[i]))) << "prior logit " << i;
    }
    EXPECT_EQ(pat[j], want) << "projection " << j;
    for (size_t r = 0; r < want.size(); ++r) moved += want[r] != e.prior[j][r];
  }
  EXPECT_GT(moved, 0) << "the test needs argmaxes away from the prior";
}

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
