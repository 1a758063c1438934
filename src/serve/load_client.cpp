// run_load (load_client.h): C client threads over httplib::Client, one streamed request each at a
// time, the SSE stream read by SseReader; the per-request figures are reduced by latency_stats.
#include "serve/load_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "serve/sse_reader.h"
#ifdef MOESQ_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace moesq::serve {

namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct RequestResult {
  bool ok = false;
  std::string error;
  int64_t output_tokens = 0;
  double ttft_ms = 0, e2e_ms = 0;
  std::vector<double> itl_ms;
};

// Request i's prompt: input_len ids uniform in [0, V) from a generator seeded by (seed, i).
std::vector<int64_t> prompt_ids(const LoadOptions& o, int64_t i) {
  std::seed_seq seq{static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32), static_cast<uint32_t>(i),
                    static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32)};
  std::mt19937_64 rng(seq);
  std::uniform_int_distribution<int64_t> id(0, o.vocab_size - 1);
  std::vector<int64_t> ids(static_cast<size_t>(o.workload.input_len));
  for (auto& t : ids) t = id(rng);
  return ids;
}

// A streamed chunk that carries generated tokens: non-empty text (completions' choices[0].text,
// chat's choices[0].delta.content) or non-empty choices[0].token_ids (a server without a tokenizer
// sends ids and no text): the events TTFT and ITL are timed on. A final chunk with only a
// finish_reason, or the usage chunk, carries none.
bool carries_tokens(const nlohmann::json& j) {
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty() || !j["choices"][0].is_object())
    return false;
  const nlohmann::json& c = j["choices"][0];
  auto non_empty = [](const nlohmann::json& v) { return v.is_string() && !v.get_ref<const std::string&>().empty(); };
  if (c.contains("text") && non_empty(c["text"])) return true;
  if (c.contains("token_ids") && c["token_ids"].is_array() && !c["token_ids"].empty()) return true;
  return c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") && non_empty(c["delta"]["content"]);
}

}  // namespace

LoadWorkload named_workload(const std::string& name) {
  if (name == "decode") return {"decode", 384, 128};
  if (name == "prefill") return {"prefill", 4096, 1};
  if (name == "reference") return {"reference", 1024, 256};
  MOESQ_FAIL("--workload: '", name, "' is not decode (384 in / 128 out), prefill (4096 / 1) or reference (1024 / 256)");
}

nlohmann::ordered_json LoadReport::to_json() const {
  auto lat = [](const LatencySummary& s) {
    return nlohmann::ordered_json{{"count", s.count}, {"mean", s.mean}, {"median", s.median}, {"p99", s.p99},
                                  {"min", s.min}, {"max", s.max}};
  };
  return {{"url", options.url},
          {"model", model},
          {"workload", options.workload.name},
          {"input_len", options.workload.input_len},
          {"output_len", options.workload.output_len},
          {"num_requests", options.num_requests},
          {"concurrency", options.concurrency},
          {"seed", options.seed},
          {"duration_s", duration_s},
          {"completed", completed},
          {"failed", failed},
          {"input_tokens", input_tokens},
          {"output_tokens", output_tokens},
          {"request_throughput", request_throughput},
          {"output_throughput", output_throughput},
          {"total_token_throughput", total_throughput},
          {"ttft_ms", lat(ttft_ms)},
          {"tpot_ms", lat(tpot_ms)},
          {"itl_ms", lat(itl_ms)},
          {"e2e_latency_ms", lat(e2e_ms)},
          {"errors", errors}};
}

