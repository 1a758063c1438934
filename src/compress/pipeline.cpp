#include "compress/pipeline.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>

#include "compress/refine/loop.h"
#include "core/blas_threads.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "format/nvfp4.h"
#include "io/tensor_names.h"

namespace moesq::compress {

Method parse_method(const std::string& s) {
  if (s == "rtn-nvfp4") return Method::RtnNvfp4;
  if (s == "magnitude") return Method::Magnitude;
  if (s == "sgptq") return Method::Sgptq;
  if (s == "moesq") return Method::Moesq;
  MOESQ_FAIL("--method: unknown method '", s, "' (expected rtn-nvfp4, magnitude, sgptq or moesq)");
}

const char* method_name(Method m) {
  switch (m) {
    case Method::RtnNvfp4: return "rtn-nvfp4";
    case Method::Magnitude: return "magnitude";
    case Method::Sgptq: return "sgptq";
    case Method::Moesq: return "moesq";
  }
  return "?";
}

bool method_is_sparse(Method m) { return m != Method::RtnNvfp4; }

void validate(const CompressOptions& opt) {
  MOESQ_CHECK(opt.threads >= 0, "--threads: ", opt.threads, " must be >= 0 (0 = all cores)");
  MOESQ_CHECK(opt.sgptq.percdamp >= 0 && std::isfinite(opt.sgptq.percdamp), "--percdamp: ",
              opt.sgptq.percdamp, " must be a finite value >= 0");
  MOESQ_CHECK(opt.sgptq.block_size > 0 && opt.sgptq.block_size % format::kSparseScaleBlock == 0,
              "sgptq: block_size=", opt.sgptq.block_size, " must be a positive multiple of ",
              format::kSparseScaleBlock);
  if (opt.method == Method::Moesq) validate(opt.refine);
}

namespace {

// ‖a − b‖²_F / ‖a‖²_F, the report's reconstruction error (NaN when ‖a‖ = 0 and a ≠ b; 0 when both
// are zero).
double rel_sq_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(a[i]) * a[i];
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  return num / den;
}

// The refinement schedule an expert ran with, and where each value came from (report.json).
nlohmann::json schedule_json(const RefineResult& rr) {
  auto src = [](bool rule) { return rule ? "rule" : "set"; };
  return {{"batch", rr.batch}, {"epochs", rr.epochs}, {"steps", rr.steps}, {"lr_A", rr.lr_A}, {"lr_V", rr.lr_V},
          {"rule_rows", rr.schedule_rows},
          {"source", {{"batch", src(rr.batch_from_rule)}, {"epochs", src(rr.epochs_from_rule)},
                      {"lr_A", src(rr.lr_A_from_rule)}, {"lr_V", src(rr.lr_V_from_rule)}}}};
}

// The calibration rows of one expert (gathered from the routed layer input).
struct ExpertCalib {
  std::vector<float> X;  // [n, H]
  std::vector<float> g;  // [n] router combine weight of this expert for the row
  int64_t n = 0;
  int64_t schedule_rows = 0;  // the layer's mean training rows per expert (schedule rule, per-layer scope)
};

// Compresses one expert with `opt.method`. `w` holds the original weights, y_ref [c.n, H] their
// outputs on the expert's calibration rows (the refinement's targets).
PackedExpert compress_expert(const io::ModelSpec& spec, const model::ExpertWeights& w, int64_t H, int64_t I,
                             const ExpertCalib& c, const std::vector<float>& y_ref, const CompressOptions& opt,
                             ExpertReport& rep) {
  // gate and up share one tensor scale (DESIGN.md §3); down has its own (Eq. 5).
  const float gs_gu = format::gate_up_tensor_scale(w.gate.data(), w.up.data(), I * H);
  const float gs_d = format::nvfp4_tensor_scale(format::amax_abs(w.down.data(), H * I));
  std::string names[3];
  for (int p = 0; p < 3; ++p)
    names[p] = io::expert_tensor_prefix(spec, rep.layer, rep.expert, static_cast<io::ExpertProj>(p)) + io::kWeight;
  PackedExpert pe;
  switch (opt.method) {
    case Method::RtnNvfp4: {
      const std::vector<float>* W[3] = {&w.gate, &w.up, &w.down};
      for (int p = 0; p < 3; ++p) {
        const int64_t N = p < 2 ? I : H, K = p < 2 ? H : I;
        pe.proj[p] = format::nvfp4_quantize(W[p]->data(), N, K, p < 2 ? gs_gu : gs_d, names[p]);
      }
      break;
    }
    case Method::Magnitude: {
      const std::vector<float>* W[3] = {&w.gate, &w.up, &w.down};
      for (int p = 0; p < 3; ++p) {
        const int64_t N = p < 2 ? I : H, K = p < 2 ? H : I;
        const std::vector<uint8_t> pat = format::magnitude_patterns(W[p]->data(), N, K);
        pe.proj[p] = format::sparse48_quantize(W[p]->data(), N, K, pat.data(), p < 2 ? gs_gu : gs_d, names[p]);
      }
      break;
    }
    case Method::Sgptq:
    case Method::Moesq: {
      // gate/up: Hessian of the expert inputs. down: Hessian of ITS inputs as produced by the
      // compressed gate/up (sequential GPTQ), so down corrects the error gate/up left behind.
      const Hessian Hx = accumulate_hessian(c.X.data(), c.n, H);
      SgptqResult rg = sgptq(w.gate.data(), I, H, Hx, gs_gu, opt.sgptq, names[0]);
      SgptqResult ru = sgptq(w.up.data(), I, H, Hx, gs_gu, opt.sgptq, names[1]);
      std::vector<float> gq(static_cast<size_t>(I * H)), uq(static_cast<size_t>(I * H));
      format::sparse48_dequantize(rg.packed, gq.data());
      format::sparse48_dequantize(ru.packed, uq.data());
      std::vector<float> inter;
      model::swiglu_forward(gq.data(), uq.data(), w.down.data(), H, I, c.X.data(), c.n, 0, &inter);
      const Hessian Hz = accumulate_hessian(inter.data(), c.n, I);
      SgptqResult rd = sgptq(w.down.data(), H, I, Hz, gs_d, opt.sgptq, names[2]);
      if (rg.fallback || ru.fallback || rd.fallback) {
        rep.fallback = true;
        rep.note = !rg.fallback_reason.empty() ? rg.fallback_reason
                   : !rd.fallback_reason.empty() ? rd.fallback_reason : ru.fallback_reason;
      }
      if (opt.method == Method::Moesq) {
        // Algorithm 1 lines 7–18, starting from the SGPTQ solution.
        ExpertData data;
        data.n = c.n;
        data.H = H;
        data.I = I;
        data.X = c.X.data();
        data.g = c.g.data();
        data.Y_ref = y_ref.data();
        data.stream = static_cast<uint64_t>(rep.layer) * 1000003ull + static_cast<uint64_t>(rep.expert);
        data.schedule_rows = c.schedule_rows;
        const ProjInit ig{rg.dense_rounded.data(), rg.patterns.data(), gs_gu, &rg.packed};
        const ProjInit iu{ru.dense_rounded.data(), ru.patterns.data(), gs_gu, &ru.packed};
        const ProjInit id{rd.dense_rounded.data(), rd.patterns.data(), gs_d, &rd.packed};
        RefineResult rr = refine_expert(data, ig, iu, id, opt.refine);
        rep.extra = {{"init_hard_loss", rr.init_hard_loss}, {"final_hard_loss", rr.final_hard_loss},
                     {"soft_loss", rr.curves.soft_loss}, {"hard_loss", rr.curves.hard_loss},
                     {"epoch_seconds", rr.curves.epoch_seconds}, {"train_rows", rr.train_rows},
                     {"heldout_rows", rr.heldout_rows}, {"steps", rr.steps},
                     {"pattern_change", rr.pattern_change}, {"seconds", rr.seconds}, {"skipped", rr.skipped},
                     {"schedule", schedule_json(rr)}};
        if (!rr.note.empty()) rep.note = rep.note.empty() ? rr.note : rep.note + "; " + rr.note;
        pe.proj[0] = std::move(rr.gate);
        pe.proj[1] = std::move(rr.up);
        pe.proj[2] = std::move(rr.down);
      } else {
        pe.proj[0] = std::move(rg.packed);
        pe.proj[1] = std::move(ru.packed);
        pe.proj[2] = std::move(rd.packed);
      }
      break;
    }
  }
  return pe;
}

// Algorithm 1 line 2: H_1 = Embed(D), one [T, H] state per sequence, and where each sequence's rows
// start in the concatenated [n_total, H] layer input.
struct CalibStates {
  std::vector<std::vector<float>> h;  // [S][T_i, H]
  std::vector<int64_t> offset;        // [S + 1] first row of each sequence
  int64_t n_total() const { return offset.back(); }
};

CalibStates embed_calibration(const model::Qwen3Moe& m, const CalibSet& calib) {
  const size_t S = calib.sequences.size();
  CalibStates st;
  st.h.resize(S);
  st.offset.assign(S + 1, 0);
  for (size_t i = 0; i < S; ++i) {
    st.h[i] = m.embed(calib.sequences[i]);
    st.offset[i + 1] = st.offset[i] + static_cast<int64_t>(calib.sequences[i].size());
  }
  return st;
}

// Attention of layer l on every sequence (states updated in place), then the MoE inputs of all rows,
// X [n_total, H]. Parallel over sequences, each forward single-threaded inside.
std::vector<float> layer_moe_inputs(const model::Qwen3Moe& m, int64_t l, CalibStates& st, int threads) {
  const int64_t H = m.spec().hidden_size, S = static_cast<int64_t>(st.h.size());
  model::ForwardOptions per_task;
  per_task.threads = 1;
  parallel_for(S, [&](int64_t i) { m.attention_block(l, st.h[i], st.offset[i + 1] - st.offset[i], per_task); },
               threads);
  std::vector<float> X(static_cast<size_t>(st.n_total() * H));  // [n_total, H]
  parallel_for(S, [&](int64_t i) {
    const std::vector<float> x = m.moe_input(l, st.h[i], st.offset[i + 1] - st.offset[i]);
    std::copy(x.begin(), x.end(), X.begin() + st.offset[i] * H);
  }, threads);
  return X;
}

// Algorithm 1 line 4: the rows routed to each expert with their router weights, cached once.
std::vector<ExpertCalib> cache_expert_rows(const std::vector<float>& X, const model::Routes& routes, int64_t E,
                                           int64_t H) {
  const int64_t k = routes.k;
  std::vector<ExpertCalib> cal(static_cast<size_t>(E));
  for (int64_t r = 0; r < routes.n; ++r)
    for (int64_t j = 0; j < k; ++j) {
      ExpertCalib& c = cal[static_cast<size_t>(routes.expert[r * k + j])];
      c.X.insert(c.X.end(), X.begin() + r * H, X.begin() + (r + 1) * H);
      c.g.push_back(routes.weight[r * k + j]);
      ++c.n;
    }
  return cal;
}

// Lines 5–16 for one expert: compress, measure the W4A4 reconstruction error, install the
// dequantized weights in place of the original ones (no other task reads this expert).
PackedExpert compress_and_install(const io::ModelSpec& spec, model::ExpertWeights& w, int64_t H, int64_t I,
                                  const ExpertCalib& c, const CompressOptions& opt, int act_block, ExpertReport& rep) {
  // The original expert runs once: its outputs are the refinement targets and the reference of
  // the reconstruction error.
  const std::vector<float> y_ref =
      model::swiglu_forward(w.gate.data(), w.up.data(), w.down.data(), H, I, c.X.data(), c.n, 0);
  PackedExpert pe = compress_expert(spec, w, H, I, c, y_ref, opt, rep);
  // Dequantized once: measured here, then installed.
  std::array<std::vector<float>, 3> deq = {pe.proj[0].dequantize(), pe.proj[1].dequantize(),
                                           pe.proj[2].dequantize()};
  if (c.n == 0) {
    rep.rel_error = std::numeric_limits<double>::quiet_NaN();
    if (rep.note.empty()) rep.note = "no calibration tokens (reconstruction error not measured)";
  } else {
    const std::vector<float> yq =
        model::swiglu_forward(deq[0].data(), deq[1].data(), deq[2].data(), H, I, c.X.data(), c.n, act_block);
    rep.rel_error = rel_sq_error(y_ref, yq);
  }
  w.gate = std::move(deq[0]);
  w.up = std::move(deq[1]);
  w.down = std::move(deq[2]);
  return pe;
}

// Every expert of layer l, in parallel, each single-threaded inside (BLAS included).
void compress_layer(model::Qwen3Moe& m, int64_t l, const std::vector<ExpertCalib>& cal, const CompressOptions& opt,
                    int act_block, CompressResult& res) {
  const io::ModelSpec& spec = m.spec();
  const int64_t L = spec.num_layers, E = spec.num_experts, H = spec.hidden_size, I = spec.moe_intermediate_size;
  std::vector<ExpertReport> reps(static_cast<size_t>(E));
  std::atomic<int64_t> done{0};
  parallel_for(E, [&](int64_t e) {
    ExpertReport& rep = reps[static_cast<size_t>(e)];
    const ExpertCalib& c = cal[static_cast<size_t>(e)];
    rep.layer = l;
    rep.expert = e;
    rep.tokens = c.n;
    res.experts[static_cast<size_t>(l)][static_cast<size_t>(e)] =
        compress_and_install(spec, m.layer(l).experts[static_cast<size_t>(e)], H, I, c, opt, act_block, rep);
    const int64_t d = ++done;
    if (d % 8 == 0 || d == E)
      progress("compress", "layer " + std::to_string(l + 1) + "/" + std::to_string(L) + ": " + std::to_string(d) +
                               "/" + std::to_string(E) + " experts (" + method_name(opt.method) + ")");
  }, opt.threads);
  for (auto& r : reps) {
    if (r.fallback)
      progress("warning", "layer " + std::to_string(l) + " expert " + std::to_string(r.expert) + ": " + r.note);
    res.reports.push_back(std::move(r));
  }
}

}  // namespace

