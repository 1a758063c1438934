// `moesq bench e2e --synthetic qwen3-30b-a3b [--layers L] --experts bf16,sparse-w4a4 --batch 1,8,64
// --prompt-len 2048 --gen 128 [--json]`: end-to-end serving numbers of the GPU engine with only the
// expert backend varied, all backends in ONE run: TTFT (prefill of the whole batch), TPOT (median
// decode step, CUDA graph, greedy on the GPU), output tokens/s, weight and KV-cache memory, and the
// share of an (eager, event-timed) decode step spent in the MoE layers and in attention.
// The weights are synthetic, drawn on the GPU from --seed (ops/synth_pack): no checkpoint needed.
// Non-obvious decision: prefill runs in chunks of at most --prefill-tokens tokens (whole sequences),
// since the expert batches are sized for the largest forward; TTFT at batch B is the time until all
// B prompts are prefilled.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/expert_parallel.h"
#include "core/error.h"
#include "core/progress.h"
#include "runtime/backend.h"
#include "runtime/weights.h"
#ifdef MOESQ_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/engine.h"
#endif

namespace moesq::cli {

namespace {

struct E2eArgs {
  std::string synthetic, experts = "bf16,sparse-w4a4", batches = "1,8,64", deterministic = "on";
  std::string expert_exchange = "auto";  // the expert-parallel ranks' exchange (cli/expert_parallel.h)
  int64_t layers = 0, prompt_len = 2048, gen = 128, prefill_tokens = 16384;
  uint64_t seed = 1;
  bool json = false;
  bool check_finite = false;  // runtime::EngineOptions::check_finite: the timings then include the check
  std::string gdn_prefill = "parallel";  // runtime::EngineOptions::gdn_walk_prefill when "walk"
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) out.push_back(x);
  return out;
}

#ifdef MOESQ_HAVE_CUDA
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes a decode step must read at batch B: every non-expert weight once (the GQA or MLA attention
// projections, routers, shared experts, dense layers' MLPs), the lm_head, the experts the B·k routes
// touch (expected distinct experts under uniform routing), and the bf16 KV cache of `ctx` cached tokens
// per sequence (K and V of every kv head, or MLA's latent row).
double step_bytes(const runtime::HostModel& m, runtime::ExpertBackend b, int B, double ctx) {
  const io::ModelSpec& s = m.spec;
  const double H = s.hidden_size, hd = s.head_dim, E = s.num_experts, I = s.moe_intermediate_size;
  double attn = 0, kv_values = 0;
  if (s.mla.kv_lora_rank > 0) {
    const runtime::MlaBlockDims d = runtime::mla_block_dims(s);
    attn = static_cast<double>(d.a_cols()) * H + double(d.nh) * d.d_qk() * d.r_q + double(d.nh) * d.r_kv * d.nope +
           double(d.nh) * d.v * d.r_kv + H * d.nh * d.v;
    kv_values = static_cast<double>(d.latent_row());
  } else {
    const double q_heads = m.gdn.H > 0 ? 2.0 * s.num_heads : s.num_heads;  // a hybrid's q heads are [query | gate]
    attn = (q_heads + 2 * s.num_kv_heads) * hd * H + H * s.num_heads * hd;
    kv_values = 2.0 * s.num_kv_heads * hd;
  }
  // A Gated DeltaNet layer: its two projections, and each sequence's state read and written once (fp32).
  const runtime::GdnBlockDims& g = m.gdn;
  const double gdn_w = static_cast<double>(g.proj_cols()) * H + H * static_cast<double>(g.value_dim());
  const double gdn_state = 2.0 * 4.0 * static_cast<double>(g.state_floats() + g.window_floats());
  const double expert_w = 3 * I * H;
  const double expert_bytes = b == runtime::ExpertBackend::kBf16 ? expert_w * 2 : expert_w * 2.75 / 8;
  const double touched = E * (1 - std::pow(1 - static_cast<double>(s.top_k) / E, B));
  const double shared = s.num_shared_experts > 0 ? 3.0 * s.shared_expert_intermediate_size * H * 2 : 0.0;
  double total = s.vocab_size * H * 2;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const double ffn = s.is_moe_layer(l) ? E * H * 2 + touched * expert_bytes + shared : 3.0 * s.intermediate_size * H * 2;
    const bool gdn = static_cast<size_t>(l) < m.layers.size() && m.layers[l].is_gdn;
    total += ffn + (gdn ? gdn_w * 2 + B * gdn_state : attn * 2 + B * ctx * kv_values * 2);
  }
  return total;
}

// The bandwidth a step's bytes are divided by: 4.25 TB/s on an H200 (its measured copy rate, the figure
// issue 24's floors use), scaled on another card by its nominal bandwidth over the H200's 4.8 TB/s (the
// same achieved fraction; an H100 80GB: ≈ 2.97 TB/s).
double floor_bandwidth() {
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return 4.25e12;
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev);
  const double nominal = 2.0 * clock_khz * 1e3 * (p.memoryBusWidth / 8.0);
  return nominal > 0 ? 4.25e12 * nominal / 4.8e12 : 4.25e12;
}
#endif

