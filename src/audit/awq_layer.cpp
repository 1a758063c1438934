// One packed-AWQ MoE layer with four surfaces (see awq_layer.h). Non-obvious: the elementwise stages
// (SiLU·up, weighted combine) are plain fp32 loops in a fixed order, so every difference between two
// runs traces back to the GEMM schedule, never to a thread count.
#include "audit/awq_layer.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "core/hash.h"
#include "core/threads.h"

namespace moesq::audit {

AwqMoeWeights make_synthetic_awq_moe(int num_experts, int64_t hidden, int64_t intermediate, uint64_t seed,
                                     const std::vector<int32_t>& experts) {
  AwqMoeWeights w;
  w.num_experts = num_experts;
  w.hidden = hidden;
  w.intermediate = intermediate;
  w.w13.resize(num_experts);
  w.w2.resize(num_experts);
  // (q − z) is ~uniform on [−9, 9] (std ≈ 4.6); with |x| ~ U(−1, 1) (std 0.58) a K-long dot product has
  // std ≈ 2.7·s·√K, so s ≈ 0.2/√K keeps outputs O(0.5–1) and well inside fp16's normal range.
  const float s13 = 0.2f / std::sqrt(static_cast<float>(hidden));
  const float s2 = 0.4f / std::sqrt(static_cast<float>(intermediate));
  parallel_for(static_cast<int64_t>(experts.size()), [&](int64_t i) {
    const int32_t e = experts[i];
    MOESQ_CHECK(e >= 0 && e < num_experts, "make_synthetic_awq_moe: expert ", e, " outside [0, ", num_experts, ")");
    w.w13[e] = format::awq_random(2 * intermediate, hidden, seed * 1000003ull + 2 * e, 0.5f * s13, 1.5f * s13);
    w.w2[e] = format::awq_random(hidden, intermediate, seed * 1000003ull + 2 * e + 1, 0.5f * s2, 1.5f * s2);
  });
  return w;
}

AwqMoeWeights quantize_awq_moe(const std::vector<std::vector<float>>& gate, const std::vector<std::vector<float>>& up,
                               const std::vector<std::vector<float>>& down, int64_t hidden, int64_t intermediate) {
  MOESQ_CHECK(gate.size() == up.size() && gate.size() == down.size(), "quantize_awq_moe: ", gate.size(), " gate, ",
              up.size(), " up, ", down.size(), " down experts");
  AwqMoeWeights w;
  w.num_experts = static_cast<int>(gate.size());
  w.hidden = hidden;
  w.intermediate = intermediate;
  w.w13.resize(w.num_experts);
  w.w2.resize(w.num_experts);
  parallel_for(w.num_experts, [&](int64_t e) {
    std::vector<float> w13(gate[e]);
    w13.insert(w13.end(), up[e].begin(), up[e].end());  // [2I, H]: gate rows then up rows
    w.w13[e] = format::awq_quantize(w13, 2 * intermediate, hidden, "expert " + std::to_string(e) + " w13");
    w.w2[e] = format::awq_quantize(down[e], hidden, intermediate, "expert " + std::to_string(e) + " w2");
  });
  return w;
}

std::vector<uint16_t> make_random_f16(int64_t rows, int64_t cols, uint64_t seed) {
  SplitMix64 g(seed ^ 0xf16f16ull);
  std::vector<uint16_t> v(rows * cols);
  for (auto& h : v) h = f32_to_f16(2.0f * g.uniform() - 1.0f);
  return v;
}

std::string Surface::sha256() const { return sha256_hex(data.data(), data.size() * sizeof(uint16_t)); }

const Surface& LayerSurfaces::get(const std::string& name) const {
  for (const auto& s : surfaces)
    if (s.name == name) return s;
  MOESQ_FAIL("no surface named '", name, "' (expected w13_out, activation, w2_out or final)");
}

std::pair<ops::TileSchedule, ops::TileSchedule> layer_schedules(const AwqMoeWeights& w, const ops::RouteAlignment& a,
                                                      const LayerRunSpec& spec) {
  const int64_t N13 = 2 * w.intermediate, K13 = w.hidden, N2 = w.hidden, K2 = w.intermediate;
  const ops::ThreadConfig c13 = ops::select_thread_config(N13, K13, spec.overrides, spec.default_blocks_per_sm);
  const ops::ThreadConfig c2 = ops::select_thread_config(N2, K2, spec.overrides, spec.default_blocks_per_sm);
  return {ops::make_schedule(spec.schedule, a.num_blocks(), N13, K13, c13.thread_k, c13.thread_n, spec.grid),
          ops::make_schedule(spec.schedule, a.num_blocks(), N2, K2, c2.thread_k, c2.thread_n, spec.grid)};
}

LayerSurfaces run_awq_moe_layer(const std::vector<uint16_t>& x, const std::vector<float>& topk_weights,
                                const ops::RouteAlignment& a, const AwqMoeWeights& w, const LayerRunSpec& spec,
                                const AwqGemmFn& gemm) {
  const int64_t M = a.M, k = a.topk, H = w.hidden, I = w.intermediate, R = M * k;
  MOESQ_CHECK(static_cast<int64_t>(x.size()) == M * H, "awq layer: x has ", x.size(), " values, expected [M=", M,
              ", H=", H, "]");
  MOESQ_CHECK(static_cast<int64_t>(topk_weights.size()) == R, "awq layer: topk_weights has ", topk_weights.size(),
              " values, expected [M=", M, ", k=", k, "]");
  const auto [s13, s2] = layer_schedules(w, a, spec);
  LayerSurfaces out;
  out.surfaces = {{"w13_out", {R, 2 * I}, std::vector<uint16_t>(R * 2 * I)},
                  {"activation", {R, I}, std::vector<uint16_t>(R * I)},
                  {"w2_out", {R, H}, std::vector<uint16_t>(R * H)},
                  {"final", {M, H}, std::vector<uint16_t>(M * H)}};
  auto& c13 = out.surfaces[0].data;
  auto& act = out.surfaces[1].data;
  auto& c2 = out.surfaces[2].data;
  auto& fin = out.surfaces[3].data;

  ops::AwqMoeGemmDesc d13;
  d13.A = x.data();
  d13.num_a_rows = M;
  d13.a_row_div = static_cast<int>(k);
  d13.N = 2 * I;
  d13.K = H;
  d13.align = &a;
  d13.weights = &w.w13;
  d13.sched = &s13;
  d13.C = c13.data();
  gemm(d13);

  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const float g = f16_to_f32(c13[r * 2 * I + i]), u = f16_to_f32(c13[r * 2 * I + I + i]);
      act[r * I + i] = f32_to_f16(g / (1.0f + std::exp(-g)) * u);
    }

  ops::AwqMoeGemmDesc d2 = d13;
  d2.A = act.data();
  d2.num_a_rows = R;
  d2.a_row_div = 1;
  d2.N = H;
  d2.K = I;
  d2.weights = &w.w2;
  d2.sched = &s2;
  d2.C = c2.data();
  gemm(d2);

  for (int64_t t = 0; t < M; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t s = 0; s < k; ++s) acc += topk_weights[t * k + s] * f16_to_f32(c2[(t * k + s) * H + h]);
      fin[t * H + h] = f32_to_f16(acc);
    }
  return out;
}

}  // namespace moesq::audit
