// `moesq bench compress --synthetic qwen3-30b-a3b [--layers 1] [--methods sgptq,moesq] [--device auto]
// [compress's flags] [--json]`: paper Algorithm 1 — `moesq compress`'s own compress_model, options and
// device choice — on a model of a real config's exact shapes whose weights are drawn from --weight-seed
// (no checkpoint), with random calibration tokens (--calib-samples × --seq-len). Per method and layer:
// the wall seconds of each stage (routing: attention + router + row cache; experts; propagation through
// the compressed layer), what the expert stage is made of (Σ per-expert worker wall: targets, the
// method's solve (SGPTQ for sgptq and moesq), refinement, error), the peak host memory, and the whole
// model extrapolated from the layers run (the first MoE layer once, the others at the later MoE layers' mean).
//
// Non-obvious decision: the weights are drawn on the CPU into the CPU model (compress_model's input
// is a model::DecoderModel); the model is drawn again for each method, since compression replaces its
// experts. Random weights and tokens time the stages; they say nothing of quality (docs/RESULTS.md
// measures that on the trained fixture).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/compress_flags.h"
#include "compress/pipeline.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/splitmix64.h"
#include "core/threads.h"
#include "model/decoder.h"
#include "model/mixers/mla_mixer.h"
#include "runtime/weights.h"
#ifdef MOESQ_HAVE_CUDA
#include "core/cuda/gpu_memory_peak.h"
#endif

namespace moesq::cli {

namespace {

struct BenchCompressArgs {
  std::string synthetic, methods = "sgptq,moesq", device = "auto";
  int64_t layers = 1, num_experts = 0;
  uint64_t weight_seed = 1;
  bool json = false;
  CompressFlags flags;
};

// v[i] ~ N(mean, std²), i in [0, n), drawn in 64k-element chunks, each from its own counter stream
// (Box–Muller in fp32 on two 24-bit uniforms of one splitmix64 draw, |z| < 5.9): the same values for
// any thread count. fp32 (not fp64) math: Kimi-K2.5's 17.6 G expert weights per layer took 102 s to
// draw in fp64 on 16 threads (session 20), device time spent before compression starts.
void fill_normal(std::vector<float>& v, uint64_t seed, float std_dev, float mean = 0.0f) {
  constexpr int64_t kChunk = 1 << 16;
  const auto n = static_cast<int64_t>(v.size());
  parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
    SplitMix64 r(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(c));
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); i += 2) {
      const uint64_t x = r.next();
      const float u1 = (static_cast<float>(x >> 40) + 0.5f) * 0x1.0p-24f;
      const float u2 = (static_cast<float>((x >> 16) & 0xFFFFFFu) + 0.5f) * 0x1.0p-24f;
      const float m = std::sqrt(-2.0f * std::log(u1)) * std_dev;
      const float a = 6.2831853f * u2;
      v[static_cast<size_t>(i)] = mean + m * std::cos(a);
      if (i + 1 < n) v[static_cast<size_t>(i + 1)] = mean + m * std::sin(a);
    }
  });
}

// The spec's weights from `seed`: embeddings N(0, 1), every projection N(0, 0.02²) (router logits of
// std ≈ 0.9 on RMS-normed states at H = 2048; multi-head latent attention's for kimi-k2.5, shared experts
// and dense MLP layers too), norms 1. The lm_head stays zero (compression never runs it).
void draw_weights(model::DecoderModel& m, uint64_t seed) {
  uint64_t k = seed * 1000;
  fill_normal(m.embed_weight(), ++k, 1.0f);
  for (float& x : m.final_norm_weight()) x = 1.0f;
  for (int64_t l = 0; l < m.spec().num_layers; ++l) {
    model::LayerWeights& L = m.layer(l);
    for (std::vector<float>* v : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.router}) fill_normal(*v, ++k, 0.02f);
    for (std::vector<float>* v : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm})
      for (float& x : *v) x = 1.0f;
    for (model::ExpertWeights& e : L.experts)
      for (std::vector<float>* v : {&e.gate, &e.up, &e.down}) fill_normal(*v, ++k, 0.02f);
    for (std::vector<float>* v : {&L.dense_mlp.gate, &L.dense_mlp.up, &L.dense_mlp.down}) fill_normal(*v, ++k, 0.02f);
    if (!L.shared_expert.gate.empty())  // (only where present: the other models' seeds stay as they were)
      for (std::vector<float>* v : {&L.shared_expert.gate, &L.shared_expert.up, &L.shared_expert.down})
        fill_normal(*v, ++k, 0.02f);
    if (m.spec().mla.kv_lora_rank > 0) {  // multi-head latent attention replaces the GQA projections
      std::shared_ptr<model::MlaMixer> mla = model::zero_mla_mixer(m.spec());
      model::MlaWeights& w = mla->mutable_weights();
      for (std::vector<float>* v : {&w.q_proj, &w.q_a_proj, &w.q_b_proj, &w.kv_a_proj, &w.kv_b_proj, &w.o_proj})
        fill_normal(*v, ++k, 0.02f);
      for (std::vector<float>* v : {&w.q_a_norm, &w.kv_a_norm})
        for (float& x : *v) x = 1.0f;
      for (std::vector<float>* v : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.q_norm, &L.k_norm})
        std::vector<float>().swap(*v);
      L.mixer = std::move(mla);
    }
  }
}

