// `moesq bench serve --url URL (--workload decode|prefill|reference | --input-len I --output-len O)
// --num-requests N --concurrency C [--vocab-size V] [--model NAME] [--seed S] [--timeout SEC]
// [--json]`: the serving load generator (serve/load_client.h) against any OpenAI-compatible
// server — `moesq serve`, vLLM, SGLang — over real HTTP with streamed responses. Prints vLLM's
// serving-benchmark table (or one JSON object with --json); progress with an ETA on stderr. Exit 1
// when any request failed (the failures are listed), so a script notices.
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "serve/load_client.h"

namespace moesq::cli {

namespace {

struct BenchServeArgs {
  serve::LoadOptions load;
  std::string workload;
  int64_t input_len = 0, output_len = 0;
  bool json = false;
};

void run_bench_serve(BenchServeArgs a) {
  const bool lengths = a.input_len != 0 || a.output_len != 0;
  MOESQ_CHECK(a.workload.empty() != !lengths,
              "bench serve: give --workload decode|prefill|reference, or both --input-len and --output-len");
  if (!a.workload.empty()) {
    a.load.workload = serve::named_workload(a.workload);
  } else {
    MOESQ_CHECK(a.input_len >= 1, "--input-len: ", a.input_len, " must be >= 1 (give it with --output-len)");
    MOESQ_CHECK(a.output_len >= 1, "--output-len: ", a.output_len, " must be >= 1 (give it with --input-len)");
    a.load.workload = {"custom", a.input_len, a.output_len};
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  const serve::LoadReport rep = serve::run_load(a.load, [&](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done != total && now - last < std::chrono::seconds(1)) return;
    last = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    const double eta = s / static_cast<double>(done) * static_cast<double>(total - done);
    char msg[160];
    std::snprintf(msg, sizeof msg, "%lld/%lld requests, %.1f s, ETA %.1f s", static_cast<long long>(done),
                  static_cast<long long>(total), s, eta);
    progress("bench serve", msg);
  });
  if (a.json) std::printf("%s\n", rep.to_json().dump(2).c_str());
  else std::fputs(rep.to_text().c_str(), stdout);
  MOESQ_CHECK(rep.failed == 0, "bench serve: ", rep.failed, " of ", a.load.num_requests, " requests failed (first: ",
              rep.errors.empty() ? std::string("?") : rep.errors[0], ")");
}

}  // namespace

void register_bench_serve(CLI::App* bench) {
  auto args = std::make_shared<BenchServeArgs>();
  auto* cmd = bench->add_subcommand(
      "serve",
      "Load generator for an OpenAI-compatible server (moesq serve, vLLM, SGLang): streamed /v1/completions of random "
      "token-id prompts from C concurrent clients; request/token throughput and TTFT, TPOT, ITL, end-to-end latency "
      "(mean, median, p99), as vLLM's serving benchmark reports them");
  cmd->add_option("--url", args->load.url, "the server, http://HOST:PORT")->required();
  cmd->add_option("--workload", args->workload,
                  "decode (384 in / 128 out), prefill (4096 / 1) or reference (1024 / 256); or give --input-len and "
                  "--output-len");
  cmd->add_option("--input-len", args->input_len, "prompt tokens per request (random ids)");
  cmd->add_option("--output-len", args->output_len, "max_tokens per request");
  cmd->add_option("--num-requests", args->load.num_requests, "requests in all")->required();
  cmd->add_option("--concurrency", args->load.concurrency, "clients, each with one request in flight")
      ->capture_default_str();
  cmd->add_option("--vocab-size", args->load.vocab_size,
                  "prompt ids are drawn from [0, V); default: vocab_size from the server's GET /v1/models");
  cmd->add_option("--model", args->load.model, "the requests' model field; default: the first of GET /v1/models");
  cmd->add_option("--seed", args->load.seed, "seed of the random prompts")->capture_default_str();
  cmd->add_option("--timeout", args->load.timeout_s, "seconds to connect / wait for bytes, per request")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object instead of the table");
  cmd->callback([args] { run_bench_serve(*args); });
}

}  // namespace moesq::cli
