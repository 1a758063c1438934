// `moesq serve (DIR | --synthetic MODEL [--layers L] [--seed S]) [--device cpu|cuda] [--experts B]
// [--host H] [--port P] [--max-num-seqs N] [--max-model-len T] [--max-num-batched-tokens T]
// [--kv-cache-tokens T] [--max-queue N] [--deterministic on|off] [--chat-template FILE]`: an OpenAI-compatible HTTP server (serve/http_server.h) with continuous
// batching over the decode backend (serve/scheduler.h). --synthetic serves the GPU engine of
// `moesq bench e2e --synthetic` (weights drawn on the GPU from --seed, no checkpoint): no tokenizer,
// so completions take token-id prompts and answer ids (docs/SERVE.md). SIGTERM / SIGINT stop
// accepting, let in-flight requests finish, and exit 0: the signal handler only sets a flag (all a
// handler may do); the main thread polls it.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "runtime/weights.h"
#include "io/checkpoint.h"
#include "io/tokenizer.h"
#include "model/decoder.h"
#include "model/kv_decoder.h"
#include "runtime/backend.h"
#include "runtime/decode_backend.h"
#include "runtime/kv_blocks.h"
#include "serve/chat_template.h"
#include "serve/http_server.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"
#ifdef MOESQ_HAVE_CUDA
#include "runtime/engine.h"
#include "runtime/engine_backend.h"
#endif

