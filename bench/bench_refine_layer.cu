// bench_refine_layer: the moesq refinement (Algorithm 1 lines 7–18) of ONE MoE layer at a real model's
// shapes, on the GPU (refine/cuda_step_backend.h: every expert of the layer on the worker threads, one
// stream each) and, as the peer measured in the same run, on the CPU (refine_expert with the cblas
// backend, the experts in parallel on the same threads, as `compress --device cpu` runs them).
//
// Data: each expert's weights are N(0, 0.02²) draws, its calibration rows X ~ N(0, 1) (the scale of
// RMS-normed hidden states), the targets Y_ref = expert(X) (fp32, cuBLAS), router weights g uniform
// in (0.05, 0.5); the initial solution is the magnitude pattern with V0 = W (the refinement's cost
// does not depend on how good its start is). The schedule is `moesq compress`'s default rule
// (refine/schedule.h) for the layer's rows, 10 epochs.
//
// Printed per device: the layer's wall time, per expert steps, FLOPs (5 GEMMs per step: 14·m·I·H, and
// 6·n·I·H per evaluation pass), the achieved fp32 rate, the fraction of the fp32 GEMM rate measured
// in this run (one 4096³ cublasSgemm), and the peak GPU memory. The CPU peer runs `--cpu-epochs`
// epochs on `--cpu-experts` experts; its layer time is extrapolated linearly (× E / experts run ×
// epochs / cpu-epochs) and marked so.
//
// Usage: bench_refine_layer [--model qwen3-30b-a3b|kimi-k2.5] [--experts E] [--rows N] [--threads T]
//                           [--epochs 10] [--cpu-experts 16] [--cpu-epochs 1] [--out R.json]
//                           [--gemm fp32,tf32,tf32-backward,bf16-forward] [--profile]
// --gemm: the GPU layer once per listed GEMM precision (compress --gpu-gemm's names), same data.
// --cpu-experts 0 skips the CPU peer.
// --profile: instead of the layer, one expert alone on one thread for one epoch with the step
// backend's stage timing on (refine/cuda_step_backend.h StageTimes: each stage timed alone), then the
// same epoch on --threads experts at once (the throughput the streams reach together).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "compress/refine/cuda_step_backend.h"
#include "compress/refine/loop.h"
#include "compress/refine/options.h"
#include "compress/refine/schedule.h"
#include "core/blas_threads.h"
#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "core/splitmix64.h"
#include "core/threads.h"
#include "format/nvfp4.h"

using namespace moesq;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  const char* name;
  int64_t H, I, E, topk;
};
constexpr Shape kShapes[] = {{"qwen3-30b-a3b", 2048, 768, 128, 8}, {"kimi-k2.5", 7168, 2048, 384, 8}};

struct Expert {
  std::vector<float> gate, up, down;  // [I, H], [I, H], [H, I]
  std::vector<uint8_t> pg, pu, pd;    // magnitude patterns
  std::vector<float> X, Y, g;         // [n, H], [n, H], [n]
};

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

// Y = down · (silu(X·gateᵀ) ⊙ X·upᵀ) on the GPU, fp32 (the original expert's outputs).
void expert_targets(cublasHandle_t h, Expert& x, int64_t n, int64_t H, int64_t I) {
  DevBuf<float> X(x.X), G(x.gate), U(x.up), D(x.down), a(n * I), b(n * I), Y(n * H);
  const float one = 1.0f, zero = 0.0f;
  // row-major a[n, I] = X[n, H] · gate[I, H]ᵀ  ⇔  col-major aᵀ = gateᵀ(col) …
  cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, I, n, H, &one, G.p, H, X.p, H, &zero, a.p, I);
  cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, I, n, H, &one, U.p, H, X.p, H, &zero, b.p, I);
  std::vector<float> ha = a.download(), hb = b.download();
  for (size_t i = 0; i < ha.size(); ++i) ha[i] = ha[i] / (1.0f + std::exp(-ha[i])) * hb[i];
  a.upload(ha);
  cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, H, n, I, &one, D.p, I, a.p, I, &zero, Y.p, H);
  x.Y = Y.download();
}

double sgemm_rate_tflops(cublasHandle_t h) {
  const int n = 4096;
  DevBuf<float> A(static_cast<size_t>(n) * n), B(A.n), C(A.n);
  MOESQ_CUDA_CHECK(cudaMemset(A.p, 0, A.bytes()));
  MOESQ_CUDA_CHECK(cudaMemset(B.p, 0, B.bytes()));
  const float one = 1.0f, zero = 0.0f;
  cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A.p, n, B.p, n, &zero, C.p, n);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  const int reps = 10;
  const auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A.p, n, B.p, n, &zero, C.p, n);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return 2.0 * n * n * static_cast<double>(n) * reps / s / 1e12;
}

