// Static activation global scales (compressed-tensors input_activations.dynamic false): an expert with
// ExpertWeights::gate_up_act_scale / down_act_scale quantizes its two inputs with those γ_a instead of
// the per-row 448·6/amax (paper Eq. 5 on the row). Checked exactly: with γ_a equal to what the dynamic
// rule computes for a one-row input, the two forwards give the same bits; with two rows of different
// amax they differ, and only in the row whose γ_a is not the static one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "format/nvfp4.h"
#include "model/decoder.h"

namespace {

using moesq::model::ExpertVariant;
using moesq::model::swiglu_forward;

float amax(const std::vector<float>& v, size_t begin, size_t end) {
  float m = 0.0f;
  for (size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

TEST(StaticActScale, EqualsTheDynamicRuleWhereItsScaleIsTheRowsAndDiffersElsewhere) {
  constexpr int64_t H = 64, I = 32;
  constexpr int kBlock = 32;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> gate(I * H), up(I * H), down(H * I);  // [I, H], [I, H], [H, I]
  for (auto* w : {&gate, &up, &down})
    for (float& v : *w) v = 0.2f * nd(rng);
  std::vector<float> x(2 * H);  // [2, H]; row 1 is row 0 scaled by 3 (another amax, another γ_a)
  for (int64_t k = 0; k < H; ++k) x[k] = nd(rng), x[H + k] = 3.0f * x[k] + 0.25f * nd(rng);

  // The dynamic rule's γ_a of row 0's two inputs: x itself, and the SwiGLU output h of the quantized x.
  std::vector<float> h;
  const std::vector<float> dyn = swiglu_forward(gate.data(), up.data(), down.data(), H, I, x.data(), 2, kBlock);
  std::vector<float> xq = x;  // both rows quantized as the dynamic forward does; the same GEMM shapes
  moesq::format::quantize_activation_row(xq.data(), H, kBlock);
  moesq::format::quantize_activation_row(xq.data() + H, H, kBlock);
  (void)swiglu_forward(gate.data(), up.data(), down.data(), H, I, xq.data(), 2, 0, &h);  // h [2, I] unquantized
  ExpertVariant v;
  v.gate_up_act_scale = moesq::format::nvfp4_tensor_scale(amax(x, 0, H));
  v.down_act_scale = moesq::format::nvfp4_tensor_scale(amax(h, 0, I));
  const std::vector<float> st = swiglu_forward(gate.data(), up.data(), down.data(), H, I, x.data(), 2, kBlock,
                                               nullptr, v);
  ASSERT_EQ(st.size(), static_cast<size_t>(2 * H));
  EXPECT_GT(amax(st, 0, 2 * H), 0.0f) << "all zeros";
  int differ_row1 = 0;
  for (int64_t c = 0; c < H; ++c) {
    EXPECT_EQ(st[c], dyn[c]) << "row 0, column " << c << ": the static γ_a is row 0's dynamic one";
    differ_row1 += st[H + c] != dyn[H + c];
  }
  EXPECT_GT(differ_row1, 0) << "row 1 has another amax: its static result must differ from the dynamic one";
  // Without activation quantization (act_block 0) the static scales are not applied.
  const std::vector<float> none = swiglu_forward(gate.data(), up.data(), down.data(), H, I, x.data(), 2, 0, nullptr, v);
  const std::vector<float> none_dyn = swiglu_forward(gate.data(), up.data(), down.data(), H, I, x.data(), 2, 0);
  EXPECT_EQ(none, none_dyn);
}

}  // namespace