namespace moesq::cli {

namespace {

struct ServeArgs {
  std::string dir, synthetic, device = "cpu", experts = "auto", host = "127.0.0.1", deterministic = "on", chat_template;
  int port = 8000;
  int max_num_seqs = 16;
  int64_t max_model_len = 0;  // 0: min(max_position_embeddings, 4096); synthetic: kSyntheticMaxLen
  int64_t max_queue = 256;
  int64_t max_batched = 0;    // --max-num-batched-tokens: prompt tokens per step; 0: scheduler_batched_tokens
  int64_t kv_tokens = 0;      // --kv-cache-tokens: paged KV capacity; 0: kv_tokens_option
  int64_t layers = 0;         // --synthetic: decoder layers (0 = all)
  uint64_t seed = 1;          // --synthetic: weight seed
  bool layers_given = false, seed_given = false;
  bool check_finite = false;  // GPU engine: runtime::EngineOptions::check_finite
};

// --max-model-len of a synthetic server: the prefill workload of `bench serve` (4,096 in + 1 out)
// and the reference workload (1,024 + 256) fit, with room.
constexpr int64_t kSyntheticMaxLen = 4096 + 256;
// Default --max-num-batched-tokens (vLLM's default for online serving), raised to --max-model-len.
constexpr int64_t kDefaultBatchedTokens = 8192;

// The GPU engine's tokens per forward: a step's prompt chunks (--max-num-batched-tokens), and as before
// a whole prompt (so that no prompt up to the budget is ever cut) and a decode of every slot.
int64_t engine_max_tokens(const ServeArgs& a, int64_t max_len) {
  const int64_t batched = a.max_batched > 0 ? a.max_batched : kDefaultBatchedTokens;
  return std::max({batched, max_len, static_cast<int64_t>(a.max_num_seqs)});
}

// Prompt tokens the scheduler prefills per step (chunked prefill): --max-num-batched-tokens; unset,
// 8192 on the GPU and whole prompts on the CPU (which steps a prompt token by token either way).
int64_t scheduler_batched_tokens(const ServeArgs& a) {
  if (a.max_batched > 0) return a.max_batched;
  return a.device == "cuda" ? kDefaultBatchedTokens : 0;
}

void check_kv_tokens(const ServeArgs& a, int64_t max_len);

// runtime::EngineOptions::kv_tokens of the GPU engine: --kv-cache-tokens, unset what the free device
// memory holds (at most every slot at --max-model-len). Checked against one sequence of max_len.
#ifdef MOESQ_HAVE_CUDA
int64_t engine_kv_tokens(const ServeArgs& a, int64_t max_len) {
  check_kv_tokens(a, max_len);
  return a.kv_tokens > 0 ? a.kv_tokens : runtime::kKvTokensFitMemory;
}
#endif

// What the server runs: a checkpoint (its tokenizer, the CPU model or the GPU engine) or a synthetic
// GPU engine (no tokenizer). Filled in place: the engine and model are not movable.
struct ServedModel {
  std::optional<io::Checkpoint> ckpt;
  std::optional<io::Tokenizer> tok;
  std::optional<model::DecoderModel> cpu_model;
#ifdef MOESQ_HAVE_CUDA
  std::optional<runtime::Engine> eng;
#endif
  std::unique_ptr<runtime::DecodeBackend> backend;
  std::string name, backend_name = "cpu", detail;
  int64_t max_len = 0;
  double kv_bytes = 0;
};

std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int signo) { g_signal.store(signo); }

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MOESQ_CHECK(f.good(), "--chat-template: cannot open ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// --kv-cache-tokens: 0 (the default) or at least one sequence of --max-model-len.
void check_kv_tokens(const ServeArgs& a, int64_t max_len) {
  MOESQ_CHECK(a.kv_tokens >= 0, "--kv-cache-tokens: ", a.kv_tokens, " must be >= 0");
  MOESQ_CHECK(a.kv_tokens == 0 || a.kv_tokens >= max_len, "--kv-cache-tokens ", a.kv_tokens,
              " cannot hold one sequence of --max-model-len ", max_len, ": give at least that many, or 0");
}

// DIR or --synthetic, and the flags that go with each. Errors name the flags.
void check_source(const ServeArgs& a) {
  check_finite_needs_cuda(a.check_finite, a.device);
  MOESQ_CHECK(a.max_batched >= 0 && a.max_batched <= (int64_t(1) << 20), "--max-num-batched-tokens: ", a.max_batched,
              " is not in [0, 1048576]");
  MOESQ_CHECK(!a.dir.empty() || !a.synthetic.empty(), "moesq serve: give a checkpoint DIR or --synthetic MODEL");
  MOESQ_CHECK(a.dir.empty() || a.synthetic.empty(), "moesq serve: DIR (", a.dir, ") and --synthetic ", a.synthetic,
              " are exclusive: give one");
  if (a.synthetic.empty()) {
    MOESQ_CHECK(!a.layers_given && !a.seed_given, "--layers and --seed apply to --synthetic only");
    return;
  }
  MOESQ_CHECK(a.device == "cuda", "--synthetic: the synthetic weights are drawn on the GPU: add --device cuda (got --device ",
              a.device, ")");
  MOESQ_CHECK(a.experts != "auto", "--synthetic: give --experts bf16, sparse-w4a4 or sparse-w4a16 (the weights are drawn "
              "for one expert backend)");
  MOESQ_CHECK(a.chat_template.empty(), "--chat-template: the synthetic model has no tokenizer, so no chat is served");
  (void)runtime::synthetic_spec(a.synthetic, a.layers);  // a known name, --layers in range
  (void)runtime::parse_expert_backend(a.experts);
#ifndef MOESQ_HAVE_CUDA
  MOESQ_FAIL("--synthetic --device cuda: this moesq was built without CUDA");
#endif
}

// The checkpoint in DIR: its tokenizer, chat template, and the CPU model or the GPU engine.
void open_checkpoint(const ServeArgs& a, ServedModel& m, serve::ServeContext& ctx) {
  const io::Checkpoint& ckpt = m.ckpt.emplace(a.dir);
  const int64_t max_pos = ckpt.spec().max_position_embeddings;
  m.max_len = a.max_model_len ? a.max_model_len : (max_pos > 0 ? std::min<int64_t>(max_pos, 4096) : 4096);
  MOESQ_CHECK(m.max_len >= 2, "--max-model-len: ", m.max_len, " must be >= 2");
  MOESQ_CHECK(max_pos <= 0 || m.max_len <= max_pos, "--max-model-len ", m.max_len,
              " exceeds the model's max_position_embeddings (", max_pos, ")");
  m.tok.emplace(io::load_tokenizer_for_checkpoint(a.dir));
  m.name = a.dir;
  if (!a.chat_template.empty()) {
    ctx.chat_template.emplace(slurp(a.chat_template), a.chat_template, std::nullopt, std::nullopt);
  } else {
    try {
      ctx.chat_template = serve::ChatTemplate::from_dir(a.dir);
    } catch (const Error& e) {
      ctx.no_template_reason = std::string("this server has no chat template (") + e.what() +
                               "): use /v1/completions, or restart it with --chat-template FILE";
    }
  }
  if (a.device == "cuda") {
#ifdef MOESQ_HAVE_CUDA
    runtime::EngineOptions eo;
    eo.experts = runtime::parse_expert_backend(a.experts);
    eo.deterministic = a.deterministic == "on";
    eo.check_finite = a.check_finite;
    // A forward holds one whole prompt (prefill) or one token of every slot (decode).
    eo.max_seqs = a.max_num_seqs, eo.max_len = m.max_len, eo.max_tokens = engine_max_tokens(a, m.max_len);
    eo.kv_tokens = engine_kv_tokens(a, m.max_len);
    runtime::Engine& eng = m.eng.emplace(ckpt, eo);
    m.backend_name = runtime::expert_backend_name(eng.backend());
    m.kv_bytes = static_cast<double>(eng.kv_bytes());
    m.backend = std::make_unique<runtime::EngineDecodeBackend>(eng);
#else
    MOESQ_FAIL("--device cuda: this moesq was built without CUDA");
#endif
  } else {
    MOESQ_CHECK(a.experts == "auto", "--experts applies to --device cuda only");
    MOESQ_CHECK(a.deterministic == "on", "--deterministic off applies to --device cuda only");
    check_kv_tokens(a, m.max_len);
    const model::DecoderModel& cm = m.cpu_model.emplace(ckpt);
    // At most (a decoder of max_len per slot holding a sequence; paged: the pool bounds the tokens).
    m.kv_bytes = static_cast<double>(model::KvDecoder::cache_bytes(cm, m.max_len)) * a.max_num_seqs;
    m.backend = std::make_unique<runtime::CpuDecodeBackend>(cm, m.max_len, a.max_num_seqs, cm.default_forward_options(),
                                                            a.kv_tokens);
  }
}

// The synthetic GPU engine of `bench e2e --synthetic`: runtime::synthetic_spec's shapes, weights drawn
// on the GPU from --seed for the one --experts backend. No tokenizer, no chat template.
void open_synthetic(const ServeArgs& a, ServedModel& m) {
  const io::ModelSpec spec = runtime::synthetic_spec(a.synthetic, a.layers);
  const runtime::ExpertBackend backend = runtime::parse_expert_backend(a.experts);
  m.max_len = a.max_model_len ? a.max_model_len : kSyntheticMaxLen;
  MOESQ_CHECK(m.max_len >= 2, "--max-model-len: ", m.max_len, " must be >= 2");
  MOESQ_CHECK(m.max_len <= spec.max_position_embeddings, "--max-model-len ", m.max_len, " exceeds ", a.synthetic,
              "'s max_position_embeddings (", spec.max_position_embeddings, ")");
  m.name = "synthetic:" + a.synthetic;
  m.detail = " (" + std::to_string(spec.num_layers) + " layers, seed " + std::to_string(a.seed) + ")";
#ifdef MOESQ_HAVE_CUDA
  runtime::require_built(backend);
  runtime::EngineOptions eo;
  eo.deterministic = a.deterministic == "on";
  eo.check_finite = a.check_finite;
  eo.max_seqs = a.max_num_seqs, eo.max_len = m.max_len, eo.max_tokens = engine_max_tokens(a, m.max_len);
  eo.kv_tokens = engine_kv_tokens(a, m.max_len);
  progress("serve", "building " + std::string(runtime::expert_backend_name(backend)) + " " + m.name);
  runtime::Engine& eng = m.eng.emplace(runtime::synthetic_model(a.synthetic, a.layers), backend, a.seed, eo);
  m.backend_name = runtime::expert_backend_name(eng.backend());
  m.kv_bytes = static_cast<double>(eng.kv_bytes());
  m.detail += ", weights " + std::to_string(static_cast<int64_t>(eng.weight_bytes() >> 20)) + " MiB";
  m.backend = std::make_unique<runtime::EngineDecodeBackend>(eng);
#else
  (void)backend;
  MOESQ_FAIL("--synthetic --device cuda: this moesq was built without CUDA");  // check_source said so first
#endif
}

void run_serve(const ServeArgs& a) {
  check_source(a);
#ifndef MOESQ_HAVE_HTTPLIB
  MOESQ_FAIL("moesq serve: built without cpp-httplib: install libcpp-httplib-dev and rebuild");
#endif
  MOESQ_CHECK(a.port >= 0 && a.port <= 65535, "--port: ", a.port, " is not in [0, 65535]");
  MOESQ_CHECK(a.max_num_seqs >= 1, "--max-num-seqs: ", a.max_num_seqs, " must be >= 1");
  MOESQ_CHECK(a.max_queue >= 0, "--max-queue: ", a.max_queue, " must be >= 0");
  ServedModel m;
  serve::ServeContext ctx;
  if (a.synthetic.empty()) open_checkpoint(a, m, ctx);
  else open_synthetic(a, m);
  const int64_t max_len = m.max_len;
  serve::Metrics metrics;
  serve::Scheduler sched(*m.backend, serve::SchedulerOptions{a.max_queue, scheduler_batched_tokens(a)}, metrics);
  ctx.scheduler = &sched, ctx.metrics = &metrics, ctx.tokenizer = m.tok ? &*m.tok : nullptr;
  ctx.limits = serve::ProtocolLimits{m.backend->vocab_size(), max_len};
  ctx.model_name = m.name;
  // Connections served at once: every slot and every queued request may hold one, plus a few for
  // /health and /metrics.
  serve::HttpServer http(ctx, static_cast<int>(std::min<int64_t>(a.max_num_seqs + a.max_queue + 4, 1024)));
  const int port = http.bind(a.host, a.port);
  std::fprintf(stderr, "moesq serve: model %s%s, backend %s (%s), %d slots, ", m.name.c_str(), m.detail.c_str(),
               a.device.c_str(), m.backend_name.c_str(), a.max_num_seqs);
  if (m.backend->kv_block_tokens() > 0) {
    const int64_t cap = m.backend->kv_blocks() * m.backend->kv_block_tokens();
    std::fprintf(stderr, "KV capacity %lld tokens, paged (%lld blocks of %lld; %.3g sequences of --max-model-len %lld)",
                 static_cast<long long>(cap), static_cast<long long>(m.backend->kv_blocks()),
                 static_cast<long long>(m.backend->kv_block_tokens()), static_cast<double>(cap) / max_len,
                 static_cast<long long>(max_len));
  } else {
    std::fprintf(stderr, "KV capacity %lld tokens (%d x %lld)", static_cast<long long>(max_len) * a.max_num_seqs,
                 a.max_num_seqs, static_cast<long long>(max_len));
  }
  if (m.kv_bytes > 0) std::fprintf(stderr, ", %.3g MiB", m.kv_bytes / 1048576.0);
  if (scheduler_batched_tokens(a) > 0)
    std::fprintf(stderr, ", chunked prefill of up to %lld prompt tokens per step",
                 static_cast<long long>(std::min(scheduler_batched_tokens(a), m.backend->max_prefill_tokens() > 0
                                                                                  ? m.backend->max_prefill_tokens()
                                                                                  : scheduler_batched_tokens(a))));
  const char* tail = !ctx.tokenizer      ? ", no tokenizer: token-id prompts only, no chat"
                     : !ctx.chat_template ? ", no chat template"
                                          : "";
  std::fprintf(stderr, "%s\nlistening on http://%s:%d\n", tail, a.host.c_str(), port);
  std::fflush(stderr);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  std::thread server([&] { http.run(); });
  while (g_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::fprintf(stderr, "moesq serve: signal %d: finishing in-flight requests\n", g_signal.load());
  http.stop();  // no new connections; returns once in-flight handlers have answered
  server.join();
  sched.shutdown(true);
  std::fprintf(stderr, "moesq serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand("serve",
                                 "OpenAI-compatible HTTP server with continuous batching: POST /v1/completions,\n"
                                 "POST /v1/chat/completions, GET /v1/models, /health, /metrics (docs/SERVE.md).");
  cmd->add_option("DIR", args->dir, "checkpoint directory (with tokenizer.json, or a byte-level model)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--synthetic", args->synthetic,
                  "instead of DIR: qwen3-30b-a3b | qwen3-235b-a22b | kimi-k2.5 | qwen3-next-80b-a3b | qwen3.5-397b-a17b with synthetic weights drawn on the GPU (needs "
                  "--device cuda and --experts; no tokenizer: token-id prompts only)");
  auto* layers = cmd->add_option("--layers", args->layers, "--synthetic: decoder layers (0 = all)")->capture_default_str();
  auto* seed = cmd->add_option("--seed", args->seed, "--synthetic: weight seed")->capture_default_str();
  cmd->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--experts", args->experts, "GPU expert backend: auto, bf16, sparse-w4a4, sparse-w4a16")
      ->capture_default_str();
  cmd->add_option("--host", args->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "TCP port; 0 picks a free one (printed)")->capture_default_str();
  cmd->add_option("--max-num-seqs", args->max_num_seqs, "KV slots: sequences decoded together")->capture_default_str();
  cmd->add_option("--max-model-len", args->max_model_len,
                  "tokens per slot (prompt + max_tokens); 0 = min(max_position_embeddings, 4096), --synthetic: 4352")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", args->max_batched,
                  "chunked prefill: prompt tokens prefilled per step beside the decode of the running requests, "
                  "first come first served; a prompt that fits goes in whole, a longer one in pieces of this size. "
                  "0 = 8192 on the GPU (whose forward buffers hold max(this, --max-model-len, --max-num-seqs) tokens), "
                  "whole prompts on the CPU. Less: shorter decode stalls while prompts arrive; more: fewer, larger "
                  "prefill forwards")
      ->capture_default_str();
  cmd->add_option("--kv-cache-tokens", args->kv_tokens,
                  "KV-cache capacity in tokens, shared by all sequences in blocks of 64 (paged): a request is admitted "
                  "when its prompt fits, and when decoding sequences need more blocks than are free the newest is "
                  "preempted and prefilled again later (its tokens do not change). 0 = on the GPU what the free "
                  "memory holds after weights and activations, less 2 GiB, at most --max-num-seqs x --max-model-len; "
                  "on the CPU not paged. At least --max-model-len")
      ->capture_default_str();
  cmd->add_option("--max-queue", args->max_queue, "requests that may wait for a slot; more get HTTP 503")
      ->capture_default_str();
  cmd->add_option("--deterministic", args->deterministic,
                  "GPU engine: on = batch-invariant arithmetic (a request's tokens do not depend on what else runs); "
                  "off = cuBLAS outside the experts (faster)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--chat-template", args->chat_template,
                  "Jinja chat template file for /v1/chat/completions (default: DIR's tokenizer_config.json or "
                  "chat_template.jinja)")
      ->check(CLI::ExistingFile);
  add_check_finite_flag(cmd, args->check_finite);
  cmd->callback([args, layers, seed] {
    args->layers_given = layers->count() > 0, args->seed_given = seed->count() > 0;
    run_serve(*args);
  });
}

}  // namespace moesq::cli