void run_e2e(const E2eArgs& a) {
  MOESQ_CHECK(!a.synthetic.empty(), "bench e2e: give --synthetic MODEL (checkpoint directories: not yet)");
  MOESQ_CHECK(a.prompt_len >= 1 && a.gen >= 4, "bench e2e: --prompt-len >= 1 and --gen >= 4");
  const io::ModelSpec spec = runtime::synthetic_spec(a.synthetic, a.layers);
  const runtime::HostModel shapes = runtime::synthetic_model(a.synthetic, a.layers);
  const int64_t model_layers = runtime::synthetic_spec(a.synthetic, 0).num_layers;
  std::vector<runtime::ExpertBackend> backends;
  for (const auto& e : split(a.experts)) {
    backends.push_back(runtime::parse_expert_backend(e));
    runtime::require_built(backends.back());
  }
  MOESQ_CHECK(!backends.empty(), "bench e2e: --experts is empty");
  // Each item a whole number >= 1: std::stoi threw "internal error: stoi" on "abc", read "1.5" as 1,
  // and an empty list reached max_element of nothing.
  std::vector<int> batches;
  for (const auto& b : split(a.batches)) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(b, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MOESQ_CHECK(!b.empty() && used == b.size() && v >= 1 && v <= (1 << 20), "bench e2e: --batch item '", b,
                "' is not a batch size (an integer in [1, 1048576])");
    batches.push_back(static_cast<int>(v));
  }
  MOESQ_CHECK(!batches.empty(), "bench e2e: --batch is empty");
  std::vector<bool> modes;
  for (const auto& m : split(a.deterministic)) {
    MOESQ_CHECK(m == "on" || m == "off", "bench e2e: --deterministic takes on, off or on,off; got '", m, "'");
    modes.push_back(m == "on");
  }
  MOESQ_CHECK(!modes.empty(), "bench e2e: --deterministic is empty");
  const int max_b = *std::max_element(batches.begin(), batches.end());
#ifndef MOESQ_HAVE_CUDA
  (void)max_b, (void)model_layers, (void)shapes;
  MOESQ_FAIL("bench e2e: this moesq was built without CUDA");
#else
  const int64_t chunk_seqs = std::max<int64_t>(1, std::min<int64_t>(max_b, a.prefill_tokens / a.prompt_len));
  nlohmann::json rows = nlohmann::json::array();
  // Under `mpirun -np N` (N > 1): the expert-parallel engine (cli/expert_parallel.h); every rank runs
  // the same calls (nothing below depends on a time), rank 0 prints; weights are rank 0's.
  const ExpertParallel ep("bench e2e", a.expert_exchange);
  if (ep.ranks() > 1)
    progress("bench e2e", std::to_string(ep.ranks()) + " expert-parallel ranks, rank 0 holds " + ep.shard(spec.num_experts) +
                              (ep.exchange() == "nccl" ? "; the exchange is an NCCL all-reduce, in the decode graphs"
                                                       : "; the exchange goes through host memory (MPI), decode runs "
                                                         "without CUDA graphs"));
  ep.run([&] {
    for (runtime::ExpertBackend backend : backends) {
      progress("bench e2e", std::string("building ") + runtime::expert_backend_name(backend) + " synthetic " + a.synthetic);
      runtime::EngineOptions eo;
      eo.max_seqs = max_b, eo.max_len = a.prompt_len + a.gen + 4, eo.max_tokens = chunk_seqs * a.prompt_len;
      eo.max_tokens = std::max<int64_t>(eo.max_tokens, max_b);
      eo.check_finite = a.check_finite;
      eo.gdn_walk_prefill = a.gdn_prefill == "walk";
      ep.apply(spec.num_experts, eo);
      runtime::Engine eng(shapes, backend, a.seed, eo);
      const double bandwidth = floor_bandwidth();
      std::mt19937_64 rng(a.seed);
      // Warm-up: one prefill (first-use costs: attributes, caches).
      eng.forward({{0, std::vector<int32_t>(std::min<int64_t>(a.prompt_len, 64), 1)}}, false);
      for (bool det : modes)
      for (int B : batches) {
        eng.set_deterministic(det);
        eng.reset();
        std::vector<runtime::SeqChunk> all;
        for (int b = 0; b < B; ++b) {
          std::vector<int32_t> p(a.prompt_len);
          for (auto& t : p) t = static_cast<int32_t>(rng() % spec.vocab_size);
          all.push_back({b, std::move(p)});
        }
        // Event timing on during prefill (events only, no extra syncs): attention and MoE shares.
        eng.set_timing(true);
        double pre_attn = 0, pre_moe = 0;
        const double t0 = now_s();
        for (size_t i = 0; i < all.size(); i += chunk_seqs) {
          std::vector<runtime::SeqChunk> part(all.begin() + i, all.begin() + std::min(all.size(), i + chunk_seqs));
          eng.forward(part, false);
          pre_attn += eng.last_attention_ms(), pre_moe += eng.last_moe_ms();
        }
        const double ttft = now_s() - t0;
        eng.set_timing(false);
        std::vector<int32_t> tok(B, 1);
        tok = eng.decode_greedy(tok);  // captures the graph for B (not timed)
        std::vector<double> steps;
        for (int64_t s = 0; s + 2 < a.gen; ++s) {
          const double s0 = now_s();
          tok = eng.decode_greedy(tok);
          steps.push_back(now_s() - s0);
        }
        std::sort(steps.begin(), steps.end());
        const double tpot = steps[steps.size() / 2];
        // One eager, event-timed decode step: MoE and attention shares.
        eng.set_timing(true);
        std::vector<runtime::SeqChunk> one;
        for (int b = 0; b < B; ++b) one.push_back({b, {tok[b]}});
        const double e0 = now_s();
        eng.forward(one, false);
        const double eager_ms = (now_s() - e0) * 1e3;
        eng.set_timing(false);
        const double floor_ms = step_bytes(shapes, backend, B, a.prompt_len + a.gen / 2.0) / bandwidth * 1e3;
        nlohmann::json r;
        r["experts"] = runtime::expert_backend_name(backend);
        r["batch"] = B;
        r["deterministic"] = det;
        r["check_finite"] = a.check_finite;
        if (runtime::synthetic_is_hybrid(a.synthetic)) r["gdn_prefill"] = a.gdn_prefill;
        r["ttft_ms"] = ttft * 1e3;
        r["tpot_ms"] = tpot * 1e3;
        r["output_tokens_per_s"] = B / tpot;
        r["weight_gb"] = eng.weight_bytes() / 1e9;
        r["kv_cache_gb"] = eng.kv_bytes() / 1e9;
        r["moe_share_of_step"] = eng.last_moe_ms() / eager_ms;
        r["attention_share_of_step"] = eng.last_attention_ms() / eager_ms;
        r["eager_step_ms"] = eager_ms;
        r["prefill_attention_share"] = pre_attn / (ttft * 1e3);
        r["prefill_moe_share"] = pre_moe / (ttft * 1e3);
        r["decode_floor_ms"] = floor_ms;
        r["floor_bandwidth_tb_s"] = bandwidth / 1e12;
        r["tpot_over_floor"] = tpot * 1e3 / floor_ms;
        // Per layer (the eager step's event times ÷ layers), and with fewer layers than the model has, the
        // whole model extrapolated linearly in layers — an upper bound (the embedding and lm_head do not
        // scale), stated as an extrapolation, never measured.
        r["decode_attention_ms_per_layer"] = eng.last_attention_ms() / spec.num_layers;
        r["decode_moe_ms_per_layer"] = eng.last_moe_ms() / spec.num_layers;
        if (spec.num_layers < model_layers) {
          const double f = static_cast<double>(model_layers) / spec.num_layers;
          r["extrapolated_to_model_layers"] = {{"layers", model_layers},
                                               {"tpot_ms", tpot * 1e3 * f},
                                               {"ttft_ms", ttft * 1e3 * f},
                                               {"weight_gb", eng.weight_bytes() / 1e9 * f},
                                               {"kv_cache_gb", eng.kv_bytes() / 1e9 * f}};
          if (ep.root()) std::fprintf(stderr, "[bench e2e] %-12s det=%-3s B=%-3d extrapolated to %lld layers (linear in layers, an upper "
                       "bound, not measured): TPOT %.3f ms, TTFT %.1f ms, weights %.1f GB\n",
                       runtime::expert_backend_name(backend), det ? "on" : "off", B, static_cast<long long>(model_layers),
                       tpot * 1e3 * f, ttft * 1e3 * f, eng.weight_bytes() / 1e9 * f);
        }
        rows.push_back(r);
        if (ep.root()) std::fprintf(stderr, "[bench e2e] %-12s det=%-3s B=%-3d TTFT %9.1f ms  TPOT %7.3f ms  %8.1f tok/s  weights %.2f GB  KV %.2f GB  MoE %4.1f%%  attn %4.1f%% (prefill: MoE %4.1f%% attn %4.1f%%)  floor %.3f ms\n",
                     runtime::expert_backend_name(backend), det ? "on" : "off", B, ttft * 1e3, tpot * 1e3, B / tpot, eng.weight_bytes() / 1e9,
                     eng.kv_bytes() / 1e9, 100 * eng.last_moe_ms() / eager_ms, 100 * eng.last_attention_ms() / eager_ms,
                     100 * pre_moe / (ttft * 1e3), 100 * pre_attn / (ttft * 1e3), floor_ms);
      }
    }
  });
  if (!ep.root()) return;
  nlohmann::json j;
  j["model"] = "synthetic:" + a.synthetic;
  if (ep.ranks() > 1) j["expert_parallel_ranks"] = ep.ranks(), j["expert_exchange"] = ep.exchange();
  j["layers"] = spec.num_layers;
  j["model_layers"] = model_layers;
  j["prompt_len"] = a.prompt_len;
  j["gen"] = a.gen;
  j["deterministic"] = a.deterministic;
  j["hbm_bandwidth_assumed_tb_s"] = 4.25;
  j["results"] = rows;
  if (a.json) std::printf("%s\n", j.dump(2).c_str());
#endif
}

}  // namespace

