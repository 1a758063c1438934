// CPU twins of ops::gdn_conv and ops::gdn_recurrence (gated_deltanet.h) in the kernels' orders, and the
// checks both sides share.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/gated_deltanet/gated_deltanet.h"

namespace moesq::ops {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch: β 1, threshold 20

// Σ v[i]² the kernels' way: lane l sums i ≡ l (mod 32) ascending, then the butterfly 1, 2, 4, 8, 16.
template <typename Acc>
Acc lane_butterfly_sum_sq(const float* v, int n) {
  std::array<Acc, 32> s{};
  for (int l = 0; l < 32; ++l)
    for (int i = l; i < n; i += 32) s[l] = std::fma(static_cast<Acc>(v[i]), static_cast<Acc>(v[i]), s[l]);
  for (int h = 1; h < 32; h *= 2) {
    std::array<Acc, 32> t{};
    for (int l = 0; l < 32; ++l) t[l] = s[l] + s[l ^ h];
    s = t;
  }
  return s[0];
}

void check_runs(const GdnRuns& r, const char* op) {
  MOESQ_CHECK(r.runs >= 0 && r.slots >= 0, op, ": bad run count ", r.runs, " / slots ", r.slots);
  MOESQ_CHECK(r.runs == 0 || (r.run_start && r.run_slot), op, ": run_start and run_slot are required");
}

// The host-side run checks (the launchers cannot read device arrays): ascending starts from 0, slots
// in range and distinct.
int64_t check_runs_host(const GdnRuns& r, const char* op) {
  if (r.runs == 0) return 0;
  MOESQ_CHECK(r.run_start[0] == 0, op, ": run_start[0] = ", r.run_start[0], ", not 0");
  std::vector<char> seen(static_cast<size_t>(r.slots), 0);
  for (int i = 0; i < r.runs; ++i) {
    MOESQ_CHECK(r.run_start[i + 1] >= r.run_start[i], op, ": run ", i, " ends before it starts");
    const int s = r.run_slot[i];
    MOESQ_CHECK(s >= 0 && s < r.slots, op, ": run ", i, " slot ", s, " outside [0, ", r.slots, ")");
    MOESQ_CHECK(!seen[static_cast<size_t>(s)], op, ": slot ", s, " has two runs in one call");
    seen[static_cast<size_t>(s)] = 1;
  }
  return r.run_start[r.runs];
}

// The run of each of the call's T tokens.
std::vector<int> run_of_tokens(const GdnRuns& r, int64_t T) {
  std::vector<int> run(static_cast<size_t>(T), 0);
  for (int i = 0; i < r.runs; ++i)
    for (int64_t t = r.run_start[i]; t < r.run_start[i + 1]; ++t) run[static_cast<size_t>(t)] = i;
  return run;
}

// The input u positions before token t (u = t − (Kc−1) + j) of a run starting at t0: the run's own input, or
// before the run the slot's window (oldest first, Kc−1 values).
float conv_input(const GdnConvArgs& a, const float* window, int64_t u, int64_t t0, int c) {
  return u >= t0 ? a.x[u * a.ldx + c] : window[a.Kc - 1 + (u - t0)];
}

// gdn_conv's parallel form: every token's conv alone, then the windows moved on.
void conv_parallel_ref(const GdnConvArgs& a, int64_t T) {
  const int C = a.C, Kc = a.Kc;
  const std::vector<int> run = run_of_tokens(a.runs, T);
  auto window_of = [&](int r, int c) {
    return Kc > 1 ? a.window + (static_cast<int64_t>(a.runs.run_slot[r]) * C + c) * (Kc - 1) : nullptr;
  };
  for (int64_t t = 0; t < T; ++t) {
    const int r = run[static_cast<size_t>(t)];
    const int64_t t0 = a.runs.run_start[r];
    for (int c = 0; c < C; ++c) {
      const float* w = a.w + static_cast<int64_t>(c) * Kc;
      float acc = 0.0f;
      for (int j = 0; j < Kc; ++j) acc = std::fma(w[j], conv_input(a, window_of(r, c), t - (Kc - 1) + j, t0, c), acc);
      a.out[t * C + c] = silu(acc);
    }
  }
  if (!a.update_state || Kc == 1) return;
  for (int r = 0; r < a.runs.runs; ++r) {
    const int64_t t0 = a.runs.run_start[r], t1 = a.runs.run_start[r + 1];
    for (int c = 0; c < C; ++c) {
      float* st = window_of(r, c);
      std::array<float, kGdnMaxConvKernel> next{};
      for (int j = 0; j < Kc - 1; ++j) next[j] = conv_input(a, st, t1 - (Kc - 1) + j, t0, c);
      for (int j = 0; j < Kc - 1; ++j) st[j] = next[j];
    }
  }
}

}  // namespace

