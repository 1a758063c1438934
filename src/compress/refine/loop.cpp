// The refinement loop of one expert (refine/loop.h): data preparation (Q_a on the inputs once, g^p row
// weights, held-out split), the optimizer loop (batches, Gumbel noise, schedules, Lion), the
// per-epoch curves and the final argmax + pack (Algorithm 1 lines 17–18).
// Non-obvious decision: the inputs are activation-quantized ONCE for all rows (Q_a of a row does
// not depend on the parameters) and every batch is gathered into contiguous buffers, so the
// per-step cost is the five GEMMs of refine/objective.cpp plus O(weights) elementwise work.
#include "compress/refine/loop.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <cmath>
#include <numeric>
#include <type_traits>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "compress/refine/objective.h"
#include "compress/refine/lion.h"
#include "compress/refine/gumbel_mask.h"
#include "compress/refine/scale_finetune.h"
#include "compress/refine/schedule.h"
#include "compress/refine/step_backend.h"
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

// Rows `idx` of the prepared data, gathered contiguously.
struct Rows {
  std::vector<float> X, Y, w;  // [m, H], [m, H], [m]
  double inv_norm = 0.0;       // 1 / (Σ w · H); 0 when Σ w = 0
  int64_t m = 0;
};
// 1 / (Σ w · H) over rows idx [m], summed in that order; 0 when Σ w = 0.
double batch_inv_norm(const float* w, const int64_t* idx, int64_t m, int64_t H) {
  double sum_w = 0.0;
  for (int64_t i = 0; i < m; ++i) sum_w += w[idx[i]];
  return sum_w > 0 ? 1.0 / (sum_w * static_cast<double>(H)) : 0.0;
}

void gather(const float* Xq, const float* Y_ref, const float* w, const int64_t* idx, int64_t m, int64_t H,
            Rows& out) {
  out.m = m;
  out.X.resize(m * H);
  out.Y.resize(m * H);
  out.w.resize(m);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = idx[i];
    std::copy_n(Xq + r * H, H, &out.X[i * H]);
    std::copy_n(Y_ref + r * H, H, &out.Y[i * H]);
    out.w[i] = w[r];
  }
  out.inv_norm = batch_inv_norm(w, idx, m, H);
}

ObjectiveInput<float> input_of(const Rows& r, int64_t H, int64_t I, int act_block, const model::ExpertVariant& v) {
  ObjectiveInput<float> in;
  in.m = r.m;
  in.H = H;
  in.I = I;
  in.X = r.X.data();
  in.Y_ref = r.Y.data();
  in.w = r.w.data();
  in.inv_norm = r.inv_norm;
  in.act_block = act_block;
  in.b_gate = v.gate_bias;
  in.b_up = v.up_bias;
  in.b_down = v.down_bias;
  in.clamped = v.clamped;
  in.alpha = v.alpha;
  in.limit = v.limit;
  return in;
}

