// The refinement loop of one expert (refine.h): data preparation (Q_a on the inputs once, g^p row
// weights, held-out split), the optimizer loop (batches, Gumbel noise, schedules, Lion), the
// per-epoch curves and the final argmax + pack (Algorithm 1 lines 17–18).
// Non-obvious decision: the inputs are activation-quantized ONCE for all rows (Q_a of a row does
// not depend on the parameters) and every batch is gathered into contiguous buffers, so the
// per-step cost is the five GEMMs of refine_expert_grad.cpp plus O(weights) elementwise work.
#include "compress/refine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <type_traits>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "compress/refine_expert_grad.h"
#include "compress/refine_lion.h"
#include "compress/refine_support.h"
#include "core/error.h"

namespace moesq::compress {

using namespace refine;

namespace {

using Clock = std::chrono::steady_clock;

// Flush-to-zero + denormals-are-zero for the calling thread while an expert is refined (restored
// on exit): sharpened softmaxes and decaying Lion momenta otherwise drift into denormals, which
// cost ~100× per operation on x86. Values that small carry no information for this optimizer.
class DenormalGuard {
 public:
#if defined(__SSE__)
  DenormalGuard() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ | DAZ
  ~DenormalGuard() { _mm_setcsr(saved_); }
 private:
  unsigned saved_;
#endif
};
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

void validate(const RefineOptions& o) {
  MOESQ_CHECK(o.p >= 0, "refine: --objective weight power p=", o.p, " must be >= 0");
  MOESQ_CHECK(o.epochs >= 0, "refine: --epochs=", o.epochs, " must be >= 0");
  MOESQ_CHECK(o.batch > 0 && o.micro_batch > 0, "refine: batch=", o.batch, " and micro-batch=",
              o.micro_batch, " must be positive");
  MOESQ_CHECK(o.lr_A >= 0 && o.lr_V >= 0 && o.lr_final_frac >= 0, "refine: learning rates lr_A=",
              o.lr_A, " lr_V=", o.lr_V, " final fraction=", o.lr_final_frac, " must be >= 0");
  MOESQ_CHECK(o.tau0 > 0 && o.tau1 > 0, "refine: temperatures τ0=", o.tau0, " τ1=", o.tau1,
              " must be positive");
  MOESQ_CHECK(o.heldout_fraction >= 0 && o.heldout_fraction < 1,
              "refine: held-out fraction ", o.heldout_fraction, " must be in [0, 1)");
  MOESQ_CHECK(o.act_block > 0, "refine: activation block ", o.act_block, " must be positive");
  MOESQ_CHECK(o.min_rows >= 0, "refine: min_rows=", o.min_rows, " must be >= 0");
}

namespace {

// Rows `idx` of the prepared data, gathered contiguously.
struct Rows {
  std::vector<float> X, Y, w;  // [m, H], [m, H], [m]
  double inv_norm = 0.0;       // 1 / (Σ w · H); 0 when Σ w = 0
  int64_t m = 0;
};
void gather(const std::vector<float>& Xq, const float* Y_ref, const std::vector<float>& w,
            const int64_t* idx, int64_t m, int64_t H, Rows& out) {
  out.m = m;
  out.X.resize(m * H);
  out.Y.resize(m * H);
  out.w.resize(m);
  double sum_w = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = idx[i];
    std::copy_n(&Xq[r * H], H, &out.X[i * H]);
    std::copy_n(Y_ref + r * H, H, &out.Y[i * H]);
    out.w[i] = w[r];
    sum_w += w[r];
  }
  out.inv_norm = sum_w > 0 ? 1.0 / (sum_w * static_cast<double>(H)) : 0.0;
}

ObjectiveInput<float> input_of(const Rows& r, int64_t H, int64_t I, int act_block) {
  ObjectiveInput<float> in;
  in.m = r.m;
  in.H = H;
  in.I = I;
  in.X = r.X.data();
  in.Y_ref = r.Y.data();
  in.w = r.w.data();
  in.inv_norm = r.inv_norm;
  in.act_block = act_block;
  return in;
}

// Fisher–Yates with counter-based uniforms: a permutation of [0, n) from `key`.
std::vector<int64_t> permutation(int64_t n, uint64_t key) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng_uniform(key, static_cast<uint64_t>(i)) * (i + 1));
    std::swap(p[i], p[std::min(j, i)]);
  }
  return p;
}