bool gdn_conv_parallel(const GdnConvArgs& a) {
  if (a.form == GdnForm::walk) return false;
  if (a.form == GdnForm::parallel) {
    MOESQ_CHECK(a.tokens > 0 || a.runs.runs == 0, "gdn_conv: the parallel form needs the call's token count (tokens)");
    return true;
  }
  return a.tokens > a.runs.runs;
}

bool gdn_recurrence_parallel(const GdnRecurrenceArgs& a) {
  if (a.form == GdnForm::walk) return false;
  if (a.form == GdnForm::parallel) {
    MOESQ_CHECK(a.tokens > 0 || a.runs.runs == 0,
                "gdn_recurrence: the parallel form needs the call's token count (tokens)");
    MOESQ_CHECK(a.consume_inputs, "gdn_recurrence: the parallel form overwrites q, k, v, a and b: set consume_inputs");
    return true;
  }
  return a.consume_inputs && a.tokens > a.runs.runs;
}

void gdn_conv_check(const GdnConvArgs& a) {
  check_runs(a.runs, "gdn_conv");
  MOESQ_CHECK(a.C > 0 && a.Kc >= 1 && a.Kc <= kGdnMaxConvKernel, "gdn_conv: C = ", a.C, ", conv kernel ", a.Kc,
              " (1..", kGdnMaxConvKernel, " built)");
  MOESQ_CHECK(a.ldx >= a.C, "gdn_conv: ldx ", a.ldx, " < C ", a.C);
  MOESQ_CHECK(a.runs.runs == 0 || (a.x && a.w && a.out && (a.Kc == 1 || a.window)),
              "gdn_conv: x, w, out and window are required");
}

void gdn_recurrence_check(const GdnRecurrenceArgs& a) {
  check_runs(a.runs, "gdn_recurrence");
  MOESQ_CHECK(a.dk == 32 || a.dk == 64 || a.dk == 128 || a.dk == 256, "gdn_recurrence: key head dim ", a.dk,
              " (32, 64, 128 or 256 built)");
  MOESQ_CHECK(a.dv > 0 && a.dv % 32 == 0 && a.dv * (a.dk / 32) <= 512, "gdn_recurrence: value head dim ", a.dv,
              " (a multiple of 32) with key head dim ", a.dk, " needs dv · dk/32 ≤ 512 threads");
  MOESQ_CHECK(a.nk > 0 && a.nv > 0 && a.nv % a.nk == 0, "gdn_recurrence: ", a.nv, " value heads are not a multiple of ",
              a.nk, " key heads");
  MOESQ_CHECK(a.ldz >= static_cast<int64_t>(a.nv) * a.dv, "gdn_recurrence: ldz ", a.ldz, " < nv·dv");
  MOESQ_CHECK(a.runs.runs == 0 || (a.qkv && a.z && a.b && a.a && a.A_log && a.dt_bias && a.norm && a.S &&
                                   (a.out || a.out_hi)),
              "gdn_recurrence: qkv, z, b, a, A_log, dt_bias, norm, S and an output are required");
  MOESQ_CHECK(!a.out_lo || a.out_hi, "gdn_recurrence: out_lo without out_hi");
}

void gdn_conv_ref(const GdnConvArgs& a) {
  gdn_conv_check(a);
  const int64_t T = check_runs_host(a.runs, "gdn_conv");
  if (gdn_conv_parallel(a)) {
    MOESQ_CHECK(a.tokens == T, "gdn_conv: tokens ", a.tokens, " but the runs cover ", T);
    return conv_parallel_ref(a, T);
  }
  const int C = a.C, Kc = a.Kc;
  for (int r = 0; r < a.runs.runs; ++r) {
    const int64_t t0 = a.runs.run_start[r], t1 = a.runs.run_start[r + 1];
    for (int c = 0; c < C; ++c) {
      float* st = Kc > 1 ? a.window + (static_cast<int64_t>(a.runs.run_slot[r]) * C + c) * (Kc - 1) : nullptr;
      std::array<float, kGdnMaxConvKernel> win{};  // win[Kc−1] is the current token
      for (int j = 0; j < Kc - 1; ++j) win[j] = st[j];
      const float* w = a.w + static_cast<int64_t>(c) * Kc;
      for (int64_t t = t0; t < t1; ++t) {
        win[Kc - 1] = a.x[t * a.ldx + c];
        float acc = 0.0f;
        for (int j = 0; j < Kc; ++j) acc = std::fma(w[j], win[j], acc);
        a.out[t * C + c] = silu(acc);
        for (int j = 0; j + 1 < Kc; ++j) win[j] = win[j + 1];
      }
      if (a.update_state)
        for (int j = 0; j < Kc - 1; ++j) st[j] = win[j];
    }
  }
}