// The CPU step backend (refine/step_backend.h): objective_grad and lion_step on the loop's own
// parameters (start keeps a pointer to them), the eval rows gathered once.
class CpuStepBackend final : public StepBackend {
 public:
  void start(const StepData& d, std::array<ProjState<float>, 3>& P, const std::array<const uint8_t*, 3>& fixed,
             const RefineOptions& o) override {
    d_ = d;
    P_ = &P;
    fixed_ = fixed;
    o_ = &o;
    for (int j = 0; j < 3; ++j) {
      mom_A_[j].assign(P[j].A.size(), 0.0f);
      mom_V_[j].assign(P[j].V.size(), 0.0f);
    }
    // Q_a on the inputs, once (a row's Q_a does not depend on the parameters).
    Xq_.assign(d.X, d.X + d.n * d.H);
    for (int64_t i = 0; i < d.n; ++i) format::quantize_activation_row(&Xq_[i * d.H], d.H, d.act_block);
    gather(Xq_.data(), d.Y_ref, d.w, d.eval_rows, d.n_eval, d.H, eval_rows_);
  }
  void begin_epoch(const std::vector<int64_t>& order) override { order_ = order; }
  void step(const StepInput& s) override {
    gather(Xq_.data(), d_.Y_ref, d_.w, &order_[static_cast<size_t>(s.b0)], s.m, d_.H, batch_);
    batch_.inv_norm = s.inv_norm;
    ObjectiveInput<float> in = input_of(batch_, d_.H, d_.I, d_.act_block, d_.variant);
    in.kappa = s.kappa;
    in.tau = s.tau;
    in.fixed = fixed_;
    for (int j = 0; j < 3; ++j) {
      if (fixed_[j]) continue;
      G_[j].resize((*P_)[j].A.size());
      gumbel_noise((*P_)[j].groups(), s.gumbel_key[j], G_[j].data());
      in.G[j] = G_[j].data();
    }
    objective_grad(in, *P_, true, o_->micro_batch, &grad_, ws_);
    const LionConfig lion{o_->beta1, o_->beta2, o_->weight_decay};
    for (int j = 0; j < 3; ++j) {
      ProjState<float>& p = (*P_)[j];
      if (!fixed_[j])
        lion_step(p.A.data(), mom_A_[j].data(), grad_[j].A.data(), static_cast<int64_t>(p.A.size()), s.lr_A, lion);
      lion_step(p.V.data(), mom_V_[j].data(), grad_[j].V.data(), static_cast<int64_t>(p.V.size()), s.lr_V, lion);
    }
  }
  double eval_loss(bool hard, double kappa, double tau) override {
    ObjectiveInput<float> in = input_of(eval_rows_, d_.H, d_.I, d_.act_block, d_.variant);
    in.kappa = kappa;
    in.tau = tau;
    std::array<std::vector<uint8_t>, 3> pat;
    if (hard) {
      for (int j = 0; j < 3; ++j) {
        if (fixed_[j]) {
          in.fixed[j] = fixed_[j];
          continue;
        }
        pat[j].resize((*P_)[j].groups());
        hard_mask((*P_)[j].A.data(), (*P_)[j].groups(), pat[j].data(), static_cast<float*>(nullptr));
        in.fixed[j] = pat[j].data();
      }
    } else {
      in.fixed = fixed_;
    }
    return objective_grad(in, *P_, true, o_->micro_batch, nullptr, ws_);
  }
  double weights_loss(const float* W_gate, const float* W_up, const float* W_down) override {
    return expert_loss(input_of(eval_rows_, d_.H, d_.I, d_.act_block, d_.variant), W_gate, W_up, W_down, true,
                       o_->micro_batch, ws_);
  }
  void sync(std::array<ProjState<float>, 3>&) override {}
  void snapshot(const std::array<float*, 3>& V, std::array<std::vector<uint8_t>, 3>& pat) override {
    for (int j = 0; j < 3; ++j) {
      const ProjState<float>& p = (*P_)[j];
      if (V[j]) std::copy(p.V.begin(), p.V.end(), V[j]);
      pat[j].resize(static_cast<size_t>(p.groups()));
      if (fixed_[j])
        std::copy(fixed_[j], fixed_[j] + p.groups(), pat[j].begin());
      else
        hard_mask(p.A.data(), p.groups(), pat[j].data(), static_cast<float*>(nullptr));
    }
  }

 private:
  StepData d_;
  std::array<ProjState<float>, 3>* P_ = nullptr;
  std::array<const uint8_t*, 3> fixed_{};
  const RefineOptions* o_ = nullptr;
  std::array<std::vector<float>, 3> mom_A_, mom_V_;  // Lion momenta
  std::vector<int64_t> order_;                       // this epoch's training rows in order
  std::vector<float> Xq_;                            // [n, H] Q_a(X)
  Rows batch_, eval_rows_;
  std::array<ProjState<float>, 3> grad_;
  std::array<std::vector<float>, 3> G_;
  ObjectiveWorkspace ws_;
};

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

}  // namespace

namespace {

// One refinement run, stage by stage (refine_expert below): the initial state, the prepared rows,
// the optimizer loop with its per-epoch curves, and the finish (argmax, pack, keep-initial policy).
class ExpertRefinement {
 public:
  ExpertRefinement(const ExpertData& data, const ProjInit& gate, const ProjInit& up, const ProjInit& down,
                   const RefineOptions& o)
      : data_(data), init_{&gate, &up, &down}, o_(o), H_(data.H), I_(data.I) {}