// Packs the final (or initial) solution: patterns [R] per projection, values V; gate and up with the
// one shared γ of format::gate_up_tensor_scale over their latent V (the same rule as every other
// method), down with its own Eq. 5 γ over V.
void pack(const std::array<ProjState<float>, 3>& P, const std::array<std::vector<uint8_t>, 3>& pat,
          RefineResult& res) {
  const float g_gu = format::gate_up_tensor_scale(P[kGate].V.data(), P[kUp].V.data(), P[kGate].N * P[kGate].K);
  const float g_d = format::nvfp4_tensor_scale(format::amax_abs(P[kDown].V.data(), P[kDown].N * P[kDown].K));
  res.gate = format::sparse48_quantize(P[kGate].V.data(), P[kGate].N, P[kGate].K, pat[kGate].data(),
                                       g_gu, "refine gate_proj");
  res.up = format::sparse48_quantize(P[kUp].V.data(), P[kUp].N, P[kUp].K, pat[kUp].data(), g_gu,
                                     "refine up_proj");
  res.down = format::sparse48_quantize(P[kDown].V.data(), P[kDown].N, P[kDown].K, pat[kDown].data(),
                                       g_d, "refine down_proj");
}

double packed_loss(const format::Sparse48Tensor& g, const format::Sparse48Tensor& u,
                   const format::Sparse48Tensor& d, const Rows& rows, int64_t H, int64_t I,
                   const RefineOptions& o, ObjectiveWorkspace& ws) {
  std::vector<float> Wg(I * H), Wu(I * H), Wd(H * I);
  format::sparse48_dequantize(g, Wg.data());
  format::sparse48_dequantize(u, Wu.data());
  format::sparse48_dequantize(d, Wd.data());
  return expert_loss(input_of(rows, H, I, o.act_block), Wg.data(), Wu.data(), Wd.data(), true,
                     o.micro_batch, ws);
}

// Every option with its JSON key, once: both directions of the JSON mapping walk this list.
template <typename Fn>
void for_each_option(RefineOptions& o, Fn&& fn) {
  fn("p", o.p);
  fn("update_A", o.update_A);
  fn("epochs", o.epochs);
  fn("batch", o.batch);
  fn("micro_batch", o.micro_batch);
  fn("lr_A", o.lr_A);
  fn("lr_V", o.lr_V);
  fn("beta1", o.beta1);
  fn("beta2", o.beta2);
  fn("weight_decay", o.weight_decay);
  fn("lr_final_frac", o.lr_final_frac);
  fn("tau0", o.tau0);
  fn("tau1", o.tau1);
  fn("kappa0", o.kappa0);
  fn("kappa1", o.kappa1);
  fn("sigma", o.sigma);
  fn("s", o.s);
  fn("heldout_fraction", o.heldout_fraction);
  fn("seed", o.seed);
  fn("act_block", o.act_block);
  fn("keep_init_if_worse", o.keep_init_if_worse);
  fn("min_rows", o.min_rows);
}

}  // namespace

RefineOptions refine_options_from_json(const nlohmann::json& j) {
  MOESQ_CHECK(j.is_null() || j.is_object(), "refine options: expected a JSON object, got ", j.dump());
  RefineOptions o;
  if (j.is_null()) return o;
  size_t known = 0;
  for_each_option(o, [&](const char* key, auto& field) {
    if (!j.contains(key)) return;
    ++known;
    try {
      field = j.at(key).get<std::remove_reference_t<decltype(field)>>();
    } catch (const nlohmann::json::exception& e) {
      MOESQ_FAIL("refine options: key '", key, "' has a wrong value ", j.at(key).dump(), " (",
                 e.what(), ")");
    }
  });
  if (known != j.size()) {
    RefineOptions probe;
    for (const auto& [key, value] : j.items()) {
      bool found = false;
      for_each_option(probe, [&](const char* k, auto&) { found = found || key == k; });
      MOESQ_CHECK(found, "refine options: unknown key '", key, "'");
    }
  }
  return o;
}

nlohmann::json refine_options_to_json(const RefineOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  RefineOptions copy = o;
  for_each_option(copy, [&](const char* key, auto& field) { j[key] = field; });
  return j;
}

