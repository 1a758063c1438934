// `moesq serve DIR [--device cpu|cuda] [--experts B] [--host H] [--port P] [--max-num-seqs N]
// [--max-model-len T] [--max-queue N] [--deterministic on|off] [--chat-template FILE]`: an
// OpenAI-compatible HTTP server (serve/http_server.h) with continuous batching over the decode
// backend (serve/scheduler.h). SIGTERM / SIGINT stop accepting, let in-flight requests finish, and
// exit 0: the signal handler only sets a flag (all a handler may do); the main thread polls it.
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
#include "io/checkpoint.h"
#include "io/tokenizer.h"
#include "model/decoder.h"
#include "model/kv_decoder.h"
#include "runtime/backend.h"
#include "runtime/decode_backend.h"
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
  std::string dir, device = "cpu", experts = "auto", host = "127.0.0.1", deterministic = "on", chat_template;
  int port = 8000;
  int max_num_seqs = 16;
  int64_t max_model_len = 0;  // 0: min(max_position_embeddings, 4096)
  int64_t max_queue = 256;
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

void run_serve(const ServeArgs& a) {
#ifndef MOESQ_HAVE_HTTPLIB
  MOESQ_FAIL("moesq serve: built without cpp-httplib: install libcpp-httplib-dev and rebuild");
#endif
  MOESQ_CHECK(a.port >= 0 && a.port <= 65535, "--port: ", a.port, " is not in [0, 65535]");
  MOESQ_CHECK(a.max_num_seqs >= 1, "--max-num-seqs: ", a.max_num_seqs, " must be >= 1");
  MOESQ_CHECK(a.max_queue >= 0, "--max-queue: ", a.max_queue, " must be >= 0");
  const io::Checkpoint ckpt(a.dir);
  const int64_t max_pos = ckpt.spec().max_position_embeddings;
  int64_t max_len = a.max_model_len ? a.max_model_len : (max_pos > 0 ? std::min<int64_t>(max_pos, 4096) : 4096);
  MOESQ_CHECK(max_len >= 2, "--max-model-len: ", max_len, " must be >= 2");
  MOESQ_CHECK(max_pos <= 0 || max_len <= max_pos, "--max-model-len ", max_len, " exceeds the model's max_position_embeddings (",
              max_pos, ")");
  const io::Tokenizer tok = io::load_tokenizer_for_checkpoint(a.dir);
  serve::ServeContext ctx;
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
  std::unique_ptr<runtime::DecodeBackend> backend;
  std::optional<model::DecoderModel> cpu_model;
  std::string backend_name = "cpu";
  double kv_bytes = 0;
#ifdef MOESQ_HAVE_CUDA
  std::optional<runtime::Engine> eng;
#endif
  if (a.device == "cuda") {
#ifdef MOESQ_HAVE_CUDA
    runtime::EngineOptions eo;
    eo.experts = runtime::parse_expert_backend(a.experts);
    eo.deterministic = a.deterministic == "on";
    eo.max_seqs = a.max_num_seqs, eo.max_len = max_len, eo.max_tokens = max_len;
    eng.emplace(ckpt, eo);
    backend_name = runtime::expert_backend_name(eng->backend());
    kv_bytes = static_cast<double>(eng->kv_bytes());
    backend = std::make_unique<runtime::EngineDecodeBackend>(*eng);
#else
    MOESQ_FAIL("--device cuda: this moesq was built without CUDA");
#endif
  } else {
    MOESQ_CHECK(a.experts == "auto", "--experts applies to --device cuda only");
    MOESQ_CHECK(a.deterministic == "on", "--deterministic off applies to --device cuda only");
    cpu_model.emplace(ckpt);
    kv_bytes = static_cast<double>(model::KvDecoder::cache_bytes(*cpu_model, max_len)) * a.max_num_seqs;
    backend = std::make_unique<runtime::CpuDecodeBackend>(*cpu_model, max_len, a.max_num_seqs,
                                                          cpu_model->default_forward_options());
  }
  serve::Metrics metrics;
  serve::Scheduler sched(*backend, serve::SchedulerOptions{a.max_queue}, metrics);
  ctx.scheduler = &sched, ctx.metrics = &metrics, ctx.tokenizer = &tok;
  ctx.limits = serve::ProtocolLimits{backend->vocab_size(), max_len};
  ctx.model_name = a.dir;
  // Connections served at once: every slot and every queued request may hold one, plus a few for
  // /health and /metrics.
  serve::HttpServer http(ctx, static_cast<int>(std::min<int64_t>(a.max_num_seqs + a.max_queue + 4, 1024)));
  const int port = http.bind(a.host, a.port);
  std::fprintf(stderr, "moesq serve: model %s, backend %s (%s), %d slots, KV capacity %lld tokens (%d x %lld)",
               a.dir.c_str(), a.device.c_str(), backend_name.c_str(), a.max_num_seqs,
               static_cast<long long>(max_len) * a.max_num_seqs, a.max_num_seqs, static_cast<long long>(max_len));
  if (kv_bytes > 0) std::fprintf(stderr, ", %.3g MiB", kv_bytes / 1048576.0);
  std::fprintf(stderr, "%s\nlistening on http://%s:%d\n", ctx.chat_template ? "" : ", no chat template", a.host.c_str(), port);
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
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--experts", args->experts, "GPU expert backend: auto, bf16, sparse-w4a4, sparse-w4a16")
      ->capture_default_str();
  cmd->add_option("--host", args->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "TCP port; 0 picks a free one (printed)")->capture_default_str();
  cmd->add_option("--max-num-seqs", args->max_num_seqs, "KV slots: sequences decoded together")->capture_default_str();
  cmd->add_option("--max-model-len", args->max_model_len,
                  "tokens per slot (prompt + max_tokens); 0 = min(max_position_embeddings, 4096)")
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
  cmd->callback([args] { run_serve(*args); });
}

}  // namespace moesq::cli