  // Shapes, V0 and the prior patterns of the three projections (Error naming the one at fault).
  void load_initial_state() {
    const int64_t n = data_.n, H = H_, I = I_;
    MOESQ_CHECK(n >= 0 && H > 0 && I > 0, "refine: bad expert shape n=", n, " H=", H, " I=", I);
    MOESQ_CHECK(H % format::kSparseScaleBlock == 0 && I % format::kSparseScaleBlock == 0,
                "refine: H=", H, " and I=", I, " must be multiples of ", format::kSparseScaleBlock);
    static const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
    const int64_t N_of[3] = {I, I, H}, K_of[3] = {H, H, I};
    for (int j = 0; j < 3; ++j) {
      const ProjInit& in = *init_[j];
      MOESQ_CHECK(in.V0 && in.prior, "refine: ", names[j], " has no initial V0/patterns");
      if (in.packed)
        MOESQ_CHECK(in.packed->N == N_of[j] && in.packed->K == K_of[j], "refine: ", names[j],
                    " initial packed tensor is [", in.packed->N, ", ", in.packed->K, "], expected [", N_of[j],
                    ", ", K_of[j], "]");
      P_[j].N = N_of[j];
      P_[j].K = K_of[j];
      P_[j].V.assign(in.V0, in.V0 + N_of[j] * K_of[j]);
      prior_[j].assign(in.prior, in.prior + P_[j].groups());
      for (uint8_t pid : prior_[j])
        MOESQ_CHECK(pid < kNumPatterns, "refine: ", names[j], " prior pattern id ", int(pid), " is not in [0, 6)");
    }
    all_packed_ = init_[0]->packed && init_[1]->packed && init_[2]->packed;
  }

  // Experts without (enough) rows are not refined: the initial solution is returned.
  bool skip(RefineResult& res) {
    const int64_t n = data_.n;
    if (!(n == 0 || n < o_.min_rows)) return false;
    const std::string why = n == 0 ? std::string("no calibration rows")
                                   : detail::concat(n, " calibration rows < min_rows=", o_.min_rows);
    return_init(why + (all_packed_ ? ": kept the SGPTQ solution" : ": initial solution re-packed"), res);
    res.skipped = true;
    return true;
  }

  // Router-weighted row weights g^p (Eq. 4); the held-out split. (Q_a on the inputs is the step
  // backend's, once, where the rows live: StepData::X.)
  void prepare_rows(RefineResult& res) {
    const int64_t n = data_.n, H = H_;
    MOESQ_CHECK(data_.g && (data_.X || data_.X_dev) && (data_.Y_ref || data_.Y_ref_dev), "refine: expert stream ",
                data_.stream, " has n=", n, " rows but no X/g/Y_ref");
    MOESQ_CHECK((data_.X && data_.Y_ref) || o_.device, "refine: expert stream ", data_.stream,
                " has its rows on the GPU only, and the refinement runs on the CPU");
    w_.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      MOESQ_CHECK(std::isfinite(data_.g[i]) && data_.g[i] >= 0, "refine: router weight g[", i, "] = ", data_.g[i],
                  " of expert stream ", data_.stream, " is not a finite value >= 0");
      w_[i] = o_.p == 0 ? 1.0f : static_cast<float>(std::pow(static_cast<double>(data_.g[i]), o_.p));
    }
    const std::vector<int64_t> perm = permutation(n, rng_key(o_.seed, data_.stream, kRngSplit, 0, 0));
    n_held_ = heldout_rows(o_, n);
    const std::vector<int64_t> held(perm.begin(), perm.begin() + n_held_);
    train_.assign(perm.begin() + n_held_, perm.end());
    res.train_rows = static_cast<int64_t>(train_.size());
    res.heldout_rows = n_held_;
    if (n_held_ == 0 && o_.heldout_fraction > 0) res.note = "too few rows to hold out: curves on the training rows";
    const std::vector<int64_t>& eval_idx = n_held_ > 0 ? held : train_;
    eval_idx_ = eval_idx;
    eval_inv_norm_ = batch_inv_norm(w_.data(), eval_idx.data(), static_cast<int64_t>(eval_idx.size()), H);
  }