std::string LoadReport::to_text() const {
  std::string s;
  char line[200];
  auto add = [&](const char* label, const std::string& value) {
    std::snprintf(line, sizeof line, "%-34s %s\n", label, value.c_str());
    s += line;
  };
  auto num = [](double v, int prec) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", prec, v);
    return std::string(b);
  };
  s += "============ Serving Benchmark Result ============\n";
  add("Model:", model);
  add("Workload:", options.workload.name + " (" + std::to_string(options.workload.input_len) + " in / " +
                       std::to_string(options.workload.output_len) + " out)");
  add("Concurrency:", std::to_string(options.concurrency));
  add("Successful requests:", std::to_string(completed));
  add("Failed requests:", std::to_string(failed));
  add("Benchmark duration (s):", num(duration_s, 2));
  add("Total input tokens:", std::to_string(input_tokens));
  add("Total generated tokens:", std::to_string(output_tokens));
  add("Request throughput (req/s):", num(request_throughput, 2));
  add("Output token throughput (tok/s):", num(output_throughput, 2));
  add("Total token throughput (tok/s):", num(total_throughput, 2));
  auto block = [&](const char* title, const char* key, const LatencySummary& l) {
    s += std::string("---------------") + title + "----------------\n";
    add((std::string("Mean ") + key + " (ms):").c_str(), num(l.mean, 2));
    add((std::string("Median ") + key + " (ms):").c_str(), num(l.median, 2));
    add((std::string("P99 ") + key + " (ms):").c_str(), num(l.p99, 2));
  };
  block("Time to First Token", "TTFT", ttft_ms);
  block("Time per Output Token (excl. 1st token)", "TPOT", tpot_ms);
  block("Inter-token Latency", "ITL", itl_ms);
  block("End-to-end Latency", "E2EL", e2e_ms);
  s += "==================================================\n";
  for (const auto& e : errors) s += "failure: " + e + "\n";
  return s;
}

#ifdef MOESQ_HAVE_HTTPLIB

namespace {

std::string transport_error(const httplib::Result& r) { return "transport error: " + httplib::to_string(r.error()); }

void set_timeouts(httplib::Client& c, double timeout_s) {
  const auto sec = static_cast<time_t>(timeout_s);
  const auto usec = static_cast<time_t>((timeout_s - static_cast<double>(sec)) * 1e6);
  c.set_connection_timeout(sec, usec);
  c.set_read_timeout(sec, usec);
  c.set_write_timeout(sec, usec);
}

// One streamed completion; every outcome is a RequestResult (nothing throws out of a client thread).
RequestResult one_request(httplib::Client& cli, const LoadOptions& o, const std::string& model, int64_t i) {
  RequestResult r;
  const nlohmann::json body = {{"model", model},
                               {"prompt", prompt_ids(o, i)},
                               {"max_tokens", o.workload.output_len},
                               {"temperature", 0.0},
                               {"stream", true},
                               {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  SseReader sse;
  int status = 0;
  std::string error_body;
  bool done = false;
  int64_t chunks = 0, usage_tokens = -1;
  const auto t0 = Clock::now();
  Clock::time_point last;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {  // an error answer: keep its body for the message
      if (error_body.size() < 2000) error_body.append(data, std::min(n, 2000 - error_body.size()));
      return true;
    }
    const auto now = Clock::now();
    for (const std::string& ev : sse.feed(data, n)) {
      if (ev == "[DONE]") {
        done = true;
        r.e2e_ms = ms_between(t0, now);
        continue;
      }
      nlohmann::json j = nlohmann::json::parse(ev, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        r.error = "a streamed event is not a JSON object: " + ev.substr(0, 200);
        return false;
      }
      if (j.contains("error")) {
        r.error = "the stream carried an error: " + j["error"].dump().substr(0, 300);
        return false;
      }
      if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens") &&
          j["usage"]["completion_tokens"].is_number_integer())
        usage_tokens = j["usage"]["completion_tokens"].get<int64_t>();
      if (carries_tokens(j)) {
        if (chunks == 0) r.ttft_ms = ms_between(t0, now);
        else r.itl_ms.push_back(ms_between(last, now));
        last = now;
        ++chunks;
      }
    }
    return true;
  };
  const httplib::Result res = cli.send(req);
  if (!r.error.empty()) return r;
  if (!res) {
    r.error = "request " + std::to_string(i) + ": " + transport_error(res);
    return r;
  }
  if (status != 200) {
    r.error = "request " + std::to_string(i) + ": HTTP " + std::to_string(status) + " " + error_body.substr(0, 300);
    return r;
  }
  if (!done) {
    r.error = "request " + std::to_string(i) + ": the stream ended without data: [DONE]";
    return r;
  }
  if (chunks == 0) {
    r.error = "request " + std::to_string(i) + ": the stream carried no choice";
    return r;
  }
  r.output_tokens = usage_tokens >= 0 ? usage_tokens : chunks;
  r.ok = true;
  return r;
}

}  // namespace

