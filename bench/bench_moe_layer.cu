// bench_moe_layer: one whole MoE layer of the GPU engine (router GEMM → top-k → dispatch + act
// quant → gate|up grouped GEMM → SwiGLU + requant → down grouped GEMM → combine) at a real model's
// shapes, replayed from CUDA graphs, with each stage's time. It runs exactly the
// engine's launch sequence (runtime::moe_block; a stage mask picks one stage for the per-stage graphs,
// each re-run on the buffers the whole block left). Weights are synthetic (ops/synth_pack: the same
// bytes per weight as a real checkpoint); one replay runs the block of `--layers` layers, each with
// its own weights, so the hit experts stream from HBM instead of sitting in L2 between replays; the
// time printed is per layer. Input rows: bf16 uniform noise (std 1), routes from the synthetic router.
// A program, not a test: the numbers go to bench/NOTES.md with the command that made them.
//
// Floors printed per row: bytes = router weight + the experts actually hit (expert bytes × hit / E,
// all of gate|up and down) ÷ the HBM copy bandwidth given by --hbm-tbps (default 4.27 TB/s, the copy
// rate measured on the H200, bench/NOTES.md); launches = the same number of dependent EMPTY kernels
// replayed from a CUDA graph, measured in this run (what a chain of that many kernels cannot beat).
// The peer (bench/peer_moe_layer.py, torch bf16 grouped MM in a CUDA graph) is merged with --peer-json.
//
// Usage: bench_moe_layer [--model qwen3-30b-a3b] [--experts sparse-w4a4,sparse-w4a16,bf16]
//                        [--batch 1,64,512] [--layers 4] [--reps 200] [--peer-json P] [--out R.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "format/kernel_layout.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/synth_pack/synth_pack.h"
#include "runtime/backend.h"
#include "runtime/layers/moe_block_device.cuh"
#include "runtime/weights.h"

using namespace moesq;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) out.push_back(t);
  return out;
}

struct Args {
  std::string model = "qwen3-30b-a3b", experts = "sparse-w4a4,sparse-w4a16,bf16", batches = "1,64,512";
  std::string peer_json, out;
  int layers = 4, reps = 200;
  double hbm_tbps = 4.27;
};

__global__ void empty_kernel() {}

// Captures what `enqueue` launches on `st` into a CUDA graph and returns the mean µs per replay over
// `reps` replays, after 3 warm-up replays (CUDA events on `st`).
template <class Enqueue>
double graph_replay_us(cudaStream_t st, int reps, Enqueue enqueue) {
  cudaGraph_t g;
  MOESQ_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  enqueue();
  MOESQ_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t ex;
  MOESQ_CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
  cudaEvent_t e0, e1;
  MOESQ_CUDA_CHECK(cudaEventCreate(&e0));
  MOESQ_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) MOESQ_CUDA_CHECK(cudaGraphLaunch(ex, st));
  MOESQ_CUDA_CHECK(cudaEventRecord(e0, st));
  for (int i = 0; i < reps; ++i) MOESQ_CUDA_CHECK(cudaGraphLaunch(ex, st));
  MOESQ_CUDA_CHECK(cudaEventRecord(e1, st));
  MOESQ_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  MOESQ_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaGraphExecDestroy(ex), cudaGraphDestroy(g);
  return 1e3 * ms / reps;
}

// µs per replay of a graph of `n` dependent empty kernels (the launch floor of an n-kernel chain).
double empty_chain_us(int n, int reps) {
  cudaStream_t st;
  MOESQ_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const double us = graph_replay_us(st, reps, [&] {
    for (int i = 0; i < n; ++i) empty_kernel<<<1, 32, 0, st>>>();
  });
  cudaStreamDestroy(st);
  return us;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto val = [&]() -> std::string {
      MOESQ_CHECK(i + 1 < argc, "bench_moe_layer: ", f, " needs a value");
      return argv[++i];
    };
    if (f == "--model") a.model = val();
    else if (f == "--experts") a.experts = val();
    else if (f == "--batch") a.batches = val();
    else if (f == "--layers") a.layers = std::stoi(val());
    else if (f == "--reps") a.reps = std::stoi(val());
    else if (f == "--peer-json") a.peer_json = val();
    else if (f == "--out") a.out = val();
    else if (f == "--hbm-tbps") a.hbm_tbps = std::stod(val());
    else if (f == "--help" || f == "-h") {
      std::printf("bench_moe_layer [--model qwen3-30b-a3b|qwen3-235b-a22b] [--experts LIST] [--batch LIST]\n"
                  "                [--layers L] [--reps R] [--peer-json P] [--out R.json] [--hbm-tbps X]\n");
      std::exit(0);
    } else
      MOESQ_FAIL("bench_moe_layer: unknown flag ", f, " (see --help)");
  }
  MOESQ_CHECK(a.layers >= 1, "bench_moe_layer: --layers ", a.layers, " must be >= 1");
  MOESQ_CHECK(a.reps >= 1, "bench_moe_layer: --reps ", a.reps, " must be >= 1");
  return a;
}