namespace {

// The two per-token steps the walk does before and after S's update, as the parallel form runs them for
// every token at once: q̂, k̂ (L2-normalised, q̂ · dk^-½) written over q, k of each key head, α, β over a, b.
void recurrence_prep_ref(const GdnRecurrenceArgs& a, int64_t T) {
  const int dk = a.dk, nv = a.nv;
  const int64_t Kd = static_cast<int64_t>(a.nk) * dk, ld = 2 * Kd + static_cast<int64_t>(nv) * a.dv;
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  float* qkv = const_cast<float*>(a.qkv);  // consume_inputs
  float* av = const_cast<float*>(a.a);
  float* bv = const_cast<float*>(a.b);
  for (int64_t t = 0; t < T; ++t) {
    for (int kh = 0; kh < a.nk; ++kh) {
      float* q = qkv + t * ld + kh * dk;
      float* k = q + Kd;
      const float iq = 1.0f / std::sqrt(lane_butterfly_sum_sq<float>(q, dk) + 1e-6f);
      const float ik = 1.0f / std::sqrt(lane_butterfly_sum_sq<float>(k, dk) + 1e-6f);
      for (int i = 0; i < dk; ++i) q[i] = (q[i] * iq) * qscale, k[i] = k[i] * ik;
    }
    for (int h = 0; h < nv; ++h) {
      const float A = std::exp(a.A_log[h]);
      float& alpha = av[t * a.ldz + h];
      float& beta = bv[t * a.ldz + h];
      alpha = std::exp(-A * softplus(alpha + a.dt_bias[h]));
      beta = 1.0f / (1.0f + std::exp(-beta));
    }
  }
}

// The gated RMSNorm of o [dv] (token t, value head h) into the outputs: y = norm ⊙ o / rms(o) ⊙ SiLU(z).
void gated_norm_ref(const GdnRecurrenceArgs& a, const float* o, int64_t t, int h) {
  const int dv = a.dv;
  const double ss = lane_butterfly_sum_sq<double>(o, dv);
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dv) + a.eps));
  for (int j = 0; j < dv; ++j) {
    const float y = a.norm[j] * (o[j] * inv) * silu(a.z[t * a.ldz + static_cast<int64_t>(h) * dv + j]);
    const int64_t at = (t * a.nv + h) * dv + j;
    if (a.out) a.out[at] = y;
    if (a.out_hi) {
      const uint16_t hi = f32_to_bf16(y);
      a.out_hi[at] = hi;
      if (a.out_lo) a.out_lo[at] = f32_to_bf16(y - bf16_to_f32(hi));
    }
  }
}

// The gated RMSNorm of every token's raw o (written over v).
void recurrence_norm_ref(const GdnRecurrenceArgs& a, int64_t T) {
  const int64_t Kd = static_cast<int64_t>(a.nk) * a.dk, ld = 2 * Kd + static_cast<int64_t>(a.nv) * a.dv;
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < a.nv; ++h) gated_norm_ref(a, a.qkv + t * ld + 2 * Kd + static_cast<int64_t>(h) * a.dv, t, h);
}

// gdn_recurrence's parallel form: prep, then each column of each (run, value head)'s S walked alone
// (its raw o written over v), then the norm.
void recurrence_parallel_ref(const GdnRecurrenceArgs& a, int64_t T) {
  recurrence_prep_ref(a, T);
  const int dk = a.dk, dv = a.dv, nv = a.nv, G = dk / 32, r_heads = nv / a.nk;
  const int64_t Kd = static_cast<int64_t>(a.nk) * dk, ld = 2 * Kd + static_cast<int64_t>(nv) * dv;
  float* qkv = const_cast<float*>(a.qkv);
  std::vector<float> s(dk), part(G);
  for (int r = 0; r < a.runs.runs; ++r)
    for (int h = 0; h < nv; ++h) {
      float* S = a.S + (static_cast<int64_t>(a.runs.run_slot[r]) * nv + h) * dk * dv;
      const int kh = h / r_heads;
      for (int j = 0; j < dv; ++j) {
        for (int i = 0; i < dk; ++i) s[i] = S[i * dv + j];
        for (int64_t t = a.runs.run_start[r]; t < a.runs.run_start[r + 1]; ++t) {
          float* row = qkv + t * ld;
          const float* q = row + kh * dk;
          const float* k = q + Kd;
          const float alpha = a.a[t * a.ldz + h], beta = a.b[t * a.ldz + h];
          for (int g = 0; g < G; ++g) {
            float p = 0.0f;
            for (int i = 32 * g; i < 32 * g + 32; ++i) s[i] *= alpha, p = std::fma(s[i], k[i], p);
            part[g] = p;
          }
          float mem = part[0];
          for (int g = 1; g < G; ++g) mem += part[g];
          float& v = row[2 * Kd + static_cast<int64_t>(h) * dv + j];
          const float delta = (v - mem) * beta;
          for (int g = 0; g < G; ++g) {
            float p = 0.0f;
            for (int i = 32 * g; i < 32 * g + 32; ++i) s[i] = std::fma(k[i], delta, s[i]), p = std::fma(s[i], q[i], p);
            part[g] = p;
          }
          float o = part[0];
          for (int g = 1; g < G; ++g) o += part[g];
          v = o;  // the raw o of (t, h, j) over its v, which nothing reads again
        }
        if (a.update_state)
          for (int i = 0; i < dk; ++i) S[i * dv + j] = s[i];
      }
    }
  recurrence_norm_ref(a, T);
}

}  // namespace

