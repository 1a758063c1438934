// Scale-only fine-tuning (compress/refine/scale_finetune.h): the projection rule, θ = 0 reproducing the
// packed expert bit for bit, and steps that lower the router-weighted loss while every E2M1 value and
// pattern stays as packed.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include <nlohmann/json.hpp>
#include <vector>

#include "compress/refine/objective.h"
#include "compress/refine/options.h"
#include "compress/refine/scale_finetune.h"
#include "compress/refine/step_backend.h"
#include "core/error.h"
#include "format/fp_codecs.h"
#include "format/nvfp4.h"
#include "model/decoder.h"

namespace {

using namespace moesq;
using namespace moesq::compress::refine;

TEST(ScaleFinetune, ProjectionKeepsGammaUntilAScalePasses448) {
  const float gamma = 10.0f;
  std::vector<float> s = {44.8f, 1.0f, 0.0f, 1e-6f};  // s·γ = 448, 10, empty, far below the smallest code
  std::vector<uint8_t> c(s.size());
  EXPECT_EQ(project_block_scales(s.data(), 4, gamma, c.data()), gamma);
  EXPECT_EQ(format::e4m3_decode(c[0]), 448.0f);
  EXPECT_EQ(format::e4m3_decode(c[1]), 10.0f);
  EXPECT_EQ(c[2], 0) << "an empty block stays empty";
  EXPECT_EQ(format::e4m3_decode(c[3]), 0x1p-9f) << "a live block never rounds to a zero scale";
  s[0] = 89.6f;  // s·γ = 896: γ' = 448 / 89.6 = 5, the largest scale at 448
  const float g = project_block_scales(s.data(), 4, gamma, c.data());
  EXPECT_FLOAT_EQ(g, 5.0f);
  EXPECT_EQ(format::e4m3_decode(c[0]), 448.0f);
  EXPECT_EQ(format::e4m3_decode(c[1]), 5.0f);
}

struct Expert {
  int64_t H = 64, I = 32, n = 1536;
  std::vector<float> gate, up, down, X, Xq, Y, w;
  format::Sparse48Tensor pg, pu, pd;
};

// A random expert packed by magnitude patterns with moesq's shared gate|up γ, rows, router weights,
// and the dense expert's outputs as targets.
Expert make_expert(uint64_t seed) {
  Expert e;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  e.gate.resize(e.I * e.H), e.up.resize(e.I * e.H), e.down.resize(e.H * e.I);
  for (auto* v : {&e.gate, &e.up, &e.down})
    for (float& x : *v) x = 0.1f * nd(rng);
  e.X.resize(e.n * e.H);
  for (float& x : e.X) x = nd(rng);
  e.Y = model::swiglu_forward(e.gate.data(), e.up.data(), e.down.data(), e.H, e.I, e.X.data(), e.n, 0);
  e.Xq = e.X;
  for (int64_t i = 0; i < e.n; ++i) format::quantize_activation_row(&e.Xq[i * e.H], e.H, 32);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  e.w.resize(e.n);
  for (float& x : e.w) x = ud(rng) * ud(rng);
  const float g_gu = format::gate_up_tensor_scale(e.gate.data(), e.up.data(), e.I * e.H);
  e.pg = format::sparse48_quantize(e.gate.data(), e.I, e.H, format::magnitude_patterns(e.gate.data(), e.I, e.H).data(), g_gu);
  e.pu = format::sparse48_quantize(e.up.data(), e.I, e.H, format::magnitude_patterns(e.up.data(), e.I, e.H).data(), g_gu);
  e.pd = format::sparse48_quantize(e.down.data(), e.H, e.I, format::magnitude_patterns(e.down.data(), e.H, e.I).data());
  return e;
}

ScaleFinetuneRows rows_of(const Expert& e) {
  ScaleFinetuneRows r;
  r.n = e.n, r.H = e.H, r.I = e.I, r.Xq = e.Xq.data(), r.Y_ref = e.Y.data(), r.w = e.w.data(), r.act_block = 32;
  return r;
}

// The Eq. 4 loss of packed tensors on rows [r0, r1) (what refine's packed_loss measures).
double loss_of(const Expert& e, const format::Sparse48Tensor& g, const format::Sparse48Tensor& u,
               const format::Sparse48Tensor& d, int64_t r0, int64_t r1) {
  std::vector<float> Wg(e.I * e.H), Wu(e.I * e.H), Wd(e.H * e.I);
  format::sparse48_dequantize(g, Wg.data());
  format::sparse48_dequantize(u, Wu.data());
  format::sparse48_dequantize(d, Wd.data());
  ObjectiveInput<float> in;
  in.m = r1 - r0, in.H = e.H, in.I = e.I, in.X = e.Xq.data() + r0 * e.H, in.Y_ref = e.Y.data() + r0 * e.H;
  in.w = e.w.data() + r0;
  double sw = 0;
  for (int64_t i = r0; i < r1; ++i) sw += e.w[i];
  in.inv_norm = 1.0 / (sw * static_cast<double>(e.H));
  ObjectiveWorkspace ws;
  return expert_loss(in, Wg.data(), Wu.data(), Wd.data(), true, 64, ws);
}

std::vector<int64_t> ids(int64_t r0, int64_t r1) {
  std::vector<int64_t> v;
  for (int64_t i = r0; i < r1; ++i) v.push_back(i);
  return v;
}

TEST(ScaleFinetune, ZeroRateReproducesThePackedExpertBitForBit) {
  Expert e = make_expert(3);
  // A γ no kept block reaches 448 with: the stage must still start (and, without steps, end) there.
  for (auto* t : {&e.pg, &e.pu}) t->global_scale *= 0.75f;
  format::Sparse48Tensor g = e.pg, u = e.pu, d = e.pd;
  ScaleFinetuneOptions o;
  o.epochs = 2, o.lr = 0.0;
  EXPECT_GT(scale_finetune(g, u, d, rows_of(e), ids(0, e.n), 7, o), 0);
  EXPECT_EQ(g.scales, e.pg.scales);
  EXPECT_EQ(u.scales, e.pu.scales);
  EXPECT_EQ(d.scales, e.pd.scales);
  EXPECT_EQ(g.global_scale, e.pg.global_scale);
  EXPECT_EQ(d.global_scale, e.pd.global_scale);
}

// Started from scales 1/1.25 of the packed ones (every weight 20 % too small: a clearly worse point
// the straight-through gradient must lead out of), the steps lower the loss on the training rows and
// on held-out rows, and only scales and global scales change.
TEST(ScaleFinetune, StepsLowerTheLossOnHeldOutRowsAndMoveOnlyScales) {
  Expert e = make_expert(11);
  for (auto* t : {&e.pg, &e.pu, &e.pd}) t->global_scale *= 1.25f;
  const int64_t train_end = 1280;  // rows [1280, 1536) held out
  format::Sparse48Tensor g = e.pg, u = e.pu, d = e.pd;
  const double train_before = loss_of(e, g, u, d, 0, train_end), held_before = loss_of(e, g, u, d, train_end, e.n);
  ScaleFinetuneOptions o;
  o.epochs = 4, o.lr = 6e-3, o.batch = 64;  // Σ lr over the steps ≈ 0.26 > log 1.25
  const int64_t steps = scale_finetune(g, u, d, rows_of(e), ids(0, train_end), 5, o);
  EXPECT_EQ(steps, 4 * 20);
  const double train_after = loss_of(e, g, u, d, 0, train_end), held_after = loss_of(e, g, u, d, train_end, e.n);
  std::printf("[scale finetune] train %.5f -> %.5f, held-out %.5f -> %.5f\n", train_before, train_after, held_before,
              held_after);
  EXPECT_LT(train_after, 0.9 * train_before);
  EXPECT_LT(held_after, 0.9 * held_before);
  EXPECT_EQ(g.values, e.pg.values);
  EXPECT_EQ(g.meta, e.pg.meta);
  EXPECT_EQ(u.values, e.pu.values);
  EXPECT_EQ(d.values, e.pd.values);
  EXPECT_EQ(d.meta, e.pd.meta);
  EXPECT_NE(g.scales, e.pg.scales);
  EXPECT_EQ(g.global_scale, u.global_scale) << "gate and up keep one γ";
}

TEST(ScaleFinetune, MismatchedShapesAndGammasAreErrors) {
  Expert e = make_expert(2);
  format::Sparse48Tensor g = e.pg, u = e.pu, d = e.pd;
  u.global_scale *= 2.0f;
  ScaleFinetuneOptions o;
  o.epochs = 1;
  EXPECT_THROW(scale_finetune(g, u, d, rows_of(e), ids(0, 10), 1, o), Error);
  ScaleFinetuneRows r = rows_of(e);
  r.H = 32;
  EXPECT_THROW(scale_finetune(e.pg, e.pu, e.pd, r, ids(0, 10), 1, o), Error);
}

}  // namespace