// Peer rows keyed by batch: {"rows": [{"T", "us", ...}]} from bench/peer_moe_layer.py.
nlohmann::json peer_rows(const std::string& path) {
  if (path.empty()) return nlohmann::json::array();
  std::ifstream f(path);
  MOESQ_CHECK(f.good(), "bench_moe_layer: cannot read --peer-json ", path);
  return nlohmann::json::parse(f).at("rows");
}


// Device buffers freed at exit of main's scope (each at least one element of T).
struct DevMem {
  std::vector<DevBuf<uint8_t>> bufs;
  template <class T>
  T* alloc(size_t count) {
    bufs.emplace_back(std::max<size_t>(count, 1) * sizeof(T));
    return reinterpret_cast<T*>(bufs.back().p);
  }
};

// One layer's router + experts drawn on the GPU (as runtime::Engine's synthetic model: router, then
// the experts, one seed each).
runtime::DeviceMoeLayer synth_layer(const runtime::MoeBlockDims& d, runtime::ExpertBackend be, uint64_t seed) {
  constexpr float kScale = 0.02f;
  uint64_t id = 0;
  runtime::DeviceMoeLayer w;
  w.synthesize(d, be, [&] { return seed ^ (++id * 0xd1b54a32d192ed03ull); }, kScale, nullptr);
  return w;
}