compress::CalibSet random_calibration(int64_t samples, int64_t seq_len, int64_t vocab, uint64_t seed) {
  compress::CalibSet c;
  c.source = "random tokens (seed " + std::to_string(seed) + ")";
  SplitMix64 r(seed + 0xC0FFEEull);
  c.sequences.assign(static_cast<size_t>(samples), std::vector<int32_t>(static_cast<size_t>(seq_len)));
  for (auto& s : c.sequences)
    for (int32_t& t : s) t = static_cast<int32_t>(r.next() % static_cast<uint64_t>(vocab));
  return c;
}

double peak_host_gb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0 / 1e9;  // ru_maxrss: KiB on Linux
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ','))
    if (!x.empty()) out.push_back(x);
  return out;
}

void run_bench_compress(const BenchCompressArgs& a) {
  MOESQ_CHECK(!a.synthetic.empty(), "bench compress: give --synthetic MODEL");
  MOESQ_CHECK(a.layers >= 1, "--layers: ", a.layers, " must be >= 1");
  io::ModelSpec spec = runtime::synthetic_spec(a.synthetic, 0);
  MOESQ_CHECK(!runtime::synthetic_is_hybrid(a.synthetic), "bench compress --synthetic ", a.synthetic,
              ": its Gated DeltaNet layers have no synthetic CPU model yet (bench e2e and serve run it on the GPU); "
              "use qwen3-30b-a3b, qwen3-235b-a22b or kimi-k2.5");
  const int64_t model_layers = spec.num_layers;
  int64_t model_moe_layers = 0;  // the whole model's MoE layers (kimi-k2.5: 60 of 61; the first is dense)
  for (int64_t l = 0; l < model_layers; ++l) model_moe_layers += spec.is_moe_layer(l) ? 1 : 0;
  MOESQ_CHECK(a.layers <= model_layers, "--layers: ", a.layers, " is more than ", a.synthetic, "'s ", model_layers);
  spec.num_layers = a.layers;
  if (a.num_experts > 0) {
    MOESQ_CHECK(a.num_experts >= spec.top_k, "--num-experts: ", a.num_experts, " is fewer than top-k ", spec.top_k);
    spec.num_experts = a.num_experts;
  }
  if (a.flags.opt.threads > 0) set_num_threads(a.flags.opt.threads);
  const std::vector<std::string> methods = split(a.methods);
  MOESQ_CHECK(!methods.empty(), "--methods: no method given");
  std::vector<compress::CompressOptions> opts;
  for (const std::string& name : methods) {
    opts.push_back(a.flags.options(name));  // compress's defaults and flags, validated
    resolve_device(a.device, spec, opts.back(), a.flags.gpu_gemm);
  }
  const compress::CalibSet calib = random_calibration(a.flags.calib_samples, a.flags.seq_len, spec.vocab_size,
                                                      a.flags.opt.refine.seed);
  progress("bench compress",
           "synthetic " + a.synthetic + ": " + std::to_string(a.layers) + " of " + std::to_string(model_layers) +
               " layers, " + std::to_string(spec.num_experts) + " experts (H " + std::to_string(spec.hidden_size) +
               ", I " + std::to_string(spec.moe_intermediate_size) + "), " + std::to_string(calib.sequences.size()) +
               " x " + std::to_string(a.flags.seq_len) + " calibration tokens, " + std::to_string(num_threads()) +
               " threads");
  FILE* table = a.json ? stderr : stdout;  // --json: stdout is the JSON object alone
  nlohmann::json runs = nlohmann::json::array();
  for (size_t i = 0; i < methods.size(); ++i) {
    const compress::CompressOptions& opt = opts[i];
    const auto t0 = std::chrono::steady_clock::now();
    model::DecoderModel m(spec);
    draw_weights(m, a.weight_seed);
    const double draw_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress("bench compress", std::string(opt.method->name) + " on " + compress::device_name(opt.device) +
                                   " (weights drawn in " + duration_text(draw_s) + ")");
    double peak_gpu_gb = -1;  // < 0: not measured (a CPU run, or a build without CUDA)
#ifdef MOESQ_HAVE_CUDA
    std::unique_ptr<GpuMemoryPeak> peak;
    if (opt.device == compress::Device::kCuda) peak = std::make_unique<GpuMemoryPeak>();
#endif
    const compress::CompressResult r = compress::compress_model(m, calib, opt);
#ifdef MOESQ_HAVE_CUDA
    if (peak) {
      peak->stop();
      peak_gpu_gb = peak->peak_in_use_gb();
    }
#endif
    nlohmann::json layers = nlohmann::json::array();
    double sum = 0;
    std::fprintf(table, "%s (--device %s):\n", opt.method->name, compress::device_name(opt.device));
    for (const compress::LayerSeconds& x : r.layer_seconds) {
      const double total = x.routing + x.experts + x.propagation;
      sum += total;
      std::fprintf(table, "  layer %lld: routing %.2f s (attention %.2f) | experts %.2f s (per-expert worker wall summed: targets %.2f, "
                  "solve %.2f, refinement %.2f, error %.2f) | propagation %.2f s | %.2f s\n",
                  static_cast<long long>(x.layer + 1), x.routing, x.attention, x.experts, x.targets, x.solve - x.refinement,
                  x.refinement, x.error, x.propagation, total);
      if (x.refinement > 0)
        std::fprintf(table, "    refinement summed: prepare %.2f | start %.2f | optimize %.2f (steps issued %.2f, the rest "
                            "evals and best-epoch snapshots) | finish %.2f s\n",
                     x.refine_prepare, x.refine_start, x.refine_optimize, x.refine_steps, x.refine_finish);
      layers.push_back({{"layer", x.layer},
                        {"routing_s", x.routing},
                        {"attention_s", x.attention},
                        {"experts_s", x.experts},
                        {"propagation_s", x.propagation},
                        {"total_s", total},
                        {"expert_stages_summed_s",
                         {{"targets", x.targets}, {"solve", x.solve - x.refinement}, {"refinement", x.refinement},
                          {"error", x.error}}},
                        {"refinement_stages_summed_s",
                         {{"prepare", x.refine_prepare}, {"start", x.refine_start}, {"optimize", x.refine_optimize},
                          {"steps_issued", x.refine_steps}, {"finish", x.refine_finish}}}});
    }
    // The whole model from the layers run: dense layers at the mean of the dense layers run (or of all
    // layers run when none of a kind ran). The first MoE layer counts once as measured and the model's other
    // MoE layers at the mean of the later MoE layers run, when any ran: the first pays one-time costs the
    // later ones do not (first use of the GPU path's kernels and handles; no kept expert outputs, whose GPU
    // buffer is granted from the previous MoE layer's sampled low watermark of free memory, so its
    // propagation recomputes them — bench/NOTES.md "Session 23").
    double moe_sum = 0, dense_sum = 0, moe_first = 0, moe_later_sum = 0;
    int64_t moe_n = 0, dense_n = 0;
    for (const compress::LayerSeconds& x : r.layer_seconds) {
      const double t = x.routing + x.experts + x.propagation;
      if (!spec.is_moe_layer(x.layer)) {
        dense_sum += t, ++dense_n;
        continue;
      }
      if (moe_n == 0) moe_first = t;
      else moe_later_sum += t;
      moe_sum += t, ++moe_n;
    }
    const double per_layer = sum / static_cast<double>(a.layers);
    const double moe_mean = moe_n ? moe_sum / static_cast<double>(moe_n) : per_layer;
    const double moe_later = moe_n >= 2 ? moe_later_sum / static_cast<double>(moe_n - 1) : moe_mean;
    const double dense_mean = dense_n ? dense_sum / static_cast<double>(dense_n) : per_layer;
    const double moe_model_s = moe_n >= 2 && model_moe_layers >= 2
                                   ? moe_first + moe_later * static_cast<double>(model_moe_layers - 1)
                                   : moe_mean * static_cast<double>(model_moe_layers);
    const double model_s = moe_model_s + dense_mean * static_cast<double>(model_layers - model_moe_layers);
    std::fprintf(table, "  mean %.2f s per layer (MoE layers %.2f s", per_layer, moe_mean);
    if (moe_n >= 2) std::fprintf(table, "; after the first %.2f s", moe_later);
    std::fprintf(table, ") -> %d layers: %.1f min (extrapolated); peak host memory %.1f GB",
                 static_cast<int>(model_layers), model_s / 60.0, peak_host_gb());
    if (peak_gpu_gb >= 0) std::fprintf(table, "; peak GPU memory in use %.1f GB (device-wide, sampled)", peak_gpu_gb);
    std::fprintf(table, "\n");
    runs.push_back({{"method", opt.method->name},
                    {"device", compress::device_name(opt.device)},
                    {"layers", layers},
                    {"mean_layer_s", per_layer},
                    {"mean_moe_layer_s", moe_mean},
                    {"later_moe_layer_s", moe_n >= 2 ? nlohmann::json(moe_later) : nlohmann::json(nullptr)},
                    {"model_extrapolated_s", model_s},
                    {"peak_host_gb", peak_host_gb()},
                    {"peak_gpu_gb", peak_gpu_gb >= 0 ? nlohmann::json(peak_gpu_gb) : nlohmann::json(nullptr)},
                    {"weights_drawn_s", draw_s}});
  }
  if (a.json) {
    const nlohmann::json j = {{"model", "synthetic:" + a.synthetic},
                              {"layers_run", a.layers},
                              {"model_layers", model_layers},
                              {"num_experts", spec.num_experts},
                              {"hidden_size", spec.hidden_size},
                              {"moe_intermediate_size", spec.moe_intermediate_size},
                              {"calibration", {{"sequences", calib.sequences.size()}, {"seq_len", a.flags.seq_len}}},
                              {"threads", num_threads()},
                              {"runs", runs}};
    std::printf("%s\n", j.dump(2).c_str());
  }
}

}  // namespace