RefineResult refine_expert(const ExpertData& data, const ProjInit& gate, const ProjInit& up,
                           const ProjInit& down, const RefineOptions& o) {
  const auto t_start = Clock::now();
  const DenormalGuard denormal_guard;
  validate(o);
  const int64_t n = data.n, H = data.H, I = data.I;
  MOESQ_CHECK(n >= 0 && H > 0 && I > 0, "refine: bad expert shape n=", n, " H=", H, " I=", I);
  MOESQ_CHECK(H % format::kSparseScaleBlock == 0 && I % format::kSparseScaleBlock == 0,
              "refine: H=", H, " and I=", I, " must be multiples of ", format::kSparseScaleBlock);
  const ProjInit* init[3] = {&gate, &up, &down};
  static const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
  const int64_t N_of[3] = {I, I, H}, K_of[3] = {H, H, I};
  std::array<ProjState<float>, 3> P;
  std::array<std::vector<uint8_t>, 3> prior;
  for (int j = 0; j < 3; ++j) {
    MOESQ_CHECK(init[j]->V0 && init[j]->prior, "refine: ", names[j], " has no initial V0/patterns");
    if (init[j]->packed)
      MOESQ_CHECK(init[j]->packed->N == N_of[j] && init[j]->packed->K == K_of[j], "refine: ",
                  names[j], " initial packed tensor is [", init[j]->packed->N, ", ",
                  init[j]->packed->K, "], expected [", N_of[j], ", ", K_of[j], "]");
    P[j].N = N_of[j];
    P[j].K = K_of[j];
    P[j].V.assign(init[j]->V0, init[j]->V0 + N_of[j] * K_of[j]);
    prior[j].assign(init[j]->prior, init[j]->prior + P[j].groups());
    for (uint8_t pid : prior[j])
      MOESQ_CHECK(pid < kNumPatterns, "refine: ", names[j], " prior pattern id ", int(pid),
                  " is not in [0, 6)");
  }
  const bool all_packed = gate.packed && up.packed && down.packed;
  RefineResult res;
  auto return_init = [&](const std::string& why) {
    if (all_packed) {
      res.gate = *gate.packed;
      res.up = *up.packed;
      res.down = *down.packed;
    } else {
      pack(P, prior, res);
    }
    res.note = why;
  };

  if (n == 0 || n < o.min_rows) {
    const std::string why = n == 0 ? std::string("no calibration rows")
                                   : detail::concat(n, " calibration rows < min_rows=", o.min_rows);
    return_init(why + (all_packed ? ": kept the SGPTQ solution" : ": initial solution re-packed"));
    res.skipped = true;
    res.seconds = seconds_since(t_start);
    return res;
  }
  MOESQ_CHECK(data.X && data.g && data.Y_ref, "refine: expert stream ", data.stream,
              " has n=", n, " rows but no X/g/Y_ref");

  // Q_a on the inputs, once; router-weighted row weights g^p (Eq. 4).
  std::vector<float> Xq(data.X, data.X + n * H);
  for (int64_t i = 0; i < n; ++i) format::quantize_activation_row(&Xq[i * H], H, o.act_block);
  std::vector<float> w(n);
  for (int64_t i = 0; i < n; ++i) {
    MOESQ_CHECK(std::isfinite(data.g[i]) && data.g[i] >= 0, "refine: router weight g[", i,
                "] = ", data.g[i], " of expert stream ", data.stream, " is not a finite value >= 0");
    w[i] = o.p == 0 ? 1.0f : static_cast<float>(std::pow(static_cast<double>(data.g[i]), o.p));
  }

  // Held-out split.
  const std::vector<int64_t> perm = permutation(n, rng_key(o.seed, data.stream, kRngSplit, 0, 0));
  int64_t n_held = static_cast<int64_t>(std::floor(o.heldout_fraction * static_cast<double>(n)));
  n_held = std::min(n_held, n - 1);
  const std::vector<int64_t> held(perm.begin(), perm.begin() + n_held);
  const std::vector<int64_t> train(perm.begin() + n_held, perm.end());
  res.train_rows = static_cast<int64_t>(train.size());
  res.heldout_rows = n_held;
  if (n_held == 0 && o.heldout_fraction > 0)
    res.note = "too few rows to hold out: curves on the training rows";
  Rows eval_rows;
  const std::vector<int64_t>& eval_idx = n_held > 0 ? held : train;
  gather(Xq, data.Y_ref, w, eval_idx.data(), static_cast<int64_t>(eval_idx.size()), H, eval_rows);

  // Parameters: A from the prior (Eq. 2 init of issue 3), V = V0; Lion momenta.
  std::array<const uint8_t*, 3> fixed{};
  for (int j = 0; j < 3; ++j) {
    if (o.update_A) {
      P[j].A.resize(P[j].groups() * kNumPatterns);
      prior_logits(prior[j].data(), P[j].groups(), o.sigma, o.s,
                   rng_key(o.seed, data.stream, kRngPriorInit, 0, j), P[j].A.data());
    } else {
      fixed[j] = prior[j].data();
    }
  }
  std::array<std::vector<float>, 3> mom_A, mom_V;
  for (int j = 0; j < 3; ++j) {
    mom_A[j].assign(P[j].A.size(), 0.0f);
    mom_V[j].assign(P[j].V.size(), 0.0f);
  }
  std::array<ProjState<float>, 3> grad;
  std::array<std::vector<float>, 3> G;
  ObjectiveWorkspace ws;
  const LionConfig lion{o.beta1, o.beta2, o.weight_decay};

  auto current_patterns = [&]() {
    std::array<std::vector<uint8_t>, 3> pat;
    for (int j = 0; j < 3; ++j) {
      if (!o.update_A) {
        pat[j] = prior[j];
        continue;
      }
      pat[j].resize(P[j].groups());
      hard_mask(P[j].A.data(), P[j].groups(), pat[j].data(), static_cast<float*>(nullptr));
    }
    return pat;
  };
  auto eval_loss = [&](bool hard, double kappa, double tau) {
    ObjectiveInput<float> in = input_of(eval_rows, H, I, o.act_block);
    in.kappa = kappa;
    in.tau = tau;
    std::array<std::vector<uint8_t>, 3> pat;
    if (hard) {
      pat = current_patterns();
      for (int j = 0; j < 3; ++j) in.fixed[j] = pat[j].data();
    } else {
      in.fixed = fixed;
    }
    return objective_grad(in, P, true, o.micro_batch, nullptr, ws);
  };

  if (all_packed) {
    res.init_hard_loss = packed_loss(*gate.packed, *up.packed, *down.packed, eval_rows, H, I, o, ws);
  } else {
    res.init_hard_loss = eval_loss(true, o.kappa0, o.tau0);
  }

  // Optimizer loop.
  const int64_t n_train = static_cast<int64_t>(train.size());
  const int64_t steps_per_epoch = (n_train + o.batch - 1) / o.batch;
  const int64_t num_steps = steps_per_epoch * o.epochs;
  Rows batch;
  int64_t t = 0;
  double kappa = o.kappa0, tau = o.tau0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto t_epoch = Clock::now();
    const std::vector<int64_t> order =
        permutation(n_train, rng_key(o.seed, data.stream, kRngShuffle, epoch, 0));
    std::vector<int64_t> idx(n_train);
    for (int64_t i = 0; i < n_train; ++i) idx[i] = train[order[i]];
    for (int64_t b0 = 0; b0 < n_train; b0 += o.batch, ++t) {
      gather(Xq, data.Y_ref, w, &idx[b0], std::min(o.batch, n_train - b0), H, batch);
      kappa = linear_schedule(o.kappa0, o.kappa1, t, num_steps);
      tau = linear_schedule(o.tau0, o.tau1, t, num_steps);
      ObjectiveInput<float> in = input_of(batch, H, I, o.act_block);
      in.kappa = kappa;
      in.tau = tau;
      in.fixed = fixed;
      for (int j = 0; j < 3; ++j) {
        if (fixed[j]) continue;
        G[j].resize(P[j].A.size());
        gumbel_noise(P[j].groups(), rng_key(o.seed, data.stream, kRngGumbel, t, j), G[j].data());
        in.G[j] = G[j].data();
      }
      objective_grad(in, P, true, o.micro_batch, &grad, ws);
      const double lr_A = cosine_lr(o.lr_A, o.lr_final_frac, t, num_steps);
      const double lr_V = cosine_lr(o.lr_V, o.lr_final_frac, t, num_steps);
      for (int j = 0; j < 3; ++j) {
        if (!fixed[j])
          lion_step(P[j].A.data(), mom_A[j].data(), grad[j].A.data(),
                    static_cast<int64_t>(P[j].A.size()), lr_A, lion);
        lion_step(P[j].V.data(), mom_V[j].data(), grad[j].V.data(),
                  static_cast<int64_t>(P[j].V.size()), lr_V, lion);
      }
    }
    res.curves.epoch_seconds.push_back(seconds_since(t_epoch));
    res.curves.soft_loss.push_back(eval_loss(false, kappa, tau));
    res.curves.hard_loss.push_back(eval_loss(true, kappa, tau));
  }
  res.steps = t;

  // Finish: argmax patterns, recompute scales, pack (Algorithm 1 lines 17–18).
  const std::array<std::vector<uint8_t>, 3> pat = current_patterns();
  int64_t changed = 0, total = 0;
  for (int j = 0; j < 3; ++j)
    for (size_t r = 0; r < pat[j].size(); ++r, ++total) changed += pat[j][r] != prior[j][r];
  res.pattern_change = total ? static_cast<double>(changed) / static_cast<double>(total) : 0.0;
  pack(P, pat, res);
  res.final_hard_loss = packed_loss(res.gate, res.up, res.down, eval_rows, H, I, o, ws);
  if (o.keep_init_if_worse && all_packed && n_held > 0 && res.final_hard_loss > res.init_hard_loss) {
    return_init("refined expert worse on held-out rows than SGPTQ: kept the SGPTQ solution");
    res.final_hard_loss = res.init_hard_loss;
    res.pattern_change = 0.0;
  }
  res.seconds = seconds_since(t_start);
  return res;
}

}  // namespace moesq::compress
