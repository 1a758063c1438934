// GPU tests of the Gated DeltaNet ops (src/ops/gated_deltanet) against their CPU twins on fresh random
// inputs with fixed seeds: gdn_conv and gdn_recurrence over calls of several runs (uneven lengths,
// slots out of order, an empty run) continuing each slot's state, within ops::kGdnTolerance (expf /
// log1pf vs std::exp / std::log1p; the sums are in the same order) — and BITWISE against itself: a
// run of T tokens gives the bits of T one-token calls (prefill = decode), beside other runs or alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda/dev_buf.cuh"
#include "core/half.h"
#include "ops/gated_deltanet/gated_deltanet.h"
#include "support/float_vectors.h"
#include "support/gpu_test_main.h"

using moesq::DevBuf;
using moesq::test::rand_f32;
using moesq::test::same_bits;
namespace ops = moesq::ops;

namespace {

// max |a − b| / max |b| (b: the twin).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::abs(static_cast<double>(b[i])));
  }
  return m > 0 ? d / m : d;
}

struct Shape {
  int nk, dk, nv, dv, Kc;
};
// Qwen3-Next / Qwen3.5's linear attention (16 key heads of 128, 32 value heads of 128, conv 4), the
// tiny fixtures', and the widest key head built with the widest value head it allows.
const Shape kShapes[] = {{16, 128, 32, 128, 4}, {2, 32, 4, 32, 4}, {1, 256, 2, 64, 3}};

