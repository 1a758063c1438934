#include "compress/pipeline.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "compress/layer_record.h"
#include "compress/refine/loop.h"
#include "compress/work_dir.h"
#include "core/blas_threads.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/progress.h"
#include "core/threads.h"
#include "dist/communicator.h"
#include "dist/partition.h"
#include "format/nvfp4.h"
#include "io/tensor_names.h"

namespace moesq::compress {

Method parse_method(const std::string& s) {
  if (s == "rtn-nvfp4") return Method::RtnNvfp4;
  if (s == "magnitude") return Method::Magnitude;
  if (s == "sgptq") return Method::Sgptq;
  if (s == "moesq") return Method::Moesq;
  if (s == "jsq") return Method::Jsq;
  if (s == "obr") return Method::Obr;
  MOESQ_FAIL("--method: unknown method '", s, "' (expected rtn-nvfp4, magnitude, sgptq, moesq, jsq or obr)");
}

const char* method_name(Method m) {
  switch (m) {
    case Method::RtnNvfp4: return "rtn-nvfp4";
    case Method::Magnitude: return "magnitude";
    case Method::Sgptq: return "sgptq";
    case Method::Moesq: return "moesq";
    case Method::Jsq: return "jsq";
    case Method::Obr: return "obr";
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
  MOESQ_CHECK(opt.jsq.rho >= 0 && std::isfinite(opt.jsq.rho), "--jsq-rho: ", opt.jsq.rho, " must be a finite value >= 0");
  MOESQ_CHECK(opt.jsq.clip_high >= 0 && opt.jsq.clip_high < 1, "jsq: clip_high=", opt.jsq.clip_high, " must be in [0, 1)");
  MOESQ_CHECK(opt.jsq.rows_per_mean > 0, "jsq: rows_per_mean=", opt.jsq.rows_per_mean, " must be > 0");
  MOESQ_CHECK(opt.obr.alpha >= 0 && opt.obr.alpha <= 1, "--obr-alpha: ", opt.obr.alpha, " must be in [0, 1]");
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

}  // namespace

PackedExpert compress_expert(const io::ModelSpec& spec, const model::ExpertWeights& w, int64_t H, int64_t I,
                             const ExpertCalib& c, const std::vector<float>& y_ref, const CompressOptions& opt,
                             ExpertReport& rep) {
  // Biases and the clamped activation where the family has them (gpt-oss): every forward of the
  // expert below (down's Hessian inputs, the refinement) runs the family's expert, not plain SwiGLU.
  const model::ExpertVariant variant = model::expert_variant(spec, w);
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
    case Method::Jsq:
    case Method::Obr: {
      SolvedExpert s = opt.method == Method::Jsq
                           ? jsq_expert(w, H, I, c.X.data(), c.n, gs_gu, gs_d, opt.jsq, names, variant)
                           : obr_expert(w, H, I, c.X.data(), c.n, gs_gu, gs_d, opt.obr, opt.sgptq, names, variant);
      rep.fallback = s.fallback;
      rep.note = s.note;
      pe = std::move(s.packed);
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
      model::swiglu_forward(gq.data(), uq.data(), w.down.data(), H, I, c.X.data(), c.n, 0, &inter, variant);
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
        data.variant = variant;
        const ProjInit ig{rg.dense_rounded.data(), rg.patterns.data(), gs_gu, &rg.packed};
        const ProjInit iu{ru.dense_rounded.data(), ru.patterns.data(), gs_gu, &ru.packed};
        const ProjInit id{rd.dense_rounded.data(), rd.patterns.data(), gs_d, &rd.packed};
        RefineResult rr = refine_expert(data, ig, iu, id, opt.refine);
        rep.extra = {{"init_hard_loss", rr.init_hard_loss}, {"final_hard_loss", rr.final_hard_loss},
                     {"soft_loss", rr.curves.soft_loss}, {"hard_loss", rr.curves.hard_loss},
                     {"epoch_seconds", rr.curves.epoch_seconds}, {"train_rows", rr.train_rows},
                     {"heldout_rows", rr.heldout_rows}, {"steps", rr.steps},
                     {"pattern_change", rr.pattern_change}, {"seconds", rr.seconds}, {"skipped", rr.skipped},
                     {"selected_epoch", rr.selected_epoch},
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

namespace {

// Algorithm 1 line 2: H_1 = Embed(D), one [T, H] state per sequence, and where each sequence's rows
// start in the concatenated [n_total, H] layer input.
struct CalibStates {
  std::vector<std::vector<float>> h;  // [S][T_i, H]
  std::vector<int64_t> offset;        // [S + 1] first row of each sequence
  int64_t n_total() const { return offset.back(); }
};

CalibStates embed_calibration(const model::DecoderModel& m, const CalibSet& calib) {
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
std::vector<float> layer_moe_inputs(const model::DecoderModel& m, int64_t l, CalibStates& st, int threads) {
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
  const model::ExpertVariant variant = model::expert_variant(spec, w);  // biases stay in w throughout
  const std::vector<float> y_ref =
      model::swiglu_forward(w.gate.data(), w.up.data(), w.down.data(), H, I, c.X.data(), c.n, 0, nullptr, variant);
  PackedExpert pe = compress_expert(spec, w, H, I, c, y_ref, opt, rep);
  // Dequantized once: measured here, then installed.
  std::array<std::vector<float>, 3> deq = {pe.proj[0].dequantize(), pe.proj[1].dequantize(),
                                           pe.proj[2].dequantize()};
  if (c.n == 0) {
    rep.rel_error = std::numeric_limits<double>::quiet_NaN();
    if (rep.note.empty()) rep.note = "no calibration tokens (reconstruction error not measured)";
  } else {
    const std::vector<float> yq =
        model::swiglu_forward(deq[0].data(), deq[1].data(), deq[2].data(), H, I, c.X.data(), c.n, act_block, nullptr,
                              variant);
    rep.rel_error = rel_sq_error(y_ref, yq);
  }
  w.gate = std::move(deq[0]);
  w.up = std::move(deq[1]);
  w.down = std::move(deq[2]);
  return pe;
}

// Installs the dequantized weights of an expert compressed elsewhere (another rank, or a committed
// layer): the same PackedWeight::dequantize its owner installed, so every rank holds the same bits.
void install_packed(model::ExpertWeights& w, const PackedExpert& pe) {
  w.gate = pe.proj[0].dequantize();
  w.up = pe.proj[1].dequantize();
  w.down = pe.proj[2].dequantize();
}

// Every rank's share of layer l, exchanged (one allgather) and placed in expert order; the experts
// of the other ranks are installed here. Errors name the rank whose share is wrong.
std::vector<ExpertResult> exchange_layer(model::DecoderModel& m, int64_t l, std::vector<ExpertResult> own,
                                         dist::Communicator& comm) {
  const int64_t E = m.spec().num_experts;
  LayerRecord share;
  share.layer = l;
  share.experts = std::move(own);
  const std::vector<std::string> all = comm.allgather(encode_layer_record(share));
  std::vector<ExpertResult> layer(static_cast<size_t>(E));
  std::vector<char> seen(static_cast<size_t>(E), 0);
  std::vector<int64_t> foreign;  // experts compressed by other ranks
  for (int r = 0; r < comm.size(); ++r) {
    const std::string who = "from rank " + std::to_string(r);
    LayerRecord got = r == comm.rank() ? std::move(share) : decode_layer_record(all[static_cast<size_t>(r)], who);
    MOESQ_CHECK(got.layer == l, "layer record ", who, ": layer ", got.layer, " while exchanging layer ", l);
    for (ExpertResult& x : got.experts) {
      const int64_t e = x.report.expert;
      MOESQ_CHECK(e >= 0 && e < E && x.report.layer == l && dist::expert_owner(e, comm.size()) == r &&
                      !seen[static_cast<size_t>(e)],
                  "layer record ", who, ": expert ", x.report.layer, "/", e, " is not one of its experts of layer ", l);
      seen[static_cast<size_t>(e)] = 1;
      if (r != comm.rank()) foreign.push_back(e);
      layer[static_cast<size_t>(e)] = std::move(x);
    }
  }
  for (int64_t e = 0; e < E; ++e)
    MOESQ_CHECK(seen[static_cast<size_t>(e)], "layer ", l, ": no rank returned expert ", e, " (rank ",
                dist::expert_owner(e, comm.size()), " owns it)");
  parallel_for(static_cast<int64_t>(foreign.size()), [&](int64_t i) {
    const size_t e = static_cast<size_t>(foreign[static_cast<size_t>(i)]);
    install_packed(m.layer(l).experts[e], layer[e].packed);
  });
  return layer;
}

// Places a whole layer (in expert order) into the result; warns about fallbacks.
void place_layer(int64_t l, std::vector<ExpertResult> layer, CompressResult& res) {
  for (ExpertResult& x : layer) {
    if (x.report.fallback)
      progress("warning", "layer " + std::to_string(l) + " expert " + std::to_string(x.report.expert) + ": " + x.report.note);
    res.experts[static_cast<size_t>(l)][static_cast<size_t>(x.report.expert)] = std::move(x.packed);
    res.reports.push_back(std::move(x.report));
  }
}

// The experts of layer l this rank owns (dist::experts_of_rank; all of them on one rank), in
// parallel, each single-threaded inside (BLAS included); then the ranks exchange their shares.
// Returns the whole layer in expert order, every expert installed in `m`.
std::vector<ExpertResult> compress_layer(model::DecoderModel& m, int64_t l, const std::vector<ExpertCalib>& cal,
                                         const CompressOptions& opt, int act_block, dist::Communicator& comm) {
  const io::ModelSpec& spec = m.spec();
  const int64_t L = spec.num_layers, E = spec.num_experts, H = spec.hidden_size, I = spec.moe_intermediate_size;
  const std::vector<int64_t> mine = dist::experts_of_rank(E, comm.rank(), comm.size());
  const auto n_mine = static_cast<int64_t>(mine.size());
  const std::string share = comm.size() == 1 ? "" : " of rank " + std::to_string(comm.rank()) + " (" +
                                                     std::to_string(E) + " in the layer, " +
                                                     std::to_string(comm.size()) + " ranks)";
  std::vector<ExpertResult> own(mine.size());
  std::atomic<int64_t> done{0};
  parallel_for(n_mine, [&](int64_t i) {
    const int64_t e = mine[static_cast<size_t>(i)];
    ExpertReport& rep = own[static_cast<size_t>(i)].report;
    const ExpertCalib& c = cal[static_cast<size_t>(e)];
    rep.layer = l;
    rep.expert = e;
    rep.tokens = c.n;
    try {
      own[static_cast<size_t>(i)].packed =
          compress_and_install(spec, m.layer(l).experts[static_cast<size_t>(e)], H, I, c, opt, act_block, rep);
    } catch (const Error& err) {  // which expert failed (e.g. a refinement that diverged to NaN)
      MOESQ_FAIL("layer ", l, " expert ", e, " (--method ", method_name(opt.method), "): ", err.what());
    }
    const int64_t d = ++done;
    if (d % 8 == 0 || d == n_mine)
      progress("compress", "layer " + std::to_string(l + 1) + "/" + std::to_string(L) + ": " + std::to_string(d) +
                               "/" + std::to_string(n_mine) + " experts" + share + " (" + method_name(opt.method) + ")");
  }, opt.threads);
  if (comm.size() == 1) return own;
  return exchange_layer(m, l, std::move(own), comm);
}

// A committed layer (--resume): rank 0 reads it from the work dir, every rank gets it (broadcast)
// and installs its experts.
std::vector<ExpertResult> committed_layer(model::DecoderModel& m, int64_t l, const WorkDir* work,
                                          dist::Communicator& comm, std::string& next_inputs_sha256) {
  LayerRecord rec;
  if (comm.rank() == 0) rec = work->load(l);
  if (comm.size() > 1) {
    std::string bytes = comm.rank() == 0 ? encode_layer_record(rec) : std::string();
    comm.broadcast(bytes, 0);
    if (comm.rank() != 0) rec = decode_layer_record(bytes, "committed layer " + std::to_string(l) + " from rank 0");
  }
  const int64_t E = m.spec().is_moe_layer(l) ? m.spec().num_experts : 0;  // a dense layer: no experts
  MOESQ_CHECK(static_cast<int64_t>(rec.experts.size()) == E, "committed layer ", l, " holds ", rec.experts.size(),
              " experts, the model's layer has ", E);
  for (int64_t e = 0; e < E; ++e)
    MOESQ_CHECK(rec.experts[static_cast<size_t>(e)].report.expert == e, "committed layer ", l, ": expert ", e,
                " out of order");
  parallel_for(E, [&](int64_t e) {
    install_packed(m.layer(l).experts[static_cast<size_t>(e)], rec.experts[static_cast<size_t>(e)].packed);
  });
  next_inputs_sha256 = rec.next_inputs_sha256;
  return std::move(rec.experts);
}

// SHA-256 of the calibration states H_l (the next layer's inputs): the SHA-256 of the concatenated
// hex SHA-256s of every sequence's [T_i, H] fp32 rows.
std::string states_sha256(const CalibStates& st) {
  std::string per_sequence;
  for (const std::vector<float>& h : st.h) per_sequence += sha256_hex(h.data(), h.size() * sizeof(float));
  return sha256_hex(per_sequence.data(), per_sequence.size());
}

}  // namespace

CompressResult compress_model(model::DecoderModel& m, const CalibSet& calib, const CompressOptions& opt,
                              const RunContext& run) {
  const auto t0 = std::chrono::steady_clock::now();
  validate(opt);
  std::unique_ptr<dist::Communicator> alone;
  dist::Communicator* comm = run.comm;
  if (!comm) comm = (alone = dist::local_communicator()).get();
  MOESQ_CHECK(!run.work || comm->rank() == 0, "compress_model: the work dir belongs to rank 0, not rank ", comm->rank());
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
  // How many layers a previous run committed (rank 0 knows; everyone learns it).
  std::string committed = std::to_string(run.work ? run.work->committed_layers() : 0);
  comm->broadcast(committed, 0);
  res.resumed_layers = std::min<int64_t>(std::stoll(committed), L);
  if (res.resumed_layers > 0 && run.work)
    progress("resume", "layers 1-" + std::to_string(res.resumed_layers) + " of " + std::to_string(L) +
                           " committed in " + run.work->path() + ": installing them, continuing at layer " +
                           std::to_string(res.resumed_layers + 1));

  CalibStates st = embed_calibration(m, calib);
  for (int64_t l = 0; l < L; ++l) {
    const bool resumed = l < res.resumed_layers;
    progress("compress", "layer " + std::to_string(l + 1) + "/" + std::to_string(L) + ": attention + routing over " +
                             std::to_string(st.n_total()) + " calibration tokens" + (resumed ? " (committed)" : ""));
    const std::vector<float> X = layer_moe_inputs(m, l, st, opt.threads);  // [n_total, H]
    const bool moe = spec.is_moe_layer(l);  // a dense MLP layer is kept as stored: only propagated
    const size_t reports_before = res.reports.size();
    std::string committed_next_sha256;
    model::Routes routes;
    if (moe) routes = m.route(l, X, st.n_total());
    if (!moe) {
      if (resumed) committed_layer(m, l, run.work, *comm, committed_next_sha256);
    } else if (resumed) {
      place_layer(l, committed_layer(m, l, run.work, *comm, committed_next_sha256), res);
    } else {
      std::vector<ExpertCalib> cal = cache_expert_rows(X, routes, E, H);
      // Per-layer scope of the schedule rule: the mean training rows per expert (same split as refine).
      double train_sum = 0;
      for (const ExpertCalib& c : cal)
        train_sum += static_cast<double>(
            c.n - std::min<int64_t>(static_cast<int64_t>(std::floor(opt.refine.heldout_fraction * c.n)),
                                    std::max<int64_t>(c.n - 1, 0)));
      for (ExpertCalib& c : cal) c.schedule_rows = std::llround(train_sum / static_cast<double>(E));
      place_layer(l, compress_layer(m, l, cal, opt, act_block, *comm), res);
    }
    // H_{l+1} = Block_l(H_l) through the compressed (installed) layer, W4A4 (the shared expert, if
    // any, runs as stored inside moe_block).
    const std::vector<float> y = moe ? m.moe_block(l, X, routes, deployed) : m.dense_mlp(l, X, st.n_total());
    for (size_t i = 0; i < st.h.size(); ++i)
      for (int64_t j = st.offset[i] * H; j < st.offset[i + 1] * H; ++j) st.h[i][j - st.offset[i] * H] += y[j];
    if (resumed) {
      const std::string sha = states_sha256(st);
      MOESQ_CHECK(sha == committed_next_sha256, "--resume: the inputs of layer ", l + 2,
                  " recomputed through the committed layers differ from the committed run (SHA-256 ", sha, " vs ",
                  committed_next_sha256, "): this build or machine does not reproduce the committed bits; delete ",
                  run.work ? run.work->path() : std::string("the work directory"), " to start over");
    } else if (run.work) {
      LayerRecord rec;
      rec.layer = l;
      rec.next_inputs_sha256 = states_sha256(st);
      if (moe) {  // a dense layer commits a record of no experts (its next-inputs hash only)
        rec.experts.reserve(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e)
          rec.experts.push_back({res.experts[static_cast<size_t>(l)][static_cast<size_t>(e)],
                                 res.reports[reports_before + static_cast<size_t>(e)]});
      }
      run.work->commit(std::move(rec));
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace moesq::compress
