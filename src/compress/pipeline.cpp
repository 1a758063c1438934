#include "compress/pipeline.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "compress/layer_record.h"
#include "compress/refine/options.h"
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
#include "model/mixers/mla_mixer.h"

namespace moesq::compress {

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

bool gpu_method(const Method& m) { return &m == &methods::kSgptq || &m == &methods::kMoesq; }

void validate(const CompressOptions& opt) {
  MOESQ_CHECK(opt.threads >= 0, "--threads: ", opt.threads, " must be >= 0 (0 = all cores)");
  MOESQ_CHECK(opt.sgptq.percdamp >= 0 && std::isfinite(opt.sgptq.percdamp), "--percdamp: ",
              opt.sgptq.percdamp, " must be a finite value >= 0");
  MOESQ_CHECK(opt.sgptq.block_size > 0 && opt.sgptq.block_size % format::kSparseScaleBlock == 0,
              "sgptq: block_size=", opt.sgptq.block_size, " must be a positive multiple of ",
              format::kSparseScaleBlock);
  MOESQ_CHECK(opt.method, "compress: no method");
  if (opt.method->validate) opt.method->validate(opt);
  MOESQ_CHECK(opt.device == Device::kCpu || gpu_method(*opt.method), "--device cuda: --method ", opt.method->name,
              " runs on the CPU only (the GPU runs sgptq and moesq): use --device cpu");
  MOESQ_CHECK(opt.device == Device::kCpu ||
                  (opt.sgptq.device && opt.expert_device && (!opt.method->refines || opt.refine.device)),
              "--device cuda: the GPU solvers are not set (a build without CUDA?)");
}

RoutesByExpert routes_by_expert(const model::Routes& r, int64_t E) {
  const int64_t nk = r.n * r.k;
  MOESQ_CHECK(static_cast<int64_t>(r.expert.size()) == nk, "routes: ", r.expert.size(), " expert ids for n = ", r.n,
              ", top-k ", r.k);
  RoutesByExpert out;
  out.start.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < nk; ++i) {
    const int32_t e = r.expert[static_cast<size_t>(i)];
    MOESQ_CHECK(e >= 0 && e < E, "routes: route ", i, " names expert ", e, " of ", E);
    ++out.start[static_cast<size_t>(e) + 1];
  }
  for (int64_t e = 0; e < E; ++e) out.start[static_cast<size_t>(e) + 1] += out.start[static_cast<size_t>(e)];
  out.ids.resize(static_cast<size_t>(nk));
  std::vector<int64_t> fill(out.start.begin(), out.start.end() - 1);
  for (int64_t i = 0; i < nk; ++i) {
    int64_t& at = fill[static_cast<size_t>(r.expert[static_cast<size_t>(i)])];
    out.ids[static_cast<size_t>(at++)] = i;
  }
  return out;
}

std::string gpu_attention_refusal(const io::ModelSpec& s, const model::LayerWeights& L) {
  std::string why;
  auto no = [&](bool bad, const std::string& what) {
    if (bad) why += (why.empty() ? "" : ", ") + what;
  };
  if (const auto* mla = dynamic_cast<const model::MlaMixer*>(L.mixer.get())) {  // compress/mla_cuda.cu
    const model::MlaDims& d = mla->dims();
    const model::MlaWeights& w = mla->weights();
    no(!w.q_a_bias.empty() || !w.kv_a_bias.empty() || !w.o_bias.empty(), "its MLA projections have biases");
    no(d.qk_head_dim() > 256 || d.v_head_dim > 256, "its MLA head dims (q/k " + std::to_string(d.qk_head_dim()) +
                                                        ", v " + std::to_string(d.v_head_dim) + ") pass 256");
    no((d.num_heads + 1) * d.qk_rope_head_dim * 4 > 48 * 1024, "its heads × qk_rope_head_dim pass 12,288");
    no(s.rms_norm_unit_offset, "its RMSNorm weights are zero-centred");
    return why;
  }
  if (L.mixer) return "its token mixer (" + L.mixer->name() + ") is neither the built-in GQA attention nor MLA";
  no(s.qk_norm != io::QkNorm::PerHead, "its q/k norm is not per head");
  no(!L.q_bias.empty() || !L.k_bias.empty() || !L.v_bias.empty() || !L.o_bias.empty(),
     "its attention projections have biases");
  no(s.rms_norm_unit_offset, "its RMSNorm weights are zero-centred");
  no(s.head_dim % 64 != 0 || s.head_dim > 256, "head_dim " + std::to_string(s.head_dim) +
                                                  " is not a multiple of 64 up to 256");
  no(s.num_kv_heads <= 0 || s.num_heads % s.num_kv_heads != 0, "its query heads are not a multiple of its KV heads");
  return why;
}

