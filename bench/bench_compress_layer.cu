// bench_compress_layer: the expert stages of `moesq compress` for ONE MoE layer at a real model's
// shapes — per expert the targets Y = expert(X), the method's solve (sgptq: Hessians + SGPTQ; moesq:
// SGPTQ + the refinement) and the W4A4 reconstruction error, exactly as compress_model runs them
// (compress::compress_and_install, the experts in parallel on --threads workers) — on the GPU
// (compress --device cuda: compress/expert_cuda.h, compress/sgptq_cuda.h, refine/cuda_step_backend.h)
// and, as the peer measured in the same run, on the CPU (--device cpu: cblas/LAPACK, the same
// workers) for --cpu-experts experts, extrapolated to the layer (× E / experts run) and marked so.
// Not in it: the layer's attention + routing and the propagation through the compressed layer
// (compress runs them on the CPU so far).
//
// Data: each expert's weights N(0, 0.02²), its calibration rows X ~ N(0, 1) (RMS-normed hidden
// states), router weights g uniform in (0.05, 0.5); rows per expert = the default calibration's
// (2,048 × 128 tokens × top-k / E). The refinement runs `moesq compress`'s default schedule.
//
// Printed per method and device: the layer's wall time, the per-expert stage split (targets, SGPTQ,
// refinement, error; per worker thread), the peak GPU memory (sampled), the mean rel_error — and for
// the experts both devices ran, the GPU's rel_error against the CPU's.
//
// Refinement variants (moesq only; each a GPU row of its own, the CPU peer runs the first):
//   --gemm fp32,tf32        the refinement's GEMM precision (compress --gpu-gemm: fp32 | tf32 | tf32-backward | bf16-forward; default bf16-forward, as compress)
//   --step-sequences 0,64   0 = the per-expert row batches; S > 0 = the layer-wide schedule (compress
//                           --step-sequences S): each row gets one of --sequences calibration sequences
//                           (uniform, seeded), every step consumes S of them
//
// Usage: bench_compress_layer [--model qwen3-30b-a3b|kimi-k2.5] [--methods sgptq,moesq] [--experts E]
//                             [--rows N] [--threads T] [--cpu-experts 16] [--cpu-methods sgptq] [--out R.json]
//                             [--gemm bf16-forward] [--step-sequences 0] [--sequences 2048]
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "compress/expert_cuda.h"
#include "compress/method.h"
#include "compress/pipeline.h"
#include "core/cuda/gpu_memory_peak.h"
#include "compress/refine/cuda_step_backend.h"
#include "compress/sgptq_cuda.h"
#include "core/blas_threads.h"
#include "core/cuda/check.cuh"
#include "core/error.h"
#include "core/splitmix64.h"
#include "core/threads.h"
#include "io/config.h"

using namespace moesq;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  const char* name;
  int64_t H, I, E, topk;
};
constexpr Shape kShapes[] = {{"qwen3-30b-a3b", 2048, 768, 128, 8}, {"kimi-k2.5", 7168, 2048, 384, 8}};