  // The schedule rule (refine/schedule.h) for every one of batch / epochs / rates the options
  // leave to it, from this expert's training rows (or the layer's mean, ExpertData::schedule_rows).
  void apply_schedule(RefineResult& res) {
    if (o_.step_sequences > 0) {
      apply_layer_wide_schedule(res);
      return;
    }
    const bool any = o_.rule_batch || o_.rule_epochs || o_.rule_lr_A || o_.rule_lr_V;
    if (any) {
      const int64_t rows =
          !o_.rule_per_expert && data_.schedule_rows > 0 ? data_.schedule_rows : static_cast<int64_t>(train_.size());
      // By rule: the layer's batch in the large-batch regime (refine/schedule.h), else 0 (the expert's own).
      const int64_t fixed_batch = o_.rule_batch ? layer_batch(data_.schedule_rows) : o_.batch;
      const RefineSchedule s = refine_schedule(rows, fixed_batch, o_.rule_epochs ? 0 : o_.epochs);
      if (o_.rule_batch) o_.batch = s.batch;
      if (o_.rule_epochs) o_.epochs = s.epochs;
      if (o_.rule_lr_A) o_.lr_A = s.lr_A * o_.rule_lr_A_scale;
      if (o_.rule_lr_V) o_.lr_V = s.lr_V * o_.rule_lr_V_scale;
      res.schedule_rows = rows;
    }
    record_schedule(res);
  }
  // The layer-wide schedule (RefineOptions::step_sequences): the training rows grouped by their
  // calibration sequence, the rule's epochs and rates for the layer's step count, and the largest
  // number of rows any step can hand this expert (the device backend sizes its buffers by it).
  void apply_layer_wide_schedule(RefineResult& res) {
    const int64_t S = data_.num_sequences;
    MOESQ_CHECK(data_.seq && S > 0, "refine: the layer-wide schedule (step_sequences=", o_.step_sequences,
                ") needs each row's calibration sequence; expert stream ", data_.stream, " has none");
    rows_of_seq_.assign(static_cast<size_t>(S), {});
    for (int64_t r : train_) {
      const int32_t q = data_.seq[r];
      MOESQ_CHECK(q >= 0 && q < S, "refine: row ", r, " of expert stream ", data_.stream, " names sequence ", q,
                  ", outside [0, ", S, ")");
      rows_of_seq_[static_cast<size_t>(q)].push_back(r);
    }
    std::vector<int64_t> counts;
    for (const auto& v : rows_of_seq_) counts.push_back(static_cast<int64_t>(v.size()));
    std::sort(counts.rbegin(), counts.rend());
    max_step_rows_ = 0;
    for (int64_t i = 0; i < std::min<int64_t>(o_.step_sequences, S); ++i) max_step_rows_ += counts[static_cast<size_t>(i)];
    const RefineSchedule s =
        layer_wide_schedule(S, o_.step_sequences, o_.rule_epochs ? schedule_rule::kEpochsRef : o_.epochs);
    if (o_.rule_epochs) o_.epochs = s.epochs;
    if (o_.rule_lr_A) o_.lr_A = s.lr_A * o_.rule_lr_A_scale;
    if (o_.rule_lr_V) o_.lr_V = s.lr_V * o_.rule_lr_V_scale;
    record_schedule(res);
    res.batch = 0;
    res.batch_from_rule = false;
    res.step_sequences = o_.step_sequences;
  }
  void record_schedule(RefineResult& res) const {
    res.batch = o_.batch;
    res.epochs = o_.epochs;
    res.lr_A = o_.lr_A;
    res.lr_V = o_.lr_V;
    res.batch_from_rule = o_.rule_batch;
    res.epochs_from_rule = o_.rule_epochs;
    res.lr_A_from_rule = o_.rule_lr_A;
    res.lr_V_from_rule = o_.rule_lr_V;
  }