std::vector<float> plain_mlp_on_device(const LayerDevice& dev, const model::ExpertWeights& W, int64_t H, int64_t I,
                                       const std::vector<float>& X, int64_t n, int64_t max_rows) {
  MOESQ_CHECK(dev.routed_experts, "the GPU layer device has no routed-expert path");
  MOESQ_CHECK(static_cast<int64_t>(X.size()) == n * H, "plain MLP on the GPU: X holds ", X.size(), " values for ", n,
              " rows of H = ", H);
  const int64_t chunk = max_rows > 0 ? max_rows : plain_mlp_chunk_rows(H, I);
  const std::vector<model::ExpertWeights> one = {W};
  std::vector<float> y(static_cast<size_t>(n * H));
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t m = std::min(chunk, n - r0);
    const std::vector<float> xs(X.begin() + r0 * H, X.begin() + (r0 + m) * H);
    const std::vector<float> ys = dev.routed_experts(one, H, I, xs, one_expert_routes(m), 0);
    std::copy(ys.begin(), ys.end(), y.begin() + r0 * H);
  }
  return y;
}

model::Routes one_expert_routes(int64_t m) {
  model::Routes r;
  r.n = m, r.k = 1;
  r.expert.assign(static_cast<size_t>(m), 0);
  r.weight.assign(static_cast<size_t>(m), 1.0f);
  return r;
}

int64_t plain_mlp_chunk_rows(int64_t H, int64_t I) {
  return std::max<int64_t>(1, (int64_t{2} << 30) / static_cast<int64_t>(sizeof(float)) / (2 * I + 2 * H));
}

bool device_resident(const model::DecoderModel& m, const CompressOptions& opt) {
  if (!opt.layer_device || !opt.layer_device->make_states) return false;
  const io::ModelSpec& s = m.spec();
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (!gpu_attention_refusal(s, m.layer(l)).empty()) return false;
    // A shared expert with a sigmoid gate (Qwen2-MoE) runs on the CPU: the states must come back.
    if (s.is_moe_layer(l) && s.num_shared_experts > 0 && !m.layer(l).shared_expert_gate.empty()) return false;
  }
  return true;
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

}  // namespace

PackedExpert compress_expert(const io::ModelSpec& spec, const model::ExpertWeights& w, int64_t H, int64_t I,
                             const ExpertCalib& c, const std::vector<float>& y_ref, const CompressOptions& opt,
                             ExpertReport& rep, const DeviceRows* dev) {
  // Biases and the clamped activation where the family has them (gpt-oss): every forward of the
  // expert below (down's Hessian inputs, the refinement) runs the family's expert, not plain SwiGLU.
  const model::ExpertVariant variant = model::expert_variant(spec, w);
  // gate and up share one tensor scale (DESIGN.md §3); down has its own (Eq. 5).
  const float gs_gu = format::gate_up_tensor_scale(w.gate.data(), w.up.data(), I * H);
  const float gs_d = format::nvfp4_tensor_scale(format::amax_abs(w.down.data(), H * I));
  ExpertJob job{.w = w, .H = H, .I = I, .calib = c, .y_ref = y_ref, .variant = variant, .gs_gu = gs_gu, .gs_d = gs_d,
               .names = {}, .dev = dev};
  for (int p = 0; p < 3; ++p)
    job.names[p] = io::expert_tensor_prefix(spec, rep.layer, rep.expert, static_cast<io::ExpertProj>(p)) + io::kWeight;
  return opt.method->compress(job, opt, rep);
}