// Normal draws from a counter (Box–Muller on splitmix64 uniforms): fast and seedable.
void fill_normal(std::vector<float>& v, size_t n, uint64_t seed, float std_dev) {
  v.resize(n);
  SplitMix64 r(seed);
  for (size_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(r.next() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (static_cast<double>(r.next() >> 11) + 0.5) * 0x1.0p-53;
    const double m = std::sqrt(-2.0 * std::log(u1)) * std_dev;
    v[i] = static_cast<float>(m * std::cos(6.283185307179586 * u2));
    if (i + 1 < n) v[i + 1] = static_cast<float>(m * std::sin(6.283185307179586 * u2));
  }
}

struct Expert {
  model::ExpertWeights w;
  compress::ExpertCalib c;
};

// The lowest free GPU memory seen while it lives (a 20 ms sampler thread).
struct Run {
  double seconds = 0, peak_gb = 0;
  int64_t experts = 0;
  double targets = 0, solve = 0, refine = 0, error = 0;  // Σ over experts (worker-thread wall)
  std::vector<double> rel_error;                         // per expert
};

Run run_layer(const io::ModelSpec& spec, const std::vector<Expert>& ex, int64_t count, const compress::CompressOptions& opt,
              int threads, bool gpu) {
  Run r;
  r.experts = count;
  r.rel_error.assign(static_cast<size_t>(count), 0.0);
  std::vector<compress::ExpertReport> reps(static_cast<size_t>(count));
  ScopedBlasSingleThread single_blas;  // as compress_model: the workers parallelize, BLAS does not
  std::unique_ptr<GpuMemoryPeak> peak;
  if (gpu) peak = std::make_unique<GpuMemoryPeak>();
  const auto t0 = Clock::now();
  parallel_for(count, [&](int64_t e) {
    const Expert& x = ex[static_cast<size_t>(e)];
    model::ExpertWeights w = x.w;  // compress_and_install installs the dequantized weights here
    compress::ExpertReport& rep = reps[static_cast<size_t>(e)];
    rep.layer = 0;
    rep.expert = e;
    rep.tokens = x.c.n;
    compress::compress_and_install(spec, w, spec.hidden_size, spec.moe_intermediate_size, x.c, opt, 32, rep);
  }, threads);
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (peak) {
    peak->stop();
    r.peak_gb = peak->peak_added_gb();
  }
  for (int64_t e = 0; e < count; ++e) {
    const compress::ExpertReport& rep = reps[static_cast<size_t>(e)];
    r.targets += rep.stage_seconds.targets;
    r.solve += rep.stage_seconds.solve;
    r.error += rep.stage_seconds.error;
    if (rep.extra.is_object() && rep.extra.contains("seconds")) r.refine += rep.extra["seconds"].get<double>();
    r.rel_error[static_cast<size_t>(e)] = rep.rel_error;
  }
  return r;
}

double mean(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += v[i];
  return n ? s / static_cast<double>(n) : 0.0;
}

nlohmann::json describe(const char* device, const std::string& method, const Run& r, double layer_seconds,
                        bool extrapolated) {
  const double e = static_cast<double>(r.experts);
  std::printf("%s %s: %lld experts in %.2f s -> layer %.2f s%s; per expert (worker wall): targets %.3f + SGPTQ %.3f + "
              "refinement %.3f + error %.3f s; peak GPU +%.2f GB; mean rel_error %.5f\n",
              device, method.c_str(), static_cast<long long>(r.experts), r.seconds, layer_seconds,
              extrapolated ? " (extrapolated)" : "", r.targets / e, (r.solve - r.refine) / e, r.refine / e, r.error / e,
              r.peak_gb, mean(r.rel_error, r.rel_error.size()));
  return {{"device", device},
          {"method", method},
          {"experts_run", r.experts},
          {"seconds", r.seconds},
          {"layer_seconds", layer_seconds},
          {"extrapolated", extrapolated},
          {"per_expert", {{"targets", r.targets / e}, {"sgptq", (r.solve - r.refine) / e}, {"refine", r.refine / e},
                          {"error", r.error / e}}},
          {"peak_gpu_gb", r.peak_gb},
          {"mean_rel_error", mean(r.rel_error, r.rel_error.size())}};
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p0 = 0; p0 <= s.size();) {
    size_t p1 = s.find(',', p0);
    if (p1 == std::string::npos) p1 = s.size();
    if (p1 > p0) out.push_back(s.substr(p0, p1 - p0));
    p0 = p1 + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model = "qwen3-30b-a3b", methods = "sgptq,moesq", cpu_methods = "sgptq", out, gemms = "bf16-forward",
                step_sequences = "0";
    int64_t experts = -1, rows = -1, cpu_experts = 16, sequences = 2048;
    int threads = static_cast<int>(std::thread::hardware_concurrency());
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        MOESQ_CHECK(i + 1 < argc, a, " needs a value");
        return argv[++i];
      };
      if (a == "--model") model = next();
      else if (a == "--methods") methods = next();
      else if (a == "--cpu-methods") cpu_methods = next();
      else if (a == "--experts") experts = std::stoll(next());
      else if (a == "--rows") rows = std::stoll(next());
      else if (a == "--threads") threads = std::stoi(next());
      else if (a == "--cpu-experts") cpu_experts = std::stoll(next());
      else if (a == "--out") out = next();
      else if (a == "--gemm") gemms = next();
      else if (a == "--step-sequences") step_sequences = next();
      else if (a == "--sequences") sequences = std::stoll(next());
      else MOESQ_FAIL("unknown flag ", a, " (see the header of bench/bench_compress_layer.cu)");
    }
    const Shape* sh = nullptr;
    for (const Shape& s : kShapes)
      if (model == s.name) sh = &s;
    MOESQ_CHECK(sh, "--model: '", model, "' is not qwen3-30b-a3b or kimi-k2.5");
    const int64_t H = sh->H, I = sh->I, E = experts > 0 ? experts : sh->E;
    const int64_t n = rows > 0 ? rows : 2048 * 128 * sh->topk / sh->E;
    cpu_experts = std::min(cpu_experts, E);
    io::ModelSpec spec;
    spec.model_type = "qwen3_moe";  // tensor names in errors only
    spec.hidden_size = H;
    spec.moe_intermediate_size = I;
    spec.num_experts = sh->E;
    std::printf("bench_compress_layer: %s H=%lld I=%lld, %lld experts x %lld rows, %d threads\n", sh->name,
                static_cast<long long>(H), static_cast<long long>(I), static_cast<long long>(E),
                static_cast<long long>(n), threads);
    const auto tp = Clock::now();
    std::vector<Expert> ex(static_cast<size_t>(E));
    parallel_for(E, [&](int64_t e) {
      Expert& x = ex[static_cast<size_t>(e)];
      const uint64_t s = 1000 * static_cast<uint64_t>(e);
      fill_normal(x.w.gate, I * H, s + 1, 0.02f);
      fill_normal(x.w.up, I * H, s + 2, 0.02f);
      fill_normal(x.w.down, H * I, s + 3, 0.02f);
      fill_normal(x.c.X, n * H, s + 4, 1.0f);
      x.c.g.resize(n);
      SplitMix64 r(s + 5);
      for (float& v : x.c.g) v = 0.05f + 0.45f * static_cast<float>(r.uniform());
      x.c.n = n;
      x.c.num_sequences = sequences;  // the layer-wide schedule: which calibration sequence a row comes from
      x.c.seq.resize(n);
      for (int32_t& q : x.c.seq) q = static_cast<int32_t>(r.next() % static_cast<uint64_t>(sequences));
    }, threads);
    std::printf("data: %.1f s (host %.1f GB)\n", std::chrono::duration<double>(Clock::now() - tp).count(),
                E * (1.0 * n * H + 3.0 * I * H) * 4 / 1e9);

    nlohmann::json rows_json = nlohmann::json::array();
    struct Variant {
      std::string method, gemm;
      int64_t step_sequences = 0;
      bool first = true;  // the method's first row (the CPU peer runs it)
    };
    std::vector<Variant> variants;
    for (const std::string& mname : split(methods)) {
      const bool refines = compress::parse_method(mname)->refines;
      bool first = true;
      for (const std::string& g : refines ? split(gemms) : std::vector<std::string>{"fp32"})
        for (const std::string& q : refines ? split(step_sequences) : std::vector<std::string>{"0"}) {
          compress::RefineOptions probe;
          compress::set_gpu_gemm(probe, g, "--gemm");  // an Error for an unknown name, before any work
          variants.push_back({mname, g, std::stoll(q), first});
          first = false;
        }
    }
    for (const Variant& v : variants) {
      const std::string& mname = v.method;
      const std::string label = compress::parse_method(mname)->refines
                                    ? mname + " [" + v.gemm + ", " +
                                          (v.step_sequences > 0 ? "layer-wide " + std::to_string(v.step_sequences) +
                                                                      " sequences/step"
                                                                : std::string("per-expert batches")) + "]"
                                    : mname;
      compress::CompressOptions opt;
      opt.method = compress::parse_method(mname);
      opt.refine.step_sequences = v.step_sequences;
      compress::set_gpu_gemm(opt.refine, v.gemm, "--gemm");
      // `moesq compress` without --batch / --epochs / --lr-a / --lr-v: the schedule rule sets all four.
      opt.refine.rule_batch = opt.refine.rule_epochs = opt.refine.rule_lr_A = opt.refine.rule_lr_V = true;
      const int64_t train = n - compress::heldout_rows(opt.refine, n);
      for (Expert& x : ex) x.c.schedule_rows = train;
      compress::CompressOptions og = opt;
      og.device = compress::Device::kCuda;
      og.sgptq.device = compress::sgptq_expert_cuda;
      og.expert_device = compress::expert_device_cuda();
      if (opt.method->refines) og.refine.device = compress::refine::make_cuda_step_backend;
      compress::validate(og);
      const Run gpu = run_layer(spec, ex, E, og, threads, true);
      nlohmann::json row = describe("GPU", label, gpu, gpu.seconds, false);
      row["gemm"] = v.gemm;
      row["step_sequences"] = v.step_sequences;
      const std::vector<std::string> on_cpu = split(cpu_methods);
      const bool cpu_peer =
          v.first && cpu_experts > 0 && std::find(on_cpu.begin(), on_cpu.end(), mname) != on_cpu.end();
      if (cpu_peer) {
        compress::CompressOptions oc = opt;
        oc.refine.tf32_gemm = oc.refine.tf32_backward = oc.refine.bf16_forward = false;  // the CPU ignores them; validate refuses them there
        const Run cpu = run_layer(spec, ex, cpu_experts, oc, threads, false);
        const double layer = cpu.seconds * static_cast<double>(E) / static_cast<double>(cpu_experts);
        nlohmann::json crow = describe("CPU", label, cpu, layer, cpu_experts < E);
        double worst = 0;
        for (int64_t e = 0; e < cpu_experts; ++e)
          worst = std::max(worst, std::fabs(gpu.rel_error[e] - cpu.rel_error[e]) / cpu.rel_error[e]);
        std::printf("  GPU / CPU: layer %.1fx faster; rel_error of the %lld experts both ran: GPU %.5f vs CPU %.5f "
                    "(worst relative difference %.3g)\n",
                    layer / gpu.seconds, static_cast<long long>(cpu_experts),
                    mean(gpu.rel_error, static_cast<size_t>(cpu_experts)), mean(cpu.rel_error, static_cast<size_t>(cpu_experts)),
                    worst);
        row["cpu_peer"] = crow;
        row["speedup_vs_cpu"] = layer / gpu.seconds;
        row["rel_error_worst_relative_difference"] = worst;
      }
      rows_json.push_back(row);
    }
    if (!out.empty()) {
      nlohmann::json j = {{"model", sh->name}, {"H", H}, {"I", I}, {"experts", E}, {"rows", n}, {"threads", threads},
                          {"runs", rows_json}};
      std::ofstream(out) << j.dump(2) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_compress_layer: %s\n", e.what());
    return 1;
  }
}