  // Parameters: A from the prior (Eq. 2 init), V = V0; Lion momenta; the initial held-out loss.
  void init_parameters(RefineResult& res) {
    // The device that runs the steps takes the rows and the initial parameters; a GPU draws the prior
    // logits itself (the host draw is 33 M Box–Muller pairs per Kimi expert).
    backend_ = o_.device ? o_.device() : make_cpu_step_backend();
    const bool device_draws = backend_->draws_prior();
    StepData sd;
    for (int j = 0; j < 3; ++j) {
      if (o_.update_A) {
        const uint64_t key = rng_key(o_.seed, data_.stream, kRngPriorInit, 0, j);
        if (device_draws) {  // P.A stays empty: the device holds A from here on
          sd.prior[j] = prior_[j].data();
          sd.prior_key[j] = key;
        } else {
          P_[j].A.resize(P_[j].groups() * kNumPatterns);
          prior_logits(prior_[j].data(), P_[j].groups(), o_.sigma, o_.s, key, P_[j].A.data());
        }
      } else {
        fixed_[j] = prior_[j].data();
      }
    }
    sd.prior_sigma = o_.sigma;
    sd.prior_s = o_.s;
    sd.n = data_.n;
    sd.H = H_;
    sd.I = I_;
    sd.X = data_.X;
    sd.Y_ref = data_.Y_ref;
    sd.X_dev = data_.X_dev;
    sd.Y_ref_dev = data_.Y_ref_dev;
    sd.w = w_.data();
    sd.eval_rows = eval_idx_.data();
    sd.n_eval = static_cast<int64_t>(eval_idx_.size());
    sd.eval_inv_norm = eval_inv_norm_;
    sd.max_batch = std::max<int64_t>(
        1, o_.step_sequences > 0 ? max_step_rows_ : std::min<int64_t>(o_.batch, static_cast<int64_t>(train_.size())));
    sd.act_block = o_.act_block;
    sd.variant = data_.variant;
    backend_->start(sd, P_, fixed_, o_);
    if (all_packed_) {
      res.init_hard_loss = backend_->packed_loss(*init_[0]->packed, *init_[1]->packed, *init_[2]->packed);
    } else {
      res.init_hard_loss = eval_loss(true, o_.kappa0, o_.tau0);
    }
    // Best-epoch restore: the candidate so far is the initial solution (epoch 0).
    select_best_ = o_.restore_best && n_held_ > 0;
    if (select_best_) {
      best_loss_ = res.init_hard_loss;
      for (int j = 0; j < 3; ++j) best_V_[j].assign(init_[j]->V0, init_[j]->V0 + P_[j].V.size());
      best_pat_ = prior_;
    }
  }

  // After epoch `epoch` (1-based) with held-out hard loss `hard`: keep the state if it is the best.
  void remember_if_best(int epoch, double hard) {
    if (!select_best_ || !(hard < best_loss_)) return;
    best_loss_ = hard;
    best_epoch_ = epoch;
    std::array<float*, 3> V;
    for (int j = 0; j < 3; ++j) {
      best_V_[j].resize(P_[j].V.size());
      V[j] = best_V_[j].data();
    }
    backend_->snapshot(V, best_pat_);
  }

  // Algorithm 1 lines 7–16: epochs of shuffled batches, Gumbel noise, annealed κ and τ, Lion; the
  // held-out soft and hard losses after each epoch.
  void optimize(RefineResult& res) {
    if (o_.step_sequences > 0) {
      optimize_layer_wide(res);
      return;
    }
    const int64_t n_train = static_cast<int64_t>(train_.size());
    const int64_t steps_per_epoch = (n_train + o_.batch - 1) / o_.batch;
    const int64_t num_steps = steps_per_epoch * o_.epochs;
    int64_t t = 0;
    double kappa = o_.kappa0, tau = o_.tau0;
    for (int epoch = 0; epoch < o_.epochs; ++epoch) {
      const auto t_epoch = Clock::now();
      const std::vector<int64_t> order = permutation(n_train, rng_key(o_.seed, data_.stream, kRngShuffle, epoch, 0));
      std::vector<int64_t> idx(n_train);
      for (int64_t i = 0; i < n_train; ++i) idx[i] = train_[order[i]];
      backend_->begin_epoch(idx);
      for (int64_t b0 = 0; b0 < n_train; b0 += o_.batch, ++t) {
        StepInput s;
        s.b0 = b0;
        s.m = std::min(o_.batch, n_train - b0);
        s.inv_norm = batch_inv_norm(w_.data(), &idx[b0], s.m, H_);
        kappa = linear_schedule(o_.kappa0, o_.kappa1, t, num_steps);
        tau = linear_schedule(o_.tau0, o_.tau1, t, num_steps);
        s.kappa = kappa;
        s.tau = tau;
        for (int j = 0; j < 3; ++j) s.gumbel_key[j] = rng_key(o_.seed, data_.stream, kRngGumbel, t, j);
        s.lr_A = cosine_lr(o_.lr_A, o_.lr_final_frac, t, num_steps);
        s.lr_V = cosine_lr(o_.lr_V, o_.lr_final_frac, t, num_steps);
        backend_->step(s);
      }
      res.curves.epoch_seconds.push_back(seconds_since(t_epoch));
      res.curves.soft_loss.push_back(eval_loss(false, kappa, tau));
      res.curves.hard_loss.push_back(eval_loss(true, kappa, tau));
      remember_if_best(epoch + 1, res.curves.hard_loss.back());
    }
    res.steps = t;
  }