PackedExpert compress_and_install(const io::ModelSpec& spec, model::ExpertWeights& w, int64_t H, int64_t I,
                                  const ExpertCalib& c, const CompressOptions& opt, int act_block, ExpertReport& rep) {
  // The original expert runs once: its outputs are the refinement targets and the reference of
  // the reconstruction error.
  const model::ExpertVariant variant = model::expert_variant(spec, w);  // biases stay in w throughout
  // On the GPU (the rows and targets stay there for every stage), or on the CPU.
  const ExpertDevice* gpu = c.n > 0 ? opt.expert_device : nullptr;
  using Clock = std::chrono::steady_clock;
  auto t = Clock::now();
  auto lap = [&t](double& into) {
    const auto now = Clock::now();
    into += std::chrono::duration<double>(now - t).count();
    t = now;
  };
  const DeviceRows rows = gpu ? gpu->rows(w, H, I, c) : DeviceRows{};
  MOESQ_CHECK(!gpu || c.X_target.empty(), "compress: targets from the original model's states run on the CPU only");
  // y_same: the original expert on X (the reconstruction error's reference, and the targets by default);
  // with original-model targets (c.X_target) the refinement's targets are the original expert on those.
  const std::vector<float> y_same =
      gpu ? std::vector<float>()
          : model::swiglu_forward(w.gate.data(), w.up.data(), w.down.data(), H, I, c.X.data(), c.n, 0, nullptr, variant);
  const std::vector<float> y_target =
      c.X_target.empty() ? std::vector<float>()
                         : model::swiglu_forward(w.gate.data(), w.up.data(), w.down.data(), H, I, c.X_target.data(),
                                                 c.n, 0, nullptr, variant);
  const std::vector<float>& y_ref = c.X_target.empty() ? y_same : y_target;
  lap(rep.stage_seconds.targets);
  PackedExpert pe = compress_expert(spec, w, H, I, c, y_ref, opt, rep, gpu ? &rows : nullptr);
  lap(rep.stage_seconds.solve);
  // Dequantized once: measured here, then installed.
  std::array<std::vector<float>, 3> deq = {pe.proj[0].dequantize(), pe.proj[1].dequantize(),
                                           pe.proj[2].dequantize()};
  if (c.n == 0) {
    rep.rel_error = std::numeric_limits<double>::quiet_NaN();
    if (rep.note.empty()) rep.note = "no calibration tokens (reconstruction error not measured)";
  } else if (gpu) {
    rep.rel_error =
        gpu->rel_error(rows, c.n, H, I, deq[0].data(), deq[1].data(), deq[2].data(), act_block, c.dev_Yq);
    if (c.dev_Yq && c.dev_Yq_kept) *c.dev_Yq_kept = 1;  // after the stream work above finished (rel_error waits)
  } else {
    const std::vector<float> yq =
        model::swiglu_forward(deq[0].data(), deq[1].data(), deq[2].data(), H, I, c.X.data(), c.n, act_block, nullptr,
                              variant);
    rep.rel_error = rel_sq_error(y_same, yq);
  }
  lap(rep.stage_seconds.error);
  w.gate = std::move(deq[0]);
  w.up = std::move(deq[1]);
  w.down = std::move(deq[2]);
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

// h += y for every calibration row (y [n_total, H], the rows of all sequences concatenated).
void add_to_states(CalibStates& st, const std::vector<float>& y, int64_t H) {
  for (size_t i = 0; i < st.h.size(); ++i)
    for (int64_t j = st.offset[i] * H; j < st.offset[i + 1] * H; ++j) st.h[i][j - st.offset[i] * H] += y[j];
}

// Attention of layer l on every sequence (states updated in place), then the MoE inputs of all rows,
// X [n_total, H]. On the GPU when `dev` is given and the layer allows it (gpu_attention_refusal);
// else parallel over sequences, each forward single-threaded inside.
std::vector<float> layer_moe_inputs(const model::DecoderModel& m, int64_t l, CalibStates& st, int threads,
                                    const LayerDevice* dev) {
  if (dev && dev->moe_inputs && gpu_attention_refusal(m.spec(), m.layer(l)).empty())
    return dev->moe_inputs(m.spec(), m.layer(l), st.h);
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

// Algorithm 1 line 4: the rows routed to each expert with their router weights and the sequence each
// row comes from (offset: [S + 1] first row of each sequence), cached once. Each expert's rows are in
// token order; the experts are filled in parallel (a real layer copies ≈ 17 GB here: n·k rows of H).
// With dev_X (device-resident states) the experts get the row ids into it (c.rows, c.dev_X) and X is unused;
// with dev_Yq ([n·k, H], DeviceStates::expert_outputs) expert e's outputs go to its rows' slots there, and
// kept[e] (E entries) is set when they are written.
// X_target ([n_total, H] or empty): the same tokens in the original model's states, cached beside X
// (ExpertCalib::X_target).
std::vector<ExpertCalib> cache_expert_rows(const std::vector<float>& X, const float* dev_X, const model::Routes& routes,
                                           int64_t E, int64_t H, const std::vector<int64_t>& offset, int threads,
                                           float* dev_Yq = nullptr, uint8_t* kept = nullptr,
                                           const std::vector<float>& X_target = {}) {
  const int64_t k = routes.k, n = routes.n;
  const RoutesByExpert by = routes_by_expert(routes, E);
  const std::vector<int64_t>& start = by.start;
  const std::vector<int64_t>& ids = by.ids;
  std::vector<int32_t> seq_of(static_cast<size_t>(n));  // the sequence of each row
  for (size_t q = 0; q + 1 < offset.size(); ++q)
    std::fill(seq_of.begin() + offset[q], seq_of.begin() + offset[q + 1], static_cast<int32_t>(q));
  std::vector<ExpertCalib> cal(static_cast<size_t>(E));
  parallel_for(E, [&](int64_t e) {
    ExpertCalib& c = cal[static_cast<size_t>(e)];
    const int64_t b = start[static_cast<size_t>(e)];
    c.n = start[static_cast<size_t>(e) + 1] - b;
    c.dev_X = dev_X;
    if (dev_Yq && kept) {
      c.dev_Yq = dev_Yq + b * H;
      c.dev_Yq_kept = kept + e;
    }
    if (dev_X) c.rows.resize(static_cast<size_t>(c.n));
    else c.X.resize(static_cast<size_t>(c.n * H));
    if (!X_target.empty()) c.X_target.resize(static_cast<size_t>(c.n * H));
    c.g.resize(static_cast<size_t>(c.n));
    c.seq.resize(static_cast<size_t>(c.n));
    for (int64_t i = 0; i < c.n; ++i) {
      const int64_t route = ids[static_cast<size_t>(b + i)], r = route / k;
      if (dev_X) c.rows[static_cast<size_t>(i)] = r;
      else std::copy(X.begin() + r * H, X.begin() + (r + 1) * H, c.X.begin() + i * H);
      if (!X_target.empty())
        std::copy(X_target.begin() + r * H, X_target.begin() + (r + 1) * H, c.X_target.begin() + i * H);
      c.g[static_cast<size_t>(i)] = routes.weight[static_cast<size_t>(route)];
      c.seq[static_cast<size_t>(i)] = seq_of[static_cast<size_t>(r)];
    }
    c.num_sequences = static_cast<int64_t>(offset.size()) - 1;
  }, threads);
  return cal;
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
      progress("warning", layer_label(l, static_cast<int64_t>(res.experts.size())) + " expert " +
                              std::to_string(x.report.expert) + ": " + x.report.note);
    res.experts[static_cast<size_t>(l)][static_cast<size_t>(x.report.expert)] = std::move(x.packed);
    res.reports.push_back(std::move(x.report));
  }
}

// The experts of layer l this rank owns (dist::experts_of_rank; all of them on one rank), in
// parallel, each single-threaded inside (BLAS included); then the ranks exchange their shares.
// Returns the whole layer in expert order, every expert installed in `m`. dev (device-resident
// states, or null) samples the free GPU memory after each expert (DeviceStates::note_memory).
std::vector<ExpertResult> compress_layer(model::DecoderModel& m, int64_t l, const std::vector<ExpertCalib>& cal,
                                         const CompressOptions& opt, int act_block, dist::Communicator& comm,
                                         DeviceStates* dev) {
  const io::ModelSpec& spec = m.spec();
  const int64_t L = spec.num_layers, E = spec.num_experts, H = spec.hidden_size, I = spec.moe_intermediate_size;
  const std::vector<int64_t> mine = dist::experts_of_rank(E, comm.rank(), comm.size());
  const auto n_mine = static_cast<int64_t>(mine.size());
  const std::string share = comm.size() == 1 ? "" : " of rank " + std::to_string(comm.rank()) + " (" +
                                                     std::to_string(E) + " in the layer, " +
                                                     std::to_string(comm.size()) + " ranks)";
  std::vector<ExpertResult> own(mine.size());
  std::atomic<int64_t> done{0};
  const auto t0 = std::chrono::steady_clock::now();
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
      MOESQ_FAIL(layer_label(l, L), " expert ", e, " (--method ", opt.method->name, "): ", err.what());
    }
    if (dev) dev->note_memory();  // this worker's scratch is still held (DeviceStates::expert_outputs)
    const int64_t d = ++done;
    if (d % 8 == 0 || d == n_mine) {
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string eta = eta_text(t, static_cast<double>(d), static_cast<double>(n_mine));
      progress("compress", "layer " + std::to_string(l + 1) + "/" + std::to_string(L) + ": " + std::to_string(d) +
                               "/" + std::to_string(n_mine) + " experts" + share + " (" + opt.method->name +
                               (opt.device == Device::kCuda ? ", on the GPU" : "") + "), " + duration_text(t) +
                               (eta.empty() ? "" : ", " + eta + " for the layer"));
    }
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
  const int act_block = opt.method->sparse ? format::kActScaleBlock : format::kDenseScaleBlock;
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
  // RefineOptions::original_targets: the original model's states, run beside the compressed ones
  // through the same attention and the ORIGINAL experts (each layer's before they are replaced).
  const bool original_stream = opt.method->refines && opt.refine.original_targets;
  CalibStates orig;
  if (original_stream) orig = st;
  // Every layer on the GPU: the states stay there (no per-layer round trips of H_l and X).
  std::unique_ptr<DeviceStates> dev;
  if (device_resident(m, opt)) {
    dev = opt.layer_device->make_states();
    dev->upload(st.h, H);
    progress("compress", "the " + std::to_string(st.n_total()) + " calibration states stay on the GPU (" +
                             std::to_string(st.n_total() * H * 4 / 1000000) + " MB)");
  }
  using Clock = std::chrono::steady_clock;
  for (int64_t l = 0; l < L; ++l) {
    const bool resumed = l < res.resumed_layers;
    LayerSeconds& ls = res.layer_seconds.emplace_back();
    ls.layer = l;
    auto t = Clock::now();
    auto lap = [&t](double& into) {
      const auto now = Clock::now();
      into = std::chrono::duration<double>(now - t).count();
      t = now;
    };
    progress("compress", "layer " + std::to_string(l + 1) + "/" + std::to_string(L) + ": attention + routing over " +
                             std::to_string(st.n_total()) + " calibration tokens" + (resumed ? " (committed)" : ""));
    // [n_total, H]: on the host, or on the device (dev_X) with device-resident states
    const float* dev_X = dev ? dev->attention(spec, m.layer(l)) : nullptr;
    const std::vector<float> X = dev ? std::vector<float>() : layer_moe_inputs(m, l, st, opt.threads, opt.layer_device);
    ls.attention = std::chrono::duration<double>(Clock::now() - t).count();
    const bool moe = spec.is_moe_layer(l);  // a dense MLP layer is kept as stored: only propagated
    if (moe) m.load_experts(l);  // experts on demand: this layer's only, until it is propagated
    const size_t reports_before = res.reports.size();
    std::string committed_next_sha256;
    std::vector<uint8_t> kept;  // [E] or empty: the experts whose W4A4 outputs the error stage left on the GPU
    model::Routes routes;
    if (moe) {
      if (dev)
        routes = m.route_logits(l, dev->router_logits(m.layer(l).router, E), st.n_total());
      else if (opt.layer_device && opt.layer_device->router_logits)  // the device-resident path's GEMM
        routes = m.route_logits(l, opt.layer_device->router_logits(X, st.n_total(), H, m.layer(l).router, E),
                                st.n_total());
      else
        routes = m.route(l, X, st.n_total());
    }
    // The original stream's layer: its MoE inputs, then its MLP part through the original weights
    // (before this layer's experts are replaced); its states advance here.
    std::vector<float> X_orig;
    if (original_stream) {
      X_orig = layer_moe_inputs(m, l, orig, opt.threads, nullptr);
      model::ForwardOptions plain;
      plain.threads = opt.threads;
      add_to_states(orig, m.ffn_block(l, X_orig, orig.n_total(), plain), H);
    }
    if (!moe) {
      lap(ls.routing);
      if (resumed) committed_layer(m, l, run.work, *comm, committed_next_sha256);
    } else if (resumed) {
      lap(ls.routing);
      place_layer(l, committed_layer(m, l, run.work, *comm, committed_next_sha256), res);
    } else {
      float* dev_Yq = dev ? dev->expert_outputs(routes.n * routes.k) : nullptr;
      if (dev)
        progress("compress", "layer " + std::to_string(l + 1) + ": the experts' outputs " +
                                 (dev_Yq ? "stay on the GPU for the propagation (" +
                                               std::to_string(routes.n * routes.k * H * 4 / 1000000) + " MB)"
                                         : "are recomputed by the propagation (the workers' need for GPU memory is "
                                           "not yet sampled, or it leaves no room)"));
      if (dev_Yq) kept.assign(static_cast<size_t>(E), 0);
      std::vector<ExpertCalib> cal =
          cache_expert_rows(X, dev_X, routes, E, H, st.offset, opt.threads, dev_Yq, dev_Yq ? kept.data() : nullptr,
                            X_orig);
      // Per-layer scope of the schedule rule: the mean training rows per expert (same split as refine).
      double train_sum = 0;
      for (const ExpertCalib& c : cal)
        train_sum += static_cast<double>(c.n - heldout_rows(opt.refine, c.n));
      for (ExpertCalib& c : cal) c.schedule_rows = std::llround(train_sum / static_cast<double>(E));
      lap(ls.routing);
      std::vector<ExpertResult> layer = compress_layer(m, l, cal, opt, act_block, *comm, dev.get());
      for (const ExpertResult& x : layer) {
        if (dist::expert_owner(x.report.expert, comm->size()) != comm->rank()) continue;  // timed by its rank
        ls.targets += x.report.stage_seconds.targets;
        ls.solve += x.report.stage_seconds.solve;
        ls.error += x.report.stage_seconds.error;
        if (x.report.extra.is_object() && x.report.extra.contains("seconds") &&
            x.report.extra["seconds"].is_number())
          ls.refinement += x.report.extra["seconds"].get<double>();
        const ExpertReport::StageSeconds& st = x.report.stage_seconds;
        ls.refine_prepare += st.refine_prepare;
        ls.refine_start += st.refine_start;
        ls.refine_optimize += st.refine_optimize;
        ls.refine_steps += st.refine_steps;
        ls.refine_finish += st.refine_finish;
      }
      place_layer(l, std::move(layer), res);
    }
    lap(ls.experts);
    // H_{l+1} = Block_l(H_l) through the compressed (installed) layer, W4A4 (the shared expert, if
    // any, runs as stored: inside moe_block, or on the CPU after the GPU's routed experts).
    std::vector<float> y;
    if (dev) {  // device-resident: h += the layer's MLP part on the device; H_l comes back only to be hashed
      const model::LayerWeights& LW = m.layer(l);
      if (!moe)
        dev->propagate_mlp(LW.dense_mlp, spec.intermediate_size);
      else
        dev->propagate(LW.experts, spec.moe_intermediate_size, routes, act_block, kept,
                       LW.shared_expert.gate.empty() ? nullptr : &LW.shared_expert,
                       spec.shared_expert_intermediate_size);
      if (resumed || run.work) dev->download(st.h);
    } else if (!moe) {  // a dense MLP layer (DeepSeek-V3 / Kimi-K2's first): on the GPU when there is one
      y = opt.layer_device ? plain_mlp_on_device(*opt.layer_device, m.layer(l).dense_mlp, H, spec.intermediate_size, X,
                                                 st.n_total())
                           : m.dense_mlp(l, X, st.n_total());
    } else if (opt.layer_device) {
      y = opt.layer_device->routed_experts(m.layer(l).experts, H, spec.moe_intermediate_size, X, routes, act_block);
      if (!m.layer(l).shared_expert.gate.empty()) {  // routed + shared, as moe_block adds them
        const model::LayerWeights& L = m.layer(l);  // an ungated shared expert on the GPU too
        const std::vector<float> ys =
            L.shared_expert_gate.empty()
                ? plain_mlp_on_device(*opt.layer_device, L.shared_expert, H, spec.shared_expert_intermediate_size, X,
                                      st.n_total())
                : m.shared_expert_forward(l, X, st.n_total());
        for (size_t i = 0; i < y.size(); ++i) y[i] += ys[i];
      }
    } else {
      y = m.moe_block(l, X, routes, deployed);
    }
    if (!dev) add_to_states(st, y, H);
    m.release_experts(l);  // experts on demand: res holds the packed layer from here on
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
    lap(ls.propagation);
    // The run's ETA from the mean of the layers computed so far (committed ones cost a fraction).
    double spent = 0;
    int64_t computed = 0;
    for (const LayerSeconds& x : res.layer_seconds) {
      if (x.layer < res.resumed_layers) continue;
      spent += x.routing + x.experts + x.propagation;
      ++computed;
    }
    const std::string eta = computed > 0 ? eta_text(spent, static_cast<double>(computed),
                                                    static_cast<double>(L - res.resumed_layers))
                                         : std::string();
    progress("compress", layer_label(l, L) + " done in " +
                             duration_text(ls.routing + ls.experts + ls.propagation) + " (routing " +
                             duration_text(ls.routing) + ", experts " + duration_text(ls.experts) + ", propagation " +
                             duration_text(ls.propagation) + ")" + (eta.empty() ? "" : "; " + eta + " for the run"));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace moesq::compress
