// The embedded tiny Qwen3-MoE model quantized to AWQ: format error of every layer-0 expert, the published
// per-projection tensors (gate/up/down) round-trip through safetensors and agree with the fused W13 the
// kernel uses, and one MoE layer on the AWQ experts agrees with an fp64 reference of the same dequantized
// weights — under the native and the invariant schedule alike.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "core/half.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "ops/route_align/route_align.h"
#include "audit/awq_tensors.h"
#include "format/awq_int4.h"
#include "audit/awq_layer.h"

using namespace moesq;
using namespace moesq::audit;
using namespace moesq::format;
using namespace moesq::ops;

namespace {

// Format error budget of int4 asymmetric group-128 RTN: the step is (max − min)/15 per group, so the
// rounding error is ≈ step/√12 ≈ range/52; for roughly Gaussian weights (range ≈ 5σ over 128 values) the
// relative Frobenius error is ≈ 0.1. kMaxRelFrob leaves margin; kMinRelFrob catches a "lossless" bug.
constexpr double kMaxRelFrob = 0.15;
constexpr double kMinRelFrob = 1e-3;

double rel_frob(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - ref[i]) * (a[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST(AwqTiny, QuantizeExportAndRunLayer0) {
  io::Checkpoint ck(MOESQ_DEFAULT_MODEL);
  const int64_t H = ck.spec().hidden_size, I = ck.spec().moe_intermediate_size;
  const int E = static_cast<int>(ck.spec().num_experts), k = static_cast<int>(ck.spec().top_k);
  ASSERT_EQ(H % 128, 0);
  ASSERT_EQ(I % 128, 0);
  std::vector<std::vector<float>> gate(E), up(E), down(E);
  const std::string pre = "model.layers.0.mlp.experts.";
  for (int e = 0; e < E; ++e) {
    gate[e] = ck.get_f32(pre + std::to_string(e) + ".gate_proj.weight", {I, H});
    up[e] = ck.get_f32(pre + std::to_string(e) + ".up_proj.weight", {I, H});
    down[e] = ck.get_f32(pre + std::to_string(e) + ".down_proj.weight", {H, I});
  }
  const AwqMoeWeights w = quantize_awq_moe(gate, up, down, H, I);

  // Format error per expert and projection.
  for (int e = 0; e < E; ++e) {
    std::vector<float> w13(gate[e]);
    w13.insert(w13.end(), up[e].begin(), up[e].end());
    const double e13 = rel_frob(awq_dequantize_ref(w.w13[e]), w13), e2 = rel_frob(awq_dequantize_ref(w.w2[e]), down[e]);
    EXPECT_LT(e13, kMaxRelFrob) << "expert " << e << " w13";
    EXPECT_GT(e13, kMinRelFrob) << "expert " << e << " w13";
    EXPECT_LT(e2, kMaxRelFrob) << "expert " << e << " w2";
  }

  // Published per-projection tensors: quantizing gate alone gives the first I columns of the fused W13
  // (AWQ statistics are per output column), and the tensors round-trip through safetensors.
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("moesq_awq_tiny_" + std::to_string(::getpid()) + ".safetensors")).string();
  {
    io::SafetensorsWriter wr;
    for (int e = 0; e < 2; ++e) {
      const std::string p = pre + std::to_string(e);
      awq_add_tensors(wr, p + ".gate_proj", awq_quantize(gate[e], I, H));
      awq_add_tensors(wr, p + ".up_proj", awq_quantize(up[e], I, H));
      awq_add_tensors(wr, p + ".down_proj", w.w2[e]);
    }
    wr.write(path);
  }
  io::SafetensorsFile f(path);
  for (int e = 0; e < 2; ++e) {
    const auto g = awq_read_tensors(f, pre + std::to_string(e) + ".gate_proj");
    const auto u = awq_read_tensors(f, pre + std::to_string(e) + ".up_proj");
    for (int64_t kk = 0; kk < H; kk += 7)
      for (int64_t n = 0; n < I; ++n) {
        ASSERT_EQ(g.q(kk, n), w.w13[e].q(kk, n)) << "expert " << e << " gate k=" << kk << " n=" << n;
        ASSERT_EQ(u.q(kk, n), w.w13[e].q(kk, I + n)) << "expert " << e << " up k=" << kk << " n=" << n;
      }
    EXPECT_EQ(awq_read_tensors(f, pre + std::to_string(e) + ".down_proj").qweight, w.w2[e].qweight);
  }
  std::filesystem::remove(path);

  // One layer on the AWQ experts vs an fp64 reference of the same dequantized weights (same fp16
  // roundings of W13 and the activation are not replicated: budget = a few fp16 ulps of the output
  // scale, kLayerAtol, plus 2^-8 relative).
  const int64_t M = 12;
  SplitMix64 g(5);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < M; ++t) {
    std::set<int32_t> row;
    while (static_cast<int>(row.size()) < k) row.insert(static_cast<int32_t>(g.below(E)));
    ids.insert(ids.end(), row.begin(), row.end());
  }
  const auto tw = make_fixture_topk_weights(M, k, 6);
  const auto x = make_random_f16(M, H, 7);
  std::vector<std::vector<float>> d13(E), d2(E);
  for (int e = 0; e < E; ++e) {
    d13[e] = awq_dequantize_ref(w.w13[e]);
    d2[e] = awq_dequantize_ref(w.w2[e]);
  }
  std::vector<double> ref(M * H, 0.0);
  double scale = 0;
  for (int64_t t = 0; t < M; ++t)
    for (int s = 0; s < k; ++s) {
      const int e = ids[t * k + s];
      std::vector<double> act(I);
      for (int64_t i = 0; i < I; ++i) {
        double gt = 0, ut = 0;
        for (int64_t kk = 0; kk < H; ++kk) {
          gt += double(f16_to_f32(x[t * H + kk])) * d13[e][i * H + kk];
          ut += double(f16_to_f32(x[t * H + kk])) * d13[e][(I + i) * H + kk];
        }
        act[i] = gt / (1 + std::exp(-gt)) * ut;
      }
      for (int64_t h = 0; h < H; ++h) {
        double o = 0;
        for (int64_t i = 0; i < I; ++i) o += act[i] * d2[e][h * I + i];
        ref[t * H + h] += tw[t * k + s] * o;
      }
    }
  for (double v : ref) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.0);
  const double kLayerAtol = 8 * 0x1p-11 * scale;
  for (auto kind : {ScheduleKind::Native, ScheduleKind::Invariant}) {
    const auto a = align_routes(ids, M, k, E, 8, AlignOrder::Canonical);
    const auto out = run_awq_moe_layer(x, tw, a, w, {kind, 5, {}, 3});
    const auto& fin = out.get("final").data;
    for (int64_t i = 0; i < M * H; ++i)
      ASSERT_LE(std::fabs(f16_to_f32(fin[i]) - ref[i]), kLayerAtol + 0x1p-8 * std::fabs(ref[i]))
          << schedule_kind_name(kind) << " token " << i / H << " h=" << i % H << " (M=" << M << ", H=" << H << ")";
  }
}
