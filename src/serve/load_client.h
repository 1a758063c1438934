// The serving load generator behind `moesq bench serve`: N requests of random token-id prompts sent
// to an OpenAI-compatible server (`POST /v1/completions`, streamed as server-sent events) by C
// concurrent clients over real HTTP, with the figures vLLM's serving benchmark reports: request and
// token throughput; TTFT, TPOT, inter-token and end-to-end latency (mean, median, p99); failures.
//
// Definitions (per request, milliseconds), as vLLM's benchmark times them: TTFT = the first streamed
// chunk carrying tokens (non-empty text, or non-empty `token_ids` from a server without a tokenizer)
// − request sent; E2E = `data: [DONE]` − request sent; ITL = the gaps between successive such chunks
// (a server that holds back a partial UTF-8 character sends fewer chunks than tokens); TPOT = (E2E − TTFT) ÷ (output tokens − 1), for requests of ≥ 2 output
// tokens. Output tokens are the stream's final `usage.completion_tokens` when the server sends it
// (the request asks for it with `stream_options.include_usage`), else the number of such chunks.
// Throughput = completed requests (or their tokens) ÷ the wall time from the first request sent to
// the last response ended. A failure is a transport error, a non-200 status, an `error` object in
// the stream, or a stream that ends without `[DONE]`; its first messages are kept.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/latency_stats.h"

namespace moesq::serve {

struct LoadWorkload {
  std::string name;  // "decode", "prefill", "reference", or "custom"
  int64_t input_len = 0, output_len = 0;
};
// The named workloads of the serving targets: decode 384 in / 128 out, prefill 4,096 / 1,
// reference 1,024 / 256. Error: any other name (the message lists them).
LoadWorkload named_workload(const std::string& name);

struct LoadOptions {
  std::string url;                 // http://HOST:PORT (or https://)
  LoadWorkload workload;           // prompt and output lengths in tokens, each >= 1
  int64_t num_requests = 0;        // >= 1
  int64_t concurrency = 1;         // >= 1 clients, each with one request in flight
  int64_t vocab_size = 0;          // prompt ids are drawn from [0, vocab_size); 0 = ask GET /v1/models
  std::string model;               // the requests' "model"; empty = the first id of GET /v1/models
  uint64_t seed = 0;               // the prompts' random ids (request i's depend on seed and i only)
  double timeout_s = 600;          // per request: connect and read
};

struct LoadReport {
  LoadOptions options;
  std::string model;
  double duration_s = 0;
  int64_t completed = 0, failed = 0;
  int64_t input_tokens = 0, output_tokens = 0;  // of the completed requests
  double request_throughput = 0, output_throughput = 0, total_throughput = 0;  // per second
  LatencySummary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::vector<std::string> errors;  // the first failures' messages (at most 8)

  nlohmann::ordered_json to_json() const;
  std::string to_text() const;  // the table printed by `bench serve` without --json
};

// Checks the options (error naming the flag), asks the server for its model (and vocabulary size
// when not given; an error says to pass --vocab-size when the server does not report one), then
// runs the load. `on_progress(done, total)` is called from the client threads as requests end.
// Errors: bad options, the server unreachable or not answering /v1/models. Request failures are
// counted, not thrown.
LoadReport run_load(const LoadOptions& options,
                    const std::function<void(int64_t done, int64_t total)>& on_progress = nullptr);

}  // namespace moesq::serve