// One layer's device state and the twin's host copy, stepped through the same calls.
struct Layer {
  Shape s;
  int slots;
  int C() const { return 2 * s.nk * s.dk + s.nv * s.dv; }
  int Vd() const { return s.nv * s.dv; }
  int ld() const { return C() + Vd() + 2 * s.nv; }
  std::vector<float> w, A_log, dt_bias, norm, window, S;
  DevBuf<float> d_w, d_A_log, d_dt_bias, d_norm, d_window, d_S;
  Layer(const Shape& sh, int n_slots, uint64_t seed) : s(sh), slots(n_slots) {
    w = rand_f32(static_cast<size_t>(C()) * s.Kc, seed, 0.5f);
    A_log = rand_f32(s.nv, seed + 1, 0.5f), dt_bias = rand_f32(s.nv, seed + 2, 0.5f);
    norm = rand_f32(s.dv, seed + 3, 0.3f);
    for (float& v : norm) v += 1.0f;
    window = rand_f32(static_cast<size_t>(slots) * C() * (s.Kc - 1), seed + 4);  // slots mid-sequence
    S = rand_f32(static_cast<size_t>(slots) * s.nv * s.dk * s.dv, seed + 5, 0.1f);
    d_w.upload(w), d_A_log.upload(A_log), d_dt_bias.upload(dt_bias), d_norm.upload(norm);
    if (!window.empty()) d_window.upload(window);
    d_S.upload(S);
  }
  struct Out {
    std::vector<float> qkv, o, o_hi_lo;
  };
  // One call on both sides: x [T, ld] projections; returns the GPU's and the twin's outputs.
  // form: both sides take it (the parallel form consumes qkv, a and b: the outputs kept are the conv's
  // before the recurrence runs).
  std::pair<Out, Out> call(const std::vector<float>& x, const std::vector<int32_t>& start,
                           const std::vector<int32_t>& slot, bool update_state = true,
                           ops::GdnForm form = ops::GdnForm::walk) {
    const int64_t T = start.back();
    const int runs_n = static_cast<int>(slot.size());
    Out host, dev;
    host.qkv.assign(static_cast<size_t>(T * C()), 0.0f);
    host.o.assign(static_cast<size_t>(T * Vd()), 0.0f);
    std::vector<uint16_t> hi(static_cast<size_t>(T * Vd())), lo(hi.size());
    const ops::GdnRuns hr{start.data(), slot.data(), runs_n, slots};
    std::vector<float> xh = x;  // the parallel form writes α, β over a, b
    ops::GdnConvArgs c{.x = xh.data(), .ldx = ld(), .w = w.data(), .window = window.data(), .out = host.qkv.data(),
                       .runs = hr, .C = C(), .Kc = s.Kc, .update_state = update_state, .form = form, .tokens = T};
    ops::gdn_conv_ref(c);
    std::vector<float> qkv_h = host.qkv;
    ops::GdnRecurrenceArgs r;
    r.form = form, r.tokens = T, r.consume_inputs = form != ops::GdnForm::walk;
    r.qkv = qkv_h.data(), r.z = xh.data() + C(), r.b = xh.data() + C() + Vd(), r.a = xh.data() + C() + Vd() + s.nv;
    r.ldz = ld(), r.A_log = A_log.data(), r.dt_bias = dt_bias.data(), r.norm = norm.data(), r.S = S.data();
    r.out = host.o.data(), r.out_hi = hi.data(), r.out_lo = lo.data(), r.runs = hr;
    r.nk = s.nk, r.dk = s.dk, r.nv = s.nv, r.dv = s.dv, r.update_state = update_state;
    ops::gdn_recurrence_ref(r);
    for (size_t i = 0; i < hi.size(); ++i)
      host.o_hi_lo.push_back(moesq::bf16_to_f32(hi[i]) + moesq::bf16_to_f32(lo[i]));

    DevBuf<float> d_x(x), d_qkv(std::max<size_t>(host.qkv.size(), 1)), d_o(std::max<size_t>(host.o.size(), 1));
    DevBuf<uint16_t> d_hi(std::max<size_t>(hi.size(), 1)), d_lo(std::max<size_t>(hi.size(), 1));
    DevBuf<int32_t> d_start(start), d_slot(std::max<size_t>(slot.size(), 1));
    if (!slot.empty()) d_slot.upload(slot);
    const ops::GdnRuns dr{d_start.p, d_slot.p, runs_n, slots};
    c.x = d_x.p, c.w = d_w.p, c.window = d_window.p, c.out = d_qkv.p, c.runs = dr;
    ops::gdn_conv(c, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dev.qkv = d_qkv.download();
    dev.qkv.resize(host.qkv.size());
    r.qkv = d_qkv.p, r.z = d_x.p + C(), r.b = d_x.p + C() + Vd(), r.a = d_x.p + C() + Vd() + s.nv;
    r.A_log = d_A_log.p, r.dt_bias = d_dt_bias.p, r.norm = d_norm.p, r.S = d_S.p;
    r.out = d_o.p, r.out_hi = d_hi.p, r.out_lo = d_lo.p, r.runs = dr;
    ops::gdn_recurrence(r, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dev.o = d_o.download();
    dev.o.resize(host.o.size());
    const std::vector<uint16_t> gh = d_hi.download(), gl = d_lo.download();
    for (size_t i = 0; i < hi.size(); ++i) dev.o_hi_lo.push_back(moesq::bf16_to_f32(gh[i]) + moesq::bf16_to_f32(gl[i]));
    return {dev, host};
  }
};

TEST(GdnOpsGpu, KernelsMatchTheTwinsOverCallsOfSeveralRuns) {
  for (const Shape& sh : kShapes) {
    Layer L(sh, 6, 100 + sh.dk);
    // Call 1: runs of 37, 1, 0 and 100 tokens in slots 3, 0, 1, 5; call 2: one token for each of
    // slots 5, 3, 0 (decode order differs from the prefill's).
    const std::vector<std::vector<int32_t>> starts = {{0, 37, 38, 38, 138}, {0, 1, 2, 3}};
    const std::vector<std::vector<int32_t>> slots = {{3, 0, 1, 5}, {5, 3, 0}};
    for (size_t k = 0; k < starts.size(); ++k) {
      const std::vector<float> x = rand_f32(static_cast<size_t>(starts[k].back()) * L.ld(), 7 + k);
      const auto [dev, host] = L.call(x, starts[k], slots[k]);
      EXPECT_LE(rel_diff(dev.qkv, host.qkv), ops::kGdnTolerance) << "conv, dk " << sh.dk << " call " << k;
      EXPECT_LE(rel_diff(dev.o, host.o), ops::kGdnTolerance) << "recurrence, dk " << sh.dk << " call " << k;
      EXPECT_LE(rel_diff(dev.o_hi_lo, host.o_hi_lo), ops::kGdnTolerance) << "hi + lo, dk " << sh.dk << " call " << k;
      EXPECT_LE(rel_diff(L.d_S.download(), L.S), ops::kGdnTolerance) << "S, dk " << sh.dk << " call " << k;
      if (!L.window.empty())
        EXPECT_LE(rel_diff(L.d_window.download(), L.window), ops::kGdnTolerance) << "window, call " << k;
    }
  }
}

// The parallel form (prefill) against the walk (decode) on the same inputs: every output and state
// BITWISE, and the parallel form against its twin within the tolerance.
TEST(GdnOpsGpu, TheParallelFormGivesTheWalksBits) {
  for (const Shape& sh : kShapes)
    for (bool update : {true, false}) {
      Layer walk(sh, 6, 300 + sh.dk), par(sh, 6, 300 + sh.dk);
      // Runs of 37, 1, 0, 2 and 100 tokens in slots 3, 0, 1, 5, 2 (2 < Kc − 1 = 3 for Kc 4).
      const std::vector<int32_t> start = {0, 37, 38, 38, 40, 140}, slot = {3, 0, 1, 5, 2};
      const std::vector<float> x = rand_f32(static_cast<size_t>(start.back()) * walk.ld(), 21);
      const auto [dw, hw] = walk.call(x, start, slot, update, ops::GdnForm::walk);
      const auto [dp, hp] = par.call(x, start, slot, update, ops::GdnForm::parallel);
      const std::string at = "dk " + std::to_string(sh.dk) + (update ? " update" : " no update");
      EXPECT_TRUE(same_bits(dw.qkv, dp.qkv)) << "conv, " << at;
      EXPECT_TRUE(same_bits(dw.o, dp.o)) << "o, " << at;
      EXPECT_TRUE(same_bits(dw.o_hi_lo, dp.o_hi_lo)) << "hi + lo, " << at;
      EXPECT_TRUE(same_bits(walk.d_S.download(), par.d_S.download())) << "S, " << at;
      if (!walk.window.empty())
        EXPECT_TRUE(same_bits(walk.d_window.download(), par.d_window.download())) << "window, " << at;
      EXPECT_LE(rel_diff(dp.o, hp.o), ops::kGdnTolerance) << "parallel vs its twin, " << at;
      EXPECT_LE(rel_diff(par.d_S.download(), par.S), ops::kGdnTolerance) << "S vs twin, " << at;
    }
}

TEST(GdnOpsGpu, ARunGivesTheBitsOfItsTokensOneByOne) {
  const Shape sh = kShapes[0];
  Layer whole(sh, 2, 9), steps(sh, 2, 9);
  const int T = 17;
  const std::vector<float> x = rand_f32(static_cast<size_t>(T) * whole.ld(), 11);
  // The whole run in slot 1 beside a 5-token run in slot 0; the steps alone, one token per call.
  std::vector<float> x2 = rand_f32(5 * static_cast<size_t>(whole.ld()), 12);
  x2.insert(x2.end(), x.begin(), x.end());
  const auto [run, ignored] = whole.call(x2, {0, 5, 5 + T}, {0, 1});
  const size_t row = whole.Vd();
  for (int t = 0; t < T; ++t) {
    const std::vector<float> xt(x.begin() + static_cast<size_t>(t) * whole.ld(), x.begin() + (t + 1) * whole.ld());
    const auto [step, ignored2] = steps.call(xt, {0, 1}, {1});
    ASSERT_EQ(0, std::memcmp(step.o.data(), run.o.data() + (5 + t) * row, sizeof(float) * row)) << "token " << t;
  }
  const std::vector<float> sw = whole.d_S.download(), ss = steps.d_S.download();
  const size_t per_slot = sw.size() / 2;
  EXPECT_EQ(0, std::memcmp(sw.data() + per_slot, ss.data() + per_slot, sizeof(float) * per_slot));
}

// update_state = false (the engine's eager decode step before a graph capture): the outputs are the
// bits of the updating call, and the device states stay as they were, bit for bit.
TEST(GdnOpsGpu, WithoutStateUpdateTheOutputsAreTheSameAndTheStatesStay) {
  const Shape sh = kShapes[1];
  Layer kept(sh, 3, 21), moved(sh, 3, 21);
  const std::vector<float> window0 = kept.d_window.download(), S0 = kept.d_S.download();
  const std::vector<float> x = rand_f32(3 * static_cast<size_t>(kept.ld()), 22);
  const auto [k, kh] = kept.call(x, {0, 1, 2, 3}, {2, 0, 1}, /*update_state=*/false);
  const auto [m, mh] = moved.call(x, {0, 1, 2, 3}, {2, 0, 1});
  ASSERT_EQ(0, std::memcmp(k.o.data(), m.o.data(), sizeof(float) * k.o.size()));
  const std::vector<float> window1 = kept.d_window.download(), S1 = kept.d_S.download();
  EXPECT_EQ(0, std::memcmp(window1.data(), window0.data(), sizeof(float) * window0.size()));
  EXPECT_EQ(0, std::memcmp(S1.data(), S0.data(), sizeof(float) * S0.size()));
  EXPECT_NE(0, std::memcmp(moved.d_S.download().data(), S0.data(), sizeof(float) * S0.size()));
  EXPECT_EQ(kh.o, mh.o);  // the twins agree with each other as well
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