LoadReport run_load(const LoadOptions& o_in, const std::function<void(int64_t, int64_t)>& on_progress) {
  LoadOptions o = o_in;
  MOESQ_CHECK(o.url.rfind("http://", 0) == 0 || o.url.rfind("https://", 0) == 0, "--url: '", o.url,
              "' is not http://HOST:PORT");
  MOESQ_CHECK(o.workload.input_len >= 1, "--input-len: ", o.workload.input_len, " must be >= 1");
  MOESQ_CHECK(o.workload.output_len >= 1, "--output-len: ", o.workload.output_len, " must be >= 1");
  MOESQ_CHECK(o.num_requests >= 1, "--num-requests: ", o.num_requests, " must be >= 1");
  MOESQ_CHECK(o.concurrency >= 1, "--concurrency: ", o.concurrency, " must be >= 1");
  MOESQ_CHECK(o.vocab_size >= 0, "--vocab-size: ", o.vocab_size, " must be >= 1");
  MOESQ_CHECK(o.timeout_s > 0, "--timeout: ", o.timeout_s, " must be > 0");
  // The server's model (and vocabulary) from GET /v1/models.
  {
    httplib::Client probe(o.url);
    MOESQ_CHECK(probe.is_valid(), "--url: '", o.url, "' is not a usable address");
    set_timeouts(probe, std::min(o.timeout_s, 30.0));
    const httplib::Result res = probe.Get("/v1/models");
    MOESQ_CHECK(res, "bench serve: cannot reach ", o.url, " (", transport_error(res), ")");
    MOESQ_CHECK(res->status == 200, "bench serve: GET ", o.url, "/v1/models answered HTTP ", res->status);
    const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
    const bool listed = j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
                        j["data"][0].is_object();
    MOESQ_CHECK(listed || !o.model.empty(), "bench serve: GET ", o.url, "/v1/models lists no model (give --model)");
    if (o.model.empty()) {
      MOESQ_CHECK(j["data"][0].contains("id") && j["data"][0]["id"].is_string(), "bench serve: GET ", o.url,
                  "/v1/models: data[0].id is not a string (give --model)");
      o.model = j["data"][0]["id"].get<std::string>();
    }
    if (o.vocab_size == 0) {
      const bool has = listed && j["data"][0].contains("vocab_size") && j["data"][0]["vocab_size"].is_number_integer();
      MOESQ_CHECK(has, "bench serve: the server does not report vocab_size in GET /v1/models: give --vocab-size");
      o.vocab_size = j["data"][0]["vocab_size"].get<int64_t>();
      MOESQ_CHECK(o.vocab_size >= 1, "bench serve: the server reports vocab_size ", o.vocab_size);
    }
  }
  LoadReport rep;
  rep.options = o;
  rep.model = o.model;
  std::vector<RequestResult> results(static_cast<size_t>(o.num_requests));
  std::atomic<int64_t> next{0}, done{0};
  std::mutex progress_mu;
  const int64_t clients = std::min(o.concurrency, o.num_requests);
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      httplib::Client cli(o.url);
      set_timeouts(cli, o.timeout_s);
      cli.set_keep_alive(true);
      cli.set_tcp_nodelay(true);
      for (int64_t i = next++; i < o.num_requests; i = next++) {
        try {
          results[static_cast<size_t>(i)] = one_request(cli, o, o.model, i);
        } catch (const std::exception& e) {
          results[static_cast<size_t>(i)].error = "request " + std::to_string(i) + ": " + e.what();
        }
        const int64_t d = ++done;
        if (on_progress) {
          std::lock_guard<std::mutex> lock(progress_mu);
          on_progress(d, o.num_requests);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  rep.duration_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++rep.failed;
      if (rep.errors.size() < 8) rep.errors.push_back(r.error);
      continue;
    }
    ++rep.completed;
    rep.input_tokens += o.workload.input_len;
    rep.output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    if (r.output_tokens >= 2) tpot.push_back((r.e2e_ms - r.ttft_ms) / static_cast<double>(r.output_tokens - 1));
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
  }
  const double dur = std::max(rep.duration_s, 1e-9);
  rep.request_throughput = static_cast<double>(rep.completed) / dur;
  rep.output_throughput = static_cast<double>(rep.output_tokens) / dur;
  rep.total_throughput = static_cast<double>(rep.input_tokens + rep.output_tokens) / dur;
  rep.ttft_ms = summarize(ttft), rep.tpot_ms = summarize(tpot), rep.itl_ms = summarize(itl), rep.e2e_ms = summarize(e2e);
  return rep;
}

#else

LoadReport run_load(const LoadOptions&, const std::function<void(int64_t, int64_t)>&) {
  MOESQ_FAIL("bench serve: this moesq was built without cpp-httplib (install libcpp-httplib-dev and rebuild)");
}

#endif

}  // namespace moesq::serve