void register_bench_e2e(CLI::App* bench) {
  auto args = std::make_shared<E2eArgs>();
  auto* cmd = bench->add_subcommand("e2e", "End-to-end GPU engine benchmark (TTFT, TPOT, tokens/s, memory) per expert backend");
  cmd->add_option("--synthetic", args->synthetic, "qwen3-30b-a3b | qwen3-235b-a22b | kimi-k2.5 | qwen3-next-80b-a3b | qwen3.5-397b-a17b: synthetic weights on the GPU (kimi-k2.5: add --layers, 61 layers do not fit one GPU; qwen3-next-80b-a3b, qwen3.5-397b-a17b: Gated DeltaNet and gated attention layers)");
  cmd->add_option("--layers", args->layers, "decoder layers (0 = all)")->capture_default_str();
  cmd->add_option("--experts", args->experts, "comma-separated backends")->capture_default_str();
  cmd->add_option("--batch", args->batches, "comma-separated batch sizes")->capture_default_str();
  cmd->add_option("--prompt-len", args->prompt_len, "prompt tokens per sequence")->capture_default_str();
  cmd->add_option("--gen", args->gen, "generated tokens per sequence")->capture_default_str();
  cmd->add_option("--prefill-tokens", args->prefill_tokens, "most tokens per prefill forward")->capture_default_str();
  cmd->add_option("--seed", args->seed, "weight seed")->capture_default_str();
  cmd->add_option("--deterministic", args->deterministic,
                  "on: batch-invariant GEMMs (a sequence's logits bitwise equal alone or in any batch); off: cuBLAS "
                  "for q|k|v, o_proj, router, lm_head; on,off: both, per backend")
      ->capture_default_str();
  add_check_finite_flag(cmd, args->check_finite);
  add_expert_exchange_flag(cmd, args->expert_exchange);
  cmd->add_option("--gdn-prefill", args->gdn_prefill,
                  "Gated DeltaNet layers (qwen3-next-80b-a3b, qwen3.5-397b-a17b): parallel (default: every token's "
                  "conv, norms and gates at once, the state walked in 32-column blocks) or walk (the decode kernels "
                  "token by token); the same bits, for timing one against the other")
      ->check(CLI::IsMember({"parallel", "walk"}))
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args] { run_e2e(*args); });
}

}  // namespace moesq::cli