  // The same loop over the layer-wide schedule: step k of an epoch takes the training rows of the
  // sequences perm[k·N, (k+1)·N) (perm: the layer's shuffle of its sequences, the same for every
  // expert); a step without rows for this expert is skipped, but still advances the schedule (κ, τ,
  // rates and noise keys follow the layer's step counter, as they do for every expert of the layer).
  void optimize_layer_wide(RefineResult& res) {
    const int64_t S = data_.num_sequences, N = o_.step_sequences;
    const int64_t steps_per_epoch = (S + N - 1) / N, num_steps = steps_per_epoch * o_.epochs;
    int64_t t = 0, taken = 0;
    double kappa = o_.kappa0, tau = o_.tau0;
    std::vector<int64_t> idx, start(static_cast<size_t>(steps_per_epoch) + 1);
    for (int epoch = 0; epoch < o_.epochs; ++epoch) {
      const auto t_epoch = Clock::now();
      const std::vector<int64_t> perm = permutation(S, rng_key(o_.seed, data_.layer_stream, kRngShuffle, epoch, 1));
      idx.clear();
      for (int64_t k = 0; k < steps_per_epoch; ++k) {
        start[static_cast<size_t>(k)] = static_cast<int64_t>(idx.size());
        for (int64_t q = k * N; q < std::min(S, (k + 1) * N); ++q) {
          const std::vector<int64_t>& rows = rows_of_seq_[static_cast<size_t>(perm[static_cast<size_t>(q)])];
          idx.insert(idx.end(), rows.begin(), rows.end());
        }
      }
      start[static_cast<size_t>(steps_per_epoch)] = static_cast<int64_t>(idx.size());
      backend_->begin_epoch(idx);
      for (int64_t k = 0; k < steps_per_epoch; ++k, ++t) {
        kappa = linear_schedule(o_.kappa0, o_.kappa1, t, num_steps);
        tau = linear_schedule(o_.tau0, o_.tau1, t, num_steps);
        StepInput s;
        s.b0 = start[static_cast<size_t>(k)];
        s.m = start[static_cast<size_t>(k) + 1] - s.b0;
        if (s.m == 0) continue;
        s.inv_norm = batch_inv_norm(w_.data(), &idx[static_cast<size_t>(s.b0)], s.m, H_);
        s.kappa = kappa;
        s.tau = tau;
        for (int j = 0; j < 3; ++j) s.gumbel_key[j] = rng_key(o_.seed, data_.stream, kRngGumbel, t, j);
        s.lr_A = cosine_lr(o_.lr_A, o_.lr_final_frac, t, num_steps);
        s.lr_V = cosine_lr(o_.lr_V, o_.lr_final_frac, t, num_steps);
        backend_->step(s);
        ++taken;
      }
      res.curves.epoch_seconds.push_back(seconds_since(t_epoch));
      res.curves.soft_loss.push_back(eval_loss(false, kappa, tau));
      res.curves.hard_loss.push_back(eval_loss(true, kappa, tau));
      remember_if_best(epoch + 1, res.curves.hard_loss.back());
    }
    res.steps = taken;
  }

  // Algorithm 1 lines 17–18: argmax patterns, recompute scales, pack; optionally keep the initial
  // solution when it is better on the held-out rows.
  void finish(RefineResult& res) {
    pack_final(res);
    tune_scales(res);
  }