// µs per layer per replay of a graph holding the `stages` of every layer's block in turn.
double time_blocks(const runtime::MoeBlockDims& d, const std::vector<runtime::DeviceMoeLayer>& layers,
                   const runtime::MoeBlockBuffers& b, const uint16_t* x, float* h, int64_t T, unsigned stages, int reps,
                   cudaStream_t st) {
  const double us = graph_replay_us(st, reps, [&] {
    for (const auto& w : layers) runtime::moe_block(d, w, b, x, nullptr, h, T, st, {}, stages);
  });
  return us / static_cast<double>(layers.size());
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  const io::ModelSpec spec = runtime::synthetic_spec(a.model, a.layers);
  const nlohmann::json peers = peer_rows(a.peer_json);
  int64_t max_T = 1;  // buffers sized for the largest batch
  for (const auto& b : split(a.batches)) max_T = std::max<int64_t>(max_T, std::stoll(b));
  cudaDeviceProp prop{};
  MOESQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  nlohmann::json out;
  out["device"] = prop.name, out["model"] = a.model, out["layers"] = a.layers, out["reps"] = a.reps;
  out["hbm_tbps"] = a.hbm_tbps, out["rows"] = nlohmann::json::array();
  std::printf("%s, %s shapes (H %lld, I %lld, E %lld, top-%lld), %d layers per replay, %d replays\n", prop.name,
              a.model.c_str(), static_cast<long long>(spec.hidden_size), static_cast<long long>(spec.moe_intermediate_size),
              static_cast<long long>(spec.num_experts), static_cast<long long>(spec.top_k), a.layers, a.reps);
  const runtime::MoeBlockDims d = runtime::moe_block_dims(spec);
  cudaStream_t st;
  MOESQ_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (const auto& be_name : split(a.experts)) {
    const runtime::ExpertBackend be = runtime::parse_expert_backend(be_name);
    DevMem mem;
    std::vector<runtime::DeviceMoeLayer> layers;
    for (int l = 0; l < a.layers; ++l) layers.push_back(synth_layer(d, be, 1234 + 7919 * l));
    const size_t expert_bytes = layers.back().experts->bytes();  // the same for every layer
    // Scratch of moe_block for the largest batch (the engine's sizing function).
    const runtime::MoeBlockBuffers buf =
        runtime::carve_moe_workspace(mem.alloc<uint8_t>(runtime::moe_workspace_bytes(d, max_T)), d, max_T);
    uint16_t* x = mem.alloc<uint16_t>(static_cast<size_t>(max_T * d.H));
    float* h = mem.alloc<float>(static_cast<size_t>(max_T * d.H));
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    for (const auto& bs : split(a.batches)) {
      const int64_t T = std::stoll(bs);
      MOESQ_CHECK(T >= 1, "bench_moe_layer: --batch ", T, " must be >= 1");
      ops::SynthBf16Args in;
      in.out = x, in.n = T * d.H, in.seed = 99 + T, in.scale = 1.0f;
      ops::synth_bf16(in, st);
      MOESQ_CUDA_CHECK(cudaMemsetAsync(h, 0, static_cast<size_t>(T * d.H) * sizeof(float), st));
      // Eager once per layer (first-use work outside capture); count the experts each layer hits.
      double hit = 0;
      std::vector<int32_t> counts(d.E);
      for (const auto& w : layers) {
        runtime::moe_block(d, w, buf, x, nullptr, h, T, st);
        MOESQ_CUDA_CHECK(cudaMemcpyAsync(counts.data(), buf.counts, counts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
        MOESQ_CUDA_CHECK(cudaStreamSynchronize(st));
        for (int32_t c : counts) hit += c > 0;
      }
      hit /= a.layers;
      const double whole = time_blocks(d, layers, buf, x, h, T, runtime::kMoeAllStages, a.reps, st);
      std::vector<std::pair<std::string, double>> stage;
      double sum = 0;
      // The shared / dense MLP stage only where the model has one (Qwen3 shapes do not).
      const int stages = runtime::kMoeStageCount - (d.mlp_I > 0 ? 0 : 1);
      for (int i = 0; i < stages; ++i) {
        stage.emplace_back(runtime::kMoeStageNames[i], time_blocks(d, layers, buf, x, h, T, 1u << i, a.reps, st));
        sum += stage.back().second;
      }
      const double bytes = static_cast<double>(d.E * d.H * sizeof(uint16_t)) + expert_bytes * hit / d.E;
      const double bytes_floor_us = bytes / (a.hbm_tbps * 1e12) * 1e6;
      const double launch_floor_us = empty_chain_us(stages, a.reps);
      double peer_us = 0;
      for (const auto& p : peers)
        if (p.at("T").get<int64_t>() == T && p.contains("us")) peer_us = p.at("us").get<double>();
      std::printf("\n%-12s T=%-4lld whole layer %8.2f us (sum of stages %8.2f)  experts hit %.1f/%lld\n",
                  be_name.c_str(), static_cast<long long>(T), whole, sum, hit, static_cast<long long>(d.E));
      for (const auto& [n, us] : stage) std::printf("    %-22s %8.2f us\n", n.c_str(), us);
      std::printf("    floors: bytes %.1f MB -> %.2f us (ours x%.1f); %d dependent empty kernels -> %.2f us", bytes / 1e6,
                  bytes_floor_us, whole / bytes_floor_us, stages, launch_floor_us);
      if (peer_us > 0) std::printf("; torch bf16 peer %.2f us (ours %.2fx faster)", peer_us, peer_us / whole);
      std::printf("\n");
      nlohmann::json r;
      r["experts"] = be_name, r["T"] = T, r["us"] = whole, r["sum_stages_us"] = sum, r["experts_hit_per_layer"] = hit;
      r["bytes"] = bytes, r["bytes_floor_us"] = bytes_floor_us, r["launch_floor_us"] = launch_floor_us;
      for (const auto& [n, us] : stage) r["stages_us"][n] = us;
      if (peer_us > 0) r["peer_us"] = peer_us, r["speedup_vs_peer"] = peer_us / whole;
      out["rows"].push_back(r);
    }
  }
  cudaStreamDestroy(st);
  if (!a.out.empty()) {
    std::ofstream f(a.out + ".tmp");
    f << out.dump(2) << "\n";
    f.close();
    MOESQ_CHECK(f.good() && std::rename((a.out + ".tmp").c_str(), a.out.c_str()) == 0, "bench_moe_layer: cannot write ",
                a.out);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_moe_layer: %s\n", e.what());
  return 1;
}