struct RunStats {
  double seconds = 0, flops = 0;
  int64_t steps = 0, experts = 0;
  double mean_init = 0, mean_final = 0;
  double thread_seconds = 0, epoch_seconds = 0;  // Σ over experts of refine_expert's wall, of its epochs' wall
  compress::RefineResult::StageSeconds stages;    // Σ over experts
};

// Where a worker thread's time goes (RefineResult::stage_seconds), per expert: preparation (Q_a of
// X on the CPU, split), start (uploads, initial loss), the epochs' step issue, the per-epoch evals
// (which wait for the queued steps), finish (argmax, pack, the final packed loss on the CPU).
void print_thread_split(const char* what, const RunStats& st) {
  const double e = static_cast<double>(st.experts);
  const double issue = st.epoch_seconds / e, eval = st.stages.optimize / e - issue;
  std::printf("  %s thread wall per expert %.3f s = prepare %.3f + start %.3f + step issue %.3f (%.0f us per step) + "
              "evals/waits %.3f + finish %.3f\n",
              what, st.thread_seconds / e, st.stages.prepare / e, st.stages.start / e, issue,
              1e6 * st.epoch_seconds / static_cast<double>(std::max<int64_t>(st.steps, 1)), eval, st.stages.finish / e);
}

RunStats refine_all(std::vector<Expert>& ex, int64_t count, int64_t n, int64_t H, int64_t I,
                    const compress::RefineOptions& o, int threads) {
  std::vector<compress::RefineResult> res(static_cast<size_t>(count));
  // As compress's pipeline does: moesq parallelizes over experts, BLAS stays single-threaded (the CPU
  // parts of refine_expert would otherwise oversubscribe the cores, 16 workers × OpenBLAS's threads).
  ScopedBlasSingleThread single_blas;
  const auto t0 = Clock::now();
  parallel_for(count, [&](int64_t e) {
    Expert& x = ex[static_cast<size_t>(e)];
    compress::ExpertData d;
    d.n = n;
    d.H = H;
    d.I = I;
    d.X = x.X.data();
    d.g = x.g.data();
    d.Y_ref = x.Y.data();
    d.stream = static_cast<uint64_t>(e);
    d.schedule_rows = n - compress::heldout_rows(o, n);
    const compress::ProjInit ig{x.gate.data(), x.pg.data(), 0.0f, nullptr};
    const compress::ProjInit iu{x.up.data(), x.pu.data(), 0.0f, nullptr};
    const compress::ProjInit id{x.down.data(), x.pd.data(), 0.0f, nullptr};
    res[static_cast<size_t>(e)] = compress::refine_expert(d, ig, iu, id, o);
  }, threads);
  RunStats st;
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  st.experts = count;
  for (const compress::RefineResult& r : res) {
    st.steps += r.steps;
    const int64_t train = r.train_rows, held = r.heldout_rows;
    const int64_t full = train / r.batch, rem = train % r.batch;
    const int64_t rows_stepped = r.epochs * (full * r.batch + rem);  // Σ m over the steps
    st.flops += 14.0 * static_cast<double>(rows_stepped) * I * H;
    st.flops += 6.0 * static_cast<double>(held) * I * H * (1 + 2 * r.epochs);  // init + soft & hard per epoch
    st.thread_seconds += r.seconds;
    for (double e : r.curves.epoch_seconds) st.epoch_seconds += e;
    st.stages.prepare += r.stage_seconds.prepare;
    st.stages.start += r.stage_seconds.start;
    st.stages.optimize += r.stage_seconds.optimize;
    st.stages.finish += r.stage_seconds.finish;
    st.mean_init += r.init_hard_loss / count;
    st.mean_final += r.final_hard_loss / count;
  }
  return st;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model = "qwen3-30b-a3b", out;
    int64_t experts = -1, rows = -1, cpu_experts = 16;
    int threads = static_cast<int>(std::thread::hardware_concurrency()), epochs = 10, cpu_epochs = 1;
    bool profile = false;
    std::string gemms = "fp32";
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        MOESQ_CHECK(i + 1 < argc, a, " needs a value");
        return argv[++i];
      };
      if (a == "--model") model = next();
      else if (a == "--experts") experts = std::stoll(next());
      else if (a == "--rows") rows = std::stoll(next());
      else if (a == "--threads") threads = std::stoi(next());
      else if (a == "--epochs") epochs = std::stoi(next());
      else if (a == "--cpu-experts") cpu_experts = std::stoll(next());
      else if (a == "--cpu-epochs") cpu_epochs = std::stoi(next());
      else if (a == "--out") out = next();
      else if (a == "--profile") profile = true;
      else if (a == "--gemm") gemms = next();
      else MOESQ_FAIL("unknown flag ", a, " (see the header of bench/bench_refine_layer.cu)");
    }
    const Shape* sh = nullptr;
    for (const Shape& s : kShapes)
      if (model == s.name) sh = &s;
    MOESQ_CHECK(sh, "--model: '", model, "' is not qwen3-30b-a3b or kimi-k2.5");
    const int64_t H = sh->H, I = sh->I, E = experts > 0 ? experts : profile ? threads : sh->E;
    // Default calibration: 2,048 sequences × 128 tokens, top-k routes spread evenly over the experts.
    const int64_t n = rows > 0 ? rows : 2048 * 128 * sh->topk / sh->E;
    cpu_experts = std::min(cpu_experts, E);
    std::printf("bench_refine_layer: %s H=%lld I=%lld, %lld experts x %lld rows, %d threads\n", sh->name,
                static_cast<long long>(H), static_cast<long long>(I), static_cast<long long>(E),
                static_cast<long long>(n), threads);
    cublasHandle_t blas;
    MOESQ_CHECK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
    cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH);
    const double rate = sgemm_rate_tflops(blas);
    std::printf("fp32 GEMM rate (4096^3 cublasSgemm, this run): %.1f TFLOP/s\n", rate);

    const auto tp = Clock::now();
    std::vector<Expert> ex(static_cast<size_t>(E));
    parallel_for(E, [&](int64_t e) {
      Expert& x = ex[static_cast<size_t>(e)];
      const uint64_t s = 1000 * static_cast<uint64_t>(e);
      fill_normal(x.gate, I * H, s + 1, 0.02f);
      fill_normal(x.up, I * H, s + 2, 0.02f);
      fill_normal(x.down, H * I, s + 3, 0.02f);
      fill_normal(x.X, n * H, s + 4, 1.0f);
      x.g.resize(n);
      SplitMix64 r(s + 5);
      for (float& v : x.g) v = 0.05f + 0.45f * r.uniform();
      x.pg = format::magnitude_patterns(x.gate.data(), I, H);
      x.pu = format::magnitude_patterns(x.up.data(), I, H);
      x.pd = format::magnitude_patterns(x.down.data(), H, I);
    }, threads);
    for (Expert& x : ex) expert_targets(blas, x, n, H, I);
    std::printf("data: %.1f s (host %.1f GB)\n", std::chrono::duration<double>(Clock::now() - tp).count(),
                E * (2.0 * n * H + 3.0 * I * H) * 4 / 1e9);

    compress::RefineOptions o;  // `moesq compress`'s defaults: the schedule rule, 10 epochs
    o.rule_batch = o.rule_lr_A = o.rule_lr_V = true;
    o.rule_epochs = false;
    o.epochs = epochs;
    o.rule_per_expert = true;
    const int64_t train = n - compress::heldout_rows(o, n);
    const compress::RefineSchedule sched = compress::refine_schedule(train, compress::layer_batch(train), epochs);
    std::printf("schedule: batch %lld, %lld steps per expert, lr_A %.3g, lr_V %.3g\n",
                static_cast<long long>(sched.batch), static_cast<long long>(sched.steps), sched.lr_A, sched.lr_V);

    if (profile) {
      compress::RefineOptions op = o;
      op.epochs = 1;
      op.device = compress::refine::make_cuda_step_backend;
      compress::set_gpu_gemm(op, gemms.substr(0, gemms.find(',')), "--gemm");  // the first of --gemm
      compress::refine::set_stage_timing(true);
      const RunStats one = refine_all(ex, 1, n, H, I, op, 1);  // one thread: the caller's (parallel_for inline)
      const compress::refine::StageTimes t = compress::refine::stage_times();
      compress::refine::set_stage_timing(false);
      const double per = 1e6 / std::max<int64_t>(1, t.steps);
      const double gemm_floor = 14.0 * static_cast<double>(sched.batch) * I * H / (rate * 1e12) * 1e6;
      std::printf("profile, one expert alone (%lld steps timed, us per step): support %.1f | weight Q_w %.1f | gather %.1f | "
                  "GEMMs %.1f (fp32 floor at the measured rate %.1f) | SwiGLU+Q_a %.1f | loss %.1f | dA,dV+Lion %.1f | "
                  "sum %.1f; wall %.2f s\n",
                  static_cast<long long>(t.steps), t.support * per, t.weight_quant * per, t.gather * per, t.gemm * per,
                  gemm_floor, t.swiglu * per, t.loss * per, t.lion * per,
                  (t.support + t.weight_quant + t.gather + t.gemm + t.swiglu + t.loss + t.lion) * per, one.seconds);
      const RunStats all = refine_all(ex, E, n, H, I, op, threads);
      std::printf("profile, %lld experts on %d threads, one epoch: %.2f s, %.1f us per expert-step, %.1f TFLOP/s\n",
                  static_cast<long long>(E), threads, all.seconds, all.seconds * 1e6 / std::max<int64_t>(1, all.steps),
                  all.flops / all.seconds / 1e12);
      cublasDestroy(blas);
      return 0;
    }

    nlohmann::json gpu_rows = nlohmann::json::array();
    double gpu_seconds_first = 0;
    for (size_t p0 = 0; p0 < gemms.size();) {
      size_t p1 = gemms.find(',', p0);
      if (p1 == std::string::npos) p1 = gemms.size();
      const std::string gemm = gemms.substr(p0, p1 - p0);
      p0 = p1 + 1;
      compress::RefineOptions probe;
      compress::set_gpu_gemm(probe, gemm, "--gemm");  // an Error for an unknown name, before any work
      // Peak GPU memory, sampled while the GPU layer runs.
      size_t free0 = 0, total = 0;
      MOESQ_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
      std::atomic<bool> done{false};
      std::atomic<size_t> min_free{free0};
      std::thread sampler([&] {
        while (!done) {
          size_t f = 0, t = 0;
          if (cudaMemGetInfo(&f, &t) == cudaSuccess && f < min_free) min_free = f;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
      struct JoinOnExit {  // an error in the run must not destroy a joinable thread (std::terminate)
        std::atomic<bool>& done;
        std::thread& t;
        ~JoinOnExit() {
          done = true;
          if (t.joinable()) t.join();
        }
      };
      RunStats gpu;
      {
        JoinOnExit join{done, sampler};
        compress::RefineOptions og = o;
        og.device = compress::refine::make_cuda_step_backend;
        compress::set_gpu_gemm(og, gemm, "--gemm");
        gpu = refine_all(ex, E, n, H, I, og, threads);
      }
      const double peak_gb = static_cast<double>(free0 - min_free) / 1e9;
      if (gpu_rows.empty()) gpu_seconds_first = gpu.seconds;
      std::printf("GPU %s: layer %.2f s, %lld steps, %.1f TFLOP, %.1f TFLOP/s = %.0f %% of the fp32 GEMM rate; peak +%.2f GB; "
                  "held-out loss %.4g -> %.4g\n",
                  gemm.c_str(), gpu.seconds, static_cast<long long>(gpu.steps), gpu.flops / 1e12,
                  gpu.flops / gpu.seconds / 1e12, 100.0 * gpu.flops / gpu.seconds / 1e12 / rate, peak_gb, gpu.mean_init,
                  gpu.mean_final);
      print_thread_split(gemm.c_str(), gpu);
      gpu_rows.push_back({{"gemm", gemm}, {"seconds", gpu.seconds}, {"steps", gpu.steps}, {"tflop", gpu.flops / 1e12},
                          {"tflops", gpu.flops / gpu.seconds / 1e12},
                          {"fraction_of_fp32_rate", gpu.flops / gpu.seconds / 1e12 / rate}, {"peak_gpu_gb", peak_gb},
                          {"init_loss", gpu.mean_init}, {"final_loss", gpu.mean_final},
                          {"thread_seconds_per_expert", gpu.thread_seconds / static_cast<double>(gpu.experts)},
                          {"epoch_seconds_per_expert", gpu.epoch_seconds / static_cast<double>(gpu.experts)}});
    }

    RunStats cpu;
    double cpu_layer = 0;
    if (cpu_experts > 0) {
      compress::RefineOptions oc = o;
      oc.epochs = cpu_epochs;
      cpu = refine_all(ex, cpu_experts, n, H, I, oc, threads);
      cpu_layer = cpu.seconds * (static_cast<double>(E) / static_cast<double>(cpu_experts)) *
                  (static_cast<double>(epochs) / cpu_epochs);
      std::printf("CPU peer: %lld experts x %d epoch(s) in %.2f s -> layer %.1f s (extrapolated); GPU (%s) speedup %.1fx\n",
                  static_cast<long long>(cpu_experts), cpu_epochs, cpu.seconds, cpu_layer,
                  gpu_rows[0]["gemm"].get<std::string>().c_str(), cpu_layer / gpu_seconds_first);
    }
    if (!out.empty()) {
      nlohmann::json j = {{"model", sh->name}, {"H", H}, {"I", I}, {"experts", E}, {"rows_per_expert", n},
                          {"threads", threads}, {"epochs", epochs}, {"batch", sched.batch},
                          {"fp32_gemm_tflops", rate},
                          {"gpu", gpu_rows},
                          {"cpu_peer", {{"experts", cpu_experts}, {"epochs", cpu_epochs}, {"seconds", cpu.seconds},
                                        {"layer_seconds_extrapolated", cpu_layer}}},
                          {"speedup_first_gpu_row", cpu_experts > 0 ? cpu_layer / gpu_seconds_first : 0.0}};
      std::ofstream(out) << j.dump(2) << "\n";
    }
    cublasDestroy(blas);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_refine_layer: error: %s\n", e.what());
    return 1;
  }
}