void gdn_recurrence_ref(const GdnRecurrenceArgs& a) {
  gdn_recurrence_check(a);
  const int64_t T = check_runs_host(a.runs, "gdn_recurrence");
  if (gdn_recurrence_parallel(a)) {
    MOESQ_CHECK(a.tokens == T, "gdn_recurrence: tokens ", a.tokens, " but the runs cover ", T);
    return recurrence_parallel_ref(a, T);
  }
  const int dk = a.dk, dv = a.dv, nv = a.nv, G = dk / 32, r_heads = nv / a.nk;
  const int64_t Kd = static_cast<int64_t>(a.nk) * dk, ld = 2 * Kd + static_cast<int64_t>(nv) * dv;
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  std::vector<float> q(dk), k(dk), part(static_cast<size_t>(G) * dv), o(dv);
  for (int r = 0; r < a.runs.runs; ++r) {
    for (int h = 0; h < nv; ++h) {
      float* S_slot = a.S + (static_cast<int64_t>(a.runs.run_slot[r]) * nv + h) * dk * dv;  // [dk, dv]
      std::vector<float> S_run(S_slot, S_slot + static_cast<int64_t>(dk) * dv);  // the run's S, left if update_state
      float* S = S_run.data();
      const int kh = h / r_heads;
      const float A = std::exp(a.A_log[h]);
      for (int64_t t = a.runs.run_start[r]; t < a.runs.run_start[r + 1]; ++t) {
        const float* row = a.qkv + t * ld;
        for (int i = 0; i < dk; ++i) q[i] = row[kh * dk + i], k[i] = row[Kd + kh * dk + i];
        const float iq = 1.0f / std::sqrt(lane_butterfly_sum_sq<float>(q.data(), dk) + 1e-6f);
        const float ik = 1.0f / std::sqrt(lane_butterfly_sum_sq<float>(k.data(), dk) + 1e-6f);
        for (int i = 0; i < dk; ++i) q[i] = (q[i] * iq) * qscale, k[i] = k[i] * ik;
        const float alpha = std::exp(-A * softplus(a.a[t * a.ldz + h] + a.dt_bias[h]));
        const float beta = 1.0f / (1.0f + std::exp(-a.b[t * a.ldz + h]));
        const float* v = row + 2 * Kd + static_cast<int64_t>(h) * dv;
        // S ← αS and Sᵀk per 32-row group, the groups summed in order.
        for (int g = 0; g < G; ++g)
          for (int j = 0; j < dv; ++j) {
            float p = 0.0f;
            for (int i = 32 * g; i < 32 * g + 32; ++i) {
              S[i * dv + j] *= alpha;
              p = std::fma(S[i * dv + j], k[i], p);
            }
            part[g * dv + j] = p;
          }
        for (int j = 0; j < dv; ++j) {
          float mem = part[j];
          for (int g = 1; g < G; ++g) mem += part[g * dv + j];
          const float delta = (v[j] - mem) * beta;
          for (int g = 0; g < G; ++g) {
            float p = 0.0f;
            for (int i = 32 * g; i < 32 * g + 32; ++i) {
              S[i * dv + j] = std::fma(k[i], delta, S[i * dv + j]);
              p = std::fma(S[i * dv + j], q[i], p);
            }
            part[g * dv + j] = p;
          }
          o[j] = part[j];
          for (int g = 1; g < G; ++g) o[j] += part[g * dv + j];
        }
        gated_norm_ref(a, o.data(), t, h);
      }
      if (a.update_state) std::copy(S_run.begin(), S_run.end(), S_slot);
    }
  }
}

}  // namespace moesq::ops