 private:
  // The scale-only fine-tuning stage (refine/scale_finetune.h) on the packed result: on the training
  // rows, Q_a as the objective's; kept only where the held-out loss goes down.
  void tune_scales(RefineResult& res) {
    if (o_.scale_finetune_epochs == 0 || train_.empty()) return;
    MOESQ_CHECK(data_.X && data_.Y_ref, "refine: the scale fine-tuning needs the rows in host memory (expert stream ",
                data_.stream, ")");
    std::vector<float> Xq(data_.X, data_.X + data_.n * H_);
    for (int64_t i = 0; i < data_.n; ++i) format::quantize_activation_row(&Xq[i * H_], H_, o_.act_block);
    refine::ScaleFinetuneRows rows;
    rows.n = data_.n, rows.H = H_, rows.I = I_, rows.Xq = Xq.data(), rows.Y_ref = data_.Y_ref, rows.w = w_.data();
    rows.act_block = o_.act_block, rows.variant = data_.variant;
    refine::ScaleFinetuneOptions so;
    so.epochs = o_.scale_finetune_epochs, so.lr = o_.scale_finetune_lr, so.lr_final_frac = o_.lr_final_frac;
    so.batch = o_.step_sequences > 0 ? 64 : o_.batch, so.micro_batch = o_.micro_batch, so.beta1 = o_.beta1;
    format::Sparse48Tensor g = res.gate, u = res.up, d = res.down;
    res.scale_finetune.steps =
        refine::scale_finetune(g, u, d, rows, train_, rng_key(o_.seed, data_.stream, kRngScaleShuffle, 0, 0), so);
    res.scale_finetune.loss_before = res.final_hard_loss;
    res.scale_finetune.loss_after = backend_->packed_loss(g, u, d);
    if (!(res.scale_finetune.loss_after < res.final_hard_loss)) return;
    res.scale_finetune.kept = true;
    res.gate = std::move(g), res.up = std::move(u), res.down = std::move(d);
    res.final_hard_loss = res.scale_finetune.loss_after;
  }

  // Algorithm 1 lines 17–18 (finish's first part).
  void pack_final(RefineResult& res) {
    res.selected_epoch = o_.epochs;
    if (o_.epochs == 0 && all_packed_) {  // no step taken: the SGPTQ solution itself, not a re-pack of V0
      return_init("--epochs 0: no refinement step, kept the SGPTQ solution", res);
      res.final_hard_loss = res.init_hard_loss;
      res.pattern_change = 0.0;
      return;
    }
    if (select_best_ && best_epoch_ < o_.epochs) {
      // Restore the best state: its values V and argmax patterns (the epoch's hard loss is
      // measured on exactly these, with the scales recomputed as pack does).
      res.selected_epoch = best_epoch_;
      if (best_epoch_ == 0 && all_packed_) {
        return_init("no epoch beat the initial solution on the held-out rows: kept the SGPTQ solution", res);
        res.final_hard_loss = res.init_hard_loss;
        res.pattern_change = 0.0;
        return;
      }
      for (int j = 0; j < 3; ++j) P_[j].V = std::move(best_V_[j]);
    }
    std::array<std::vector<uint8_t>, 3> pat;
    if (res.selected_epoch < o_.epochs) {
      pat = std::move(best_pat_);
    } else {  // the state the loop ended in: its V into P, its argmax patterns
      backend_->snapshot({P_[0].V.data(), P_[1].V.data(), P_[2].V.data()}, pat);
    }
    int64_t changed = 0, total = 0;
    for (int j = 0; j < 3; ++j)
      for (size_t r = 0; r < pat[j].size(); ++r, ++total) changed += pat[j][r] != prior_[j][r];
    res.pattern_change = total ? static_cast<double>(changed) / static_cast<double>(total) : 0.0;
    // With selection, pack exactly what the held-out curve measured: the objective's Q_w takes its
    // tensor scale γ over the KEPT values (Z ⊙ V), pack over all of V, so a large latent value at a
    // pruned position would give the packed expert a coarser γ than the one that was selected.
    if (select_best_) zero_pruned(pat);
    pack(P_, pat, res);
    res.final_hard_loss = backend_->packed_loss(res.gate, res.up, res.down);
    if (o_.keep_init_if_worse && all_packed_ && n_held_ > 0 && res.final_hard_loss > res.init_hard_loss) {
      return_init("refined expert worse on held-out rows than SGPTQ: kept the SGPTQ solution", res);
      res.final_hard_loss = res.init_hard_loss;
      res.pattern_change = 0.0;
      res.selected_epoch = 0;
    }
  }