void register_bench_compress(CLI::App* bench) {
  auto args = std::make_shared<BenchCompressArgs>();
  auto* cmd = bench->add_subcommand(
      "compress",
      "Algorithm 1 (compress's own pipeline and flags) on a synthetic model of a real config's shapes: per layer the\n"
      "seconds of routing, the experts (targets / solve / refinement / error) and the propagation, peak host memory,\n"
      "and on the GPU the peak device memory in use (sampled every 10 ms)");
  cmd->add_option("--synthetic", args->synthetic, "qwen3-30b-a3b | qwen3-235b-a22b | kimi-k2.5 (weights drawn from --weight-seed; kimi-k2.5: "
                  "its first layer is dense, so --layers 2 reaches an MoE layer; all 384 experts of one layer take "
                  "≈ 68 GB of host memory in fp32, --num-experts cuts them)")
      ->required();
  cmd->add_option("--layers", args->layers, "decoder layers to build and compress (the whole model is extrapolated)")
      ->capture_default_str();
  cmd->add_option("--num-experts", args->num_experts, "routed experts per layer (0: the config's)")
      ->capture_default_str();
  cmd->add_option("--methods", args->methods, "comma-separated --method values, each timed on a freshly drawn model")
      ->capture_default_str();
  cmd->add_option("--device", args->device, "as compress --device: auto | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--weight-seed", args->weight_seed, "seed of the synthetic weights")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object on stdout (the table goes to stderr)");
  add_compress_flags(cmd, args->flags, /*with_calib_files=*/false);
  cmd->callback([args] { run_bench_compress(*args); });
}

}  // namespace moesq::cli