CompressResult compress_model(model::Qwen3Moe& m, const CalibSet& calib, const CompressOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  validate(opt);
  // moesq parallelizes over sequences and experts itself; BLAS stays single-threaded throughout so
  // that the bits of the result do not depend on the thread count (OpenBLAS's threaded sgemm rounds
  // differently from its single-threaded one).
  ScopedBlasSingleThread single_blas;
  const io::ModelSpec& spec = m.spec();
  const int64_t L = spec.num_layers, E = spec.num_experts, H = spec.hidden_size;
  const int act_block = method_is_sparse(opt.method) ? format::kActScaleBlock : format::kDenseScaleBlock;
  MOESQ_CHECK(!calib.sequences.empty(), "no calibration sequences");
  // The propagation through a compressed layer runs W4A4 as deployed (activation block = the weights').
  model::ForwardOptions deployed;
  deployed.act_quant = true;
  deployed.act_block = act_block;
  deployed.threads = opt.threads;
  CompressResult res;
  res.experts.assign(static_cast<size_t>(L), std::vector<PackedExpert>(static_cast<size_t>(E)));

  CalibStates st = embed_calibration(m, calib);
  for (int64_t l = 0; l < L; ++l) {
    progress("compress", "layer " + std::to_string(l + 1) + "/" + std::to_string(L) + ": attention + routing over " +
                             std::to_string(st.n_total()) + " calibration tokens");
    const std::vector<float> X = layer_moe_inputs(m, l, st, opt.threads);  // [n_total, H]
    if (!spec.is_moe_layer(l)) {  // a dense MLP layer is kept as stored: propagate through it
      const std::vector<float> y = m.dense_mlp(l, X, st.n_total());
      for (size_t i = 0; i < st.h.size(); ++i)
        for (int64_t j = st.offset[i] * H; j < st.offset[i + 1] * H; ++j) st.h[i][j - st.offset[i] * H] += y[j];
      continue;
    }
    const model::Routes routes = m.route(l, X, st.n_total());
    std::vector<ExpertCalib> cal = cache_expert_rows(X, routes, E, H);
    // Per-layer scope of the schedule rule: the mean training rows per expert (same split as refine).
    double train_sum = 0;
    for (const ExpertCalib& c : cal)
      train_sum += static_cast<double>(
          c.n - std::min<int64_t>(static_cast<int64_t>(std::floor(opt.refine.heldout_fraction * c.n)),
                                  std::max<int64_t>(c.n - 1, 0)));
    for (ExpertCalib& c : cal) c.schedule_rows = std::llround(train_sum / static_cast<double>(E));
    compress_layer(m, l, cal, opt, act_block, res);
    // H_{l+1} = Block_l(H_l) through the compressed (installed) layer, W4A4 (the shared expert, if
    // any, runs as stored inside moe_block).
    const std::vector<float> y = m.moe_block(l, X, routes, deployed);
    for (size_t i = 0; i < st.h.size(); ++i)
      for (int64_t j = st.offset[i] * H; j < st.offset[i + 1] * H; ++j) st.h[i][j - st.offset[i] * H] += y[j];
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace moesq::compress