 private:
  void return_init(const std::string& why, RefineResult& res) {
    if (all_packed_) {
      res.gate = *init_[0]->packed;
      res.up = *init_[1]->packed;
      res.down = *init_[2]->packed;
    } else {
      pack(P_, prior_, res);
    }
    res.note = why;
  }

  // V = 0 where the patterns prune (Y = Z ⊙ V for hard Z; the packed values are unchanged).
  void zero_pruned(const std::array<std::vector<uint8_t>, 3>& pat) {
    for (int j = 0; j < 3; ++j)
      for (int64_t r = 0; r < P_[j].groups(); ++r) {
        const uint8_t mask = format::pattern_mask8(pat[j][r]);
        for (int q = 0; q < 8; ++q)
          if (!((mask >> q) & 1)) P_[j].V[r * 8 + q] = 0.0f;
      }
  }

  double eval_loss(bool hard, double kappa, double tau) { return backend_->eval_loss(hard, kappa, tau); }

  const ExpertData& data_;
  const std::array<const ProjInit*, 3> init_;
  RefineOptions o_;  // a copy: apply_schedule fills in the rule's values
  const int64_t H_, I_;
  std::array<ProjState<float>, 3> P_;             // A [R, 6] and V [N, K] of gate, up, down
  std::array<std::vector<uint8_t>, 3> prior_;     // [R] initial (SGPTQ) patterns
  std::array<const uint8_t*, 3> fixed_{};         // support held at the prior (V-only ablation)
  std::unique_ptr<StepBackend> backend_;          // runs the steps (init_parameters on)
  bool all_packed_ = false;
  std::vector<float> w_;                          // [n] g^p
  std::vector<int64_t> train_;                    // training row ids
  std::vector<int64_t> eval_idx_;                 // the curves' row ids (held-out, or training)
  std::vector<std::vector<int64_t>> rows_of_seq_;  // layer-wide schedule: training rows per sequence
  int64_t max_step_rows_ = 0;                      // layer-wide schedule: most rows one step can take
  int64_t n_held_ = 0;
  double eval_inv_norm_ = 0.0;                    // 1 / (Σ w · H) over the held-out rows (or training rows if none)
  // Best-epoch restore (RefineOptions::restore_best): the lowest held-out hard loss so far, its
  // epoch (0 = initial solution) and its state.
  bool select_best_ = false;
  double best_loss_ = 0.0;
  int best_epoch_ = 0;
  std::array<std::vector<float>, 3> best_V_;
  std::array<std::vector<uint8_t>, 3> best_pat_;
};

}  // namespace

double StepBackend::packed_loss(const format::Sparse48Tensor& g, const format::Sparse48Tensor& u,
                                const format::Sparse48Tensor& d) {
  std::vector<float> Wg(static_cast<size_t>(g.N * g.K)), Wu(static_cast<size_t>(u.N * u.K)),
      Wd(static_cast<size_t>(d.N * d.K));
  format::sparse48_dequantize(g, Wg.data());
  format::sparse48_dequantize(u, Wu.data());
  format::sparse48_dequantize(d, Wd.data());
  return weights_loss(Wg.data(), Wu.data(), Wd.data());
}

std::unique_ptr<StepBackend> refine::make_cpu_step_backend() { return std::make_unique<CpuStepBackend>(); }

RefineResult refine_expert(const ExpertData& data, const ProjInit& gate, const ProjInit& up,
                           const ProjInit& down, const RefineOptions& o) {
  const auto t_start = Clock::now();
  const DenormalGuard denormal_guard;
  validate(o);
  ExpertRefinement run(data, gate, up, down, o);
  run.load_initial_state();
  RefineResult res;
  if (run.skip(res)) {
    run.record_schedule(res);
  } else {
    auto lap = Clock::now();
    auto stage = [&lap](double& seconds) {
      seconds = seconds_since(lap);
      lap = Clock::now();
    };
    run.prepare_rows(res);
    run.apply_schedule(res);
    stage(res.stage_seconds.prepare);
    run.init_parameters(res);
    stage(res.stage_seconds.start);
    run.optimize(res);
    stage(res.stage_seconds.optimize);
    run.finish(res);
    stage(res.stage_seconds.finish);
  }
  res.seconds = seconds_since(t_start);
  return res;
}

}  // namespace moesq::compress