namespace {

// The stage's two options: in the options JSON (report.json, the resume manifest) only when it runs,
// so that every earlier manifest keeps its bytes; range errors name the flag; with a device backend
// (the GPU) it is refused by name until the GPU path exists.
TEST(ScaleFinetune, OptionsJsonAndValidation) {
  moesq::compress::RefineOptions o;
  EXPECT_FALSE(moesq::compress::refine_options_to_json(o).contains("scale_finetune_epochs"));
  o.scale_finetune_epochs = 3;
  o.scale_finetune_lr = 2e-3;
  const nlohmann::json j = moesq::compress::refine_options_to_json(o);
  EXPECT_EQ(j.at("scale_finetune_epochs"), 3);
  const moesq::compress::RefineOptions back = moesq::compress::refine_options_from_json(j);
  EXPECT_EQ(back.scale_finetune_epochs, 3);
  EXPECT_EQ(back.scale_finetune_lr, 2e-3);
  EXPECT_NO_THROW(moesq::compress::validate(o));
  o.device = moesq::compress::refine::make_cpu_step_backend;  // any device backend
  try {
    moesq::compress::validate(o);
    FAIL() << "a device backend with the scale fine-tuning was accepted";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--scale-finetune-epochs"), std::string::npos) << e.what();
  }
  o.device = nullptr;
  o.scale_finetune_lr = -1;
  EXPECT_THROW(moesq::compress::validate(o), moesq::Error);
}

}  // namespace
