// The two forms of the Gated DeltaNet ops (src/ops/gated_deltanet/gated_deltanet.h): the parallel form's
// twins (every token's conv at once then the windows moved on; the recurrence as prep / per-column
// walk / norm, consuming its inputs) give BITWISE the walk form's conv outputs, windows, o, bf16 hi + lo
// and states — on fresh random inputs, over calls of uneven runs (one token, fewer tokens than the conv
// window, none, many) in slots out of order, with and without the state update. The GPU kernels of both
// forms are checked against each other bitwise in tests/gpu/test_gdn_ops.cu.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "ops/gated_deltanet/gated_deltanet.h"
#include "support/expect_error.h"
#include "support/float_vectors.h"

namespace ops = moesq::ops;
using moesq::test::rand_f32;
using moesq::test::same_bits;

namespace {

struct Shape {
  int nk, dk, nv, dv, Kc;
};

// One call of both ops in one form on copies of the same inputs and states.
struct Result {
  std::vector<float> conv_out, window, o, S;
  std::vector<uint16_t> hi, lo;
};

Result run_form(const Shape& s, int slots, const std::vector<float>& x, const std::vector<int32_t>& start,
                const std::vector<int32_t>& slot, std::vector<float> window, std::vector<float> S,
                ops::GdnForm form, bool update_state, uint64_t seed) {
  const int C = 2 * s.nk * s.dk + s.nv * s.dv, Vd = s.nv * s.dv, ld = C + Vd + 2 * s.nv;
  const int64_t T = start.back();
  const std::vector<float> w = rand_f32(static_cast<size_t>(C) * s.Kc, seed, 0.5f);
  const std::vector<float> A_log = rand_f32(s.nv, seed + 1, 0.5f), dt_bias = rand_f32(s.nv, seed + 2, 0.5f);
  std::vector<float> norm = rand_f32(s.dv, seed + 3, 0.3f);
  for (float& v : norm) v += 1.0f;
  std::vector<float> xs = x;  // the parallel recurrence writes α, β over a, b
  Result r;
  r.conv_out.assign(static_cast<size_t>(T) * C, 0.0f);
  r.o.assign(static_cast<size_t>(T) * Vd, 0.0f);
  r.hi.assign(r.o.size(), 0), r.lo.assign(r.o.size(), 0);
  const ops::GdnRuns runs{start.data(), slot.data(), static_cast<int>(slot.size()), slots};
  ops::GdnConvArgs c{.x = xs.data(), .ldx = ld, .w = w.data(), .window = window.data(), .out = r.conv_out.data(),
                     .runs = runs, .C = C, .Kc = s.Kc, .update_state = update_state, .form = form, .tokens = T};
  ops::gdn_conv_ref(c);
  std::vector<float> qkv = r.conv_out;  // the recurrence's input, consumed by the parallel form
  ops::GdnRecurrenceArgs a;
  a.qkv = qkv.data(), a.z = xs.data() + C, a.b = xs.data() + C + Vd, a.a = xs.data() + C + Vd + s.nv, a.ldz = ld;
  a.A_log = A_log.data(), a.dt_bias = dt_bias.data(), a.norm = norm.data(), a.S = S.data();
  a.out = r.o.data(), a.out_hi = r.hi.data(), a.out_lo = r.lo.data(), a.runs = runs;
  a.nk = s.nk, a.dk = s.dk, a.nv = s.nv, a.dv = s.dv, a.update_state = update_state;
  a.form = form, a.tokens = T, a.consume_inputs = true;
  ops::gdn_recurrence_ref(a);
  r.window = std::move(window), r.S = std::move(S);
  return r;
}

TEST(GdnForms, TheParallelFormGivesTheWalksBits) {
  // The tiny fixtures' heads, the widest key head built, a two-tap conv, and a conv of one tap (no window).
  const Shape shapes[] = {{2, 32, 4, 32, 4}, {1, 256, 2, 64, 3}, {2, 64, 4, 64, 2}, {1, 32, 2, 32, 1}};
  // Runs of 37, 1, 0, 2 and 9 tokens in slots 3, 0, 1, 5, 2 (2 < Kc − 1 = 3 for the first shape).
  const std::vector<int32_t> start = {0, 37, 38, 38, 40, 49}, slot = {3, 0, 1, 5, 2};
  const int slots = 6;
  uint64_t seed = 1;
  for (const Shape& s : shapes)
    for (bool update : {true, false}) {
      const int C = 2 * s.nk * s.dk + s.nv * s.dv, ld = C + s.nv * s.dv + 2 * s.nv;
      const std::vector<float> x = rand_f32(static_cast<size_t>(start.back()) * ld, seed);
      const std::vector<float> window = rand_f32(static_cast<size_t>(slots) * C * (s.Kc - 1), seed + 1);
      const std::vector<float> S = rand_f32(static_cast<size_t>(slots) * s.nv * s.dk * s.dv, seed + 2, 0.1f);
      const Result walk = run_form(s, slots, x, start, slot, window, S, ops::GdnForm::walk, update, seed + 3);
      const Result par = run_form(s, slots, x, start, slot, window, S, ops::GdnForm::parallel, update, seed + 3);
      const std::string at = "dk " + std::to_string(s.dk) + " Kc " + std::to_string(s.Kc) +
                             (update ? " update" : " no update");
      EXPECT_TRUE(same_bits(walk.conv_out, par.conv_out)) << "conv out, " << at;
      EXPECT_TRUE(same_bits(walk.window, par.window)) << "windows, " << at;
      EXPECT_TRUE(same_bits(walk.o, par.o)) << "o, " << at;
      EXPECT_EQ(walk.hi, par.hi) << at;
      EXPECT_EQ(walk.lo, par.lo) << at;
      EXPECT_TRUE(same_bits(walk.S, par.S)) << "S, " << at;
      if (!update) EXPECT_TRUE(same_bits(par.window, window) && same_bits(par.S, S)) << "states moved, " << at;
      seed += 10;
    }
}

TEST(GdnForms, AutomaticTakesTheParallelFormOnlyForRunsOfManyTokensItMayConsume) {
  ops::GdnConvArgs c;
  c.runs.runs = 3, c.tokens = 3;
  EXPECT_FALSE(ops::gdn_conv_parallel(c));  // decode: one token per run
  c.tokens = 4;
  EXPECT_TRUE(ops::gdn_conv_parallel(c));
  c.form = ops::GdnForm::walk;
  EXPECT_FALSE(ops::gdn_conv_parallel(c));
  ops::GdnRecurrenceArgs r;
  r.runs.runs = 1, r.tokens = 50;
  EXPECT_FALSE(ops::gdn_recurrence_parallel(r));  // may not overwrite its inputs
  r.consume_inputs = true;
  EXPECT_TRUE(ops::gdn_recurrence_parallel(r));
  r.consume_inputs = false, r.form = ops::GdnForm::parallel;
  EXPECT_ERROR_CONTAINING(ops::gdn_recurrence_parallel(r), "consume_inputs");
  r.consume_inputs = true, r.tokens = 0;
  EXPECT_ERROR_CONTAINING(ops::gdn_recurrence_parallel(r), "token count");
}

TEST(GdnForms, AWrongTokenCountIsAnError) {
  const Shape s{1, 32, 2, 32, 2};
  const int C = 2 * s.dk + s.nv * s.dv, ld = C + s.nv * s.dv + 2 * s.nv;
  const std::vector<int32_t> start = {0, 5}, slot = {0};
  std::vector<float> x = rand_f32(5 * static_cast<size_t>(ld), 1), w(C * 2, 0.1f), win(C, 0.0f), out(5 * C);
  ops::GdnConvArgs c{.x = x.data(), .ldx = ld, .w = w.data(), .window = win.data(), .out = out.data(),
                     .runs = {start.data(), slot.data(), 1, 1}, .C = C, .Kc = 2,
                     .form = ops::GdnForm::parallel, .tokens = 6};
  EXPECT_ERROR_CONTAINING(ops::gdn_conv_ref(c), "tokens 6 but the runs cover 5");
}

}  // namespace
