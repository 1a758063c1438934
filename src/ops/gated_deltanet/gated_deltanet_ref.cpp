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

}  // namespace

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
  check_runs_host(a.runs, "gdn_conv");
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

void gdn_recurrence_ref(const GdnRecurrenceArgs& a) {
  gdn_recurrence_check(a);
  check_runs_host(a.runs, "gdn_recurrence");
  const int dk = a.dk, dv = a.dv, nv = a.nv, G = dk / 32, r_heads = nv / a.nk;
  const int64_t Kd = static_cast<int64_t>(a.nk) * dk, ld = 2 * Kd + static_cast<int64_t>(nv) * dv, Vd = int64_t{nv} * dv;
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
        const double ss = lane_butterfly_sum_sq<double>(o.data(), dv);
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dv) + a.eps));
        for (int j = 0; j < dv; ++j) {
          const float y = a.norm[j] * (o[j] * inv) * silu(a.z[t * a.ldz + static_cast<int64_t>(h) * dv + j]);
          const int64_t at = t * Vd + static_cast<int64_t>(h) * dv + j;
          if (a.out) a.out[at] = y;
          if (a.out_hi) {
            const uint16_t hi = f32_to_bf16(y);
            a.out_hi[at] = hi;
            if (a.out_lo) a.out_lo[at] = f32_to_bf16(y - bf16_to_f32(hi));
          }
        }
      }
      if (a.update_state) std::copy(S_run.begin(), S_run.end(), S_slot);
    }
  }
}

}  // namespace moesq::ops
