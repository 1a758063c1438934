// `moesq serve` as a real process on the tiny model (CPU), talked to over loopback with
// httplib::Client: concurrent requests (half streamed) each equal to runtime::Generator of the same
// request alone, the GET endpoints, bad requests (400 naming the field), queue full (503), a client
// that goes away mid-stream, chat through a checkpoint's template, SIGTERM with requests in flight.
// Every wait is bounded in time. Also (any build): the flag errors of `serve --synthetic`.
#include <gtest/gtest.h>

#ifdef MOESQ_HAVE_HTTPLIB
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/tokenizer.h"
#include "model/decoder.h"
#include "runtime/decode_backend.h"
#include "runtime/generator.h"
#include "serve/chat_template.h"
#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace moesq;

namespace {

// A `moesq serve DIR --port 0 ARGS` child; the port read from its stderr.
struct Server {
  pid_t pid = -1;
  int port = 0;
  test::TempDir scratch{"moesq_serve"};
  Server(const std::string& dir, const std::vector<std::string>& extra) {
    const std::string err = scratch.file("stderr.txt");
    pid = ::fork();
    if (pid == 0) {
      FILE* f = std::freopen(err.c_str(), "w", stderr);
      (void)f;
      std::vector<std::string> args{MOESQ_BINARY, "serve", dir, "--port", "0"};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(MOESQ_BINARY, argv.data());
      ::_exit(127);
    }
    const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 600 && port == 0; ++i) {  // 60 s
      std::smatch m;
      const std::string text = test::slurp(err);
      if (std::regex_search(text, m, re)) port = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (int i = 0; i < 100 && port > 0; ++i) {  // until it answers (10 s)
      httplib::Client c("127.0.0.1", port);
      auto r = c.Get("/health");
      if (r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::string log() const { return test::slurp(scratch.file("stderr.txt")); }
  // SIGTERM; the exit status (-1 if it did not exit within 30 s or died of a signal).
  int stop() {
    if (pid <= 0) return -1;
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 300; ++i) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
    return -1;
  }
  ~Server() { stop(); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
};

json request_body(int i) {
  json ids = json::array();
  for (int k = 0; k < 1 + i % 7; ++k) ids.push_back((37 * i + 11 * k) % 256);
  return json{{"prompt", ids},
              {"max_tokens", 1 + i % 9},
              {"temperature", i % 3 == 0 ? 0.0 : 0.7 + 0.1 * (i % 4)},
              {"top_p", i % 2 ? 0.9 : 1.0},
              {"seed", 1000 + i},
              {"return_token_ids", true},
              {"stream", i % 2 == 1}};
}

std::vector<int32_t> generator_ids(const json& body, int64_t max_len = 64) {
  static const io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  static const model::DecoderModel m(ckpt);
  runtime::CpuDecodeBackend one(m, max_len, 1, m.default_forward_options());
  runtime::Generator gen(one);
  runtime::SamplerOptions so;
  so.temperature = body["temperature"].get<float>(), so.top_p = body["top_p"].get<float>();
  so.seed = body["seed"].get<uint64_t>();
  runtime::StopOptions stop;
  stop.max_new_tokens = body["max_tokens"].get<int64_t>();
  return gen.generate(body["prompt"].get<std::vector<int32_t>>(), so, stop);
}

// POSTs `body`; returns the generated ids and the finish reason (streamed or whole).
struct Answer {
  int status = 0;
  std::vector<int32_t> ids;
  std::string text, finish_reason;
  json last;
};
Answer post(httplib::Client& c, const std::string& path, const json& body) {
  Answer a;
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) return a.last = json{{"client_error", httplib::to_string(r.error())}}, a;
  a.status = r->status;
  if (r->status != 200 || !body.value("stream", false)) {
    a.last = json::parse(r->body);
    if (r->status == 200) {
      const json& ch = a.last["choices"][0];
      a.ids = ch.value("token_ids", std::vector<int32_t>{});
      a.text = ch.contains("text") ? ch["text"].get<std::string>() : ch["message"]["content"].get<std::string>();
      a.finish_reason = ch["finish_reason"];
    }
    return a;
  }
  std::istringstream in(r->body);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    last = line.substr(6);
    if (last == "[DONE]") break;
    const json j = json::parse(last);
    const json& ch = j["choices"][0];
    for (int32_t t : ch["token_ids"]) a.ids.push_back(t);
    a.text += ch.value("text", "");
    if (!ch["finish_reason"].is_null()) a.finish_reason = ch["finish_reason"];
  }
  EXPECT_EQ(last, "[DONE]");
  return a;
}

}  // namespace

// With --max-num-batched-tokens 4 (chunked prefill: every prompt longer than 4 tokens goes in pieces
// between decode steps), each answer still equals the offline generation.
TEST(Serve, ConcurrentRequestsEqualGeneratorAlone) {
  Server s(MOESQ_DEFAULT_MODEL, {"--max-num-seqs", "8", "--max-model-len", "64", "--max-num-batched-tokens", "4"});
  ASSERT_GT(s.port, 0) << s.log();
  const int kN = 64;
  std::vector<Answer> got(kN);
  std::vector<std::thread> clients;
  for (int t = 0; t < 16; ++t)
    clients.emplace_back([&, t] {
      httplib::Client c = s.client();
      for (int i = t; i < kN; i += 16) got[i] = post(c, "/v1/completions", request_body(i));
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(got[i].status, 200) << "request " << i << " " << got[i].last.dump();
    EXPECT_EQ(got[i].ids, generator_ids(request_body(i))) << "request " << i;
    EXPECT_EQ(got[i].finish_reason, "length") << "request " << i;
  }
  httplib::Client c = s.client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], MOESQ_DEFAULT_MODEL);
  EXPECT_EQ(json::parse(models->body)["data"][0]["vocab_size"], io::Checkpoint(MOESQ_DEFAULT_MODEL).spec().vocab_size);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("moesq:request_success_total{finished_reason=\"length\"} 64"), std::string::npos)
      << metrics->body;
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// Paged KV on the CPU backend (--kv-cache-tokens 320: 5 blocks of 64 for 6 slots): 12 concurrent
// requests of 50–61 prompt tokens and 30 generated cross into a second block while decoding, so the
// server preempts and prefills again; every answer still equals the offline generation, the
// preemptions are counted in /metrics, and the capacity is printed at start.
TEST(Serve, PagedKvPreemptsAndAnswersEqualGeneratorAlone) {
  Server s(MOESQ_DEFAULT_MODEL, {"--max-num-seqs", "6", "--max-model-len", "256", "--kv-cache-tokens", "320"});
  ASSERT_GT(s.port, 0) << s.log();
  EXPECT_NE(s.log().find("KV capacity 320 tokens, paged (5 blocks of 64"), std::string::npos) << s.log();
  const int kN = 12;
  const auto body = [](int i) {
    json b = request_body(i);
    std::vector<int32_t> prompt;
    for (int k = 0; k < 50 + i; ++k) prompt.push_back(static_cast<int32_t>((31 * i + 7 * k) % 256));
    b["prompt"] = prompt;
    b["max_tokens"] = 30;
    return b;
  };
  std::vector<Answer> got(kN);
  std::vector<std::thread> clients;
  for (int i = 0; i < kN; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c = s.client();
      c.set_read_timeout(120, 0);
      got[i] = post(c, "/v1/completions", body(i));
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(got[i].status, 200) << "request " << i << " " << got[i].last.dump();
    EXPECT_EQ(got[i].ids, generator_ids(body(i), 256)) << "request " << i;
    EXPECT_EQ(got[i].finish_reason, "length") << "request " << i;
  }
  httplib::Client c = s.client();
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string key = "\nmoesq:num_preemptions_total ";
  const size_t at = metrics->body.find(key);
  ASSERT_NE(at, std::string::npos) << metrics->body;
  EXPECT_GT(std::stoi(metrics->body.substr(at + key.size())), 0) << metrics->body;
  EXPECT_NE(metrics->body.find("\nmoesq:kv_cache_usage_perc 0\n"), std::string::npos) << metrics->body;
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// `moesq bench serve` against the real server: every request answered, the token totals exact
// (no stop ids: each request runs to max_tokens), the latency figures ordered as defined.
TEST(Serve, BenchServeMeasuresTheServer) {
  Server s(MOESQ_DEFAULT_MODEL, {"--max-num-seqs", "4", "--max-model-len", "64"});
  ASSERT_GT(s.port, 0) << s.log();
  const std::string url = "http://127.0.0.1:" + std::to_string(s.port);
  const test::TempDir out("moesq_bench_serve");  // not the server's scratch: it holds the server's stderr
  const test::CliRun r = test::run_moesq("bench serve --url " + url +
                                             " --input-len 8 --output-len 5 --num-requests 12 --concurrency 4 --json",
                                         out.path.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["input_tokens"], 12 * 8);
  EXPECT_EQ(j["output_tokens"], 12 * 5);
  // At most 4 gaps per request: the byte-level model's partial UTF-8 characters are held back.
  EXPECT_LE(j["itl_ms"]["count"].get<int64_t>(), 12 * 4);
  EXPECT_EQ(j["ttft_ms"]["count"], 12);
  EXPECT_LE(j["ttft_ms"]["max"].get<double>(), j["e2e_latency_ms"]["max"].get<double>());
  EXPECT_GT(j["output_throughput"].get<double>(), 0.0);
  // An unknown workload name is an error naming the flag.
  const test::CliRun bad = test::run_moesq("bench serve --url " + url + " --workload chat --num-requests 1",
                                           out.path.string());
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--workload: 'chat'"), std::string::npos) << bad.err;
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST(Serve, BadRequestsNameTheFieldAndTheServerGoesOn) {
  Server s(MOESQ_DEFAULT_MODEL, {"--max-num-seqs", "2", "--max-model-len", "32"});
  ASSERT_GT(s.port, 0) << s.log();
  httplib::Client c = s.client();
  auto param = [&](const std::string& path, const std::string& body) {
    auto r = c.Post(path.c_str(), body, "application/json");
    if (!r) return std::string("<no answer>");
    EXPECT_EQ(r->status, 400) << body << " -> " << r->body;
    const json e = json::parse(r->body)["error"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    return e["param"].is_null() ? std::string() : e["param"].get<std::string>();
  };
  EXPECT_EQ(param("/v1/completions", "{nope"), "");
  EXPECT_EQ(param("/v1/completions", R"({"prompt":"a","frobnicate":1})"), "frobnicate");
  EXPECT_EQ(param("/v1/completions", R"({"prompt":"a","max_tokens":0})"), "max_tokens");
  EXPECT_EQ(param("/v1/completions", R"({"prompt":[1,256]})"), "prompt");
  EXPECT_EQ(param("/v1/completions", R"({"prompt":"a","temperature":"x"})"), "temperature");
  EXPECT_EQ(param("/v1/completions", json{{"prompt", std::string(40, 'a')}}.dump()), "prompt");
  EXPECT_EQ(param("/v1/completions", R"({"prompt":"abc","max_tokens":30})"), "max_tokens");
  EXPECT_EQ(param("/v1/completions", R"({"prompt":"a","n":3})"), "n");
  EXPECT_EQ(param("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})"), "messages");  // no template
  const Answer ok = post(c, "/v1/completions", json{{"prompt", "ab"}, {"max_tokens", 3}, {"temperature", 0}});
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.last["usage"]["completion_tokens"], 3);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST(Serve, QueueFullIs503AndAGoneClientIsCancelled) {
  Server s(MOESQ_DEFAULT_MODEL, {"--max-num-seqs", "1", "--max-queue", "0", "--max-model-len", "1024"});
  ASSERT_GT(s.port, 0) << s.log();
  // A long streamed request whose client goes away after the first event.
  std::atomic<bool> first{false};
  std::thread gone([&] {
    httplib::Client c = s.client();
    httplib::Request q;
    q.method = "POST", q.path = "/v1/completions";
    q.body = json{{"prompt", "a"}, {"max_tokens", 1000}, {"stream", true}}.dump();
    q.set_header("Content-Type", "application/json");
    q.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return first = true, false; };
    httplib::Response r;
    httplib::Error err;
    c.send(q, r, err);
  });
  for (int i = 0; i < 300 && !first; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  httplib::Client c = s.client();
  // While it holds the only slot (or until the server sees it gone), another request is refused.
  auto busy = c.Post("/v1/completions", R"({"prompt":"b","max_tokens":2})", "application/json");
  gone.join();
  ASSERT_TRUE(busy);
  if (busy->status == 503) EXPECT_EQ(json::parse(busy->body)["error"]["code"], "server_busy");
  // The gone client's request ends as cancelled, and the slot serves the next one.
  bool cancelled = false;
  for (int i = 0; i < 300 && !cancelled; ++i) {
    auto m = c.Get("/metrics");
    cancelled = m && m->body.find("finished_reason=\"cancelled\"} 1") != std::string::npos;
    if (!cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(cancelled);
  const Answer next = post(c, "/v1/completions", json{{"prompt", "b"}, {"max_tokens", 2}});
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST(Serve, QueueFullIs503) {
  Server s(MOESQ_DEFAULT_MODEL, {"--max-num-seqs", "1", "--max-queue", "0", "--max-model-len", "1024"});
  ASSERT_GT(s.port, 0) << s.log();
  std::atomic<int> long_status{0};
  std::thread longr([&] {  // until it gets the slot (a short request below may hold it a moment)
    httplib::Client c = s.client();
    for (int i = 0; i < 200 && long_status != 200; ++i)
      long_status = post(c, "/v1/completions", json{{"prompt", "a"}, {"max_tokens", 600}}).status;
  });
  httplib::Client c = s.client();
  int status = 0;
  // Probe only while the long request holds the slot (the running gauge is 1: this client's own
  // requests have all ended), so under a loaded machine the two clients cannot keep taking turns on the
  // one slot (each getting 200 or 503 in step) until both loops run out — as happened once under ctest -j2.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (status != 503 && long_status != 200 && std::chrono::steady_clock::now() < until) {
    auto m = c.Get("/metrics");
    if (!m || m->body.find("moesq:num_requests_running 1\n") == std::string::npos) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    auto r = c.Post("/v1/completions", R"({"prompt":"b","max_tokens":1})", "application/json");
    status = r ? r->status : 0;
  }
  EXPECT_EQ(status, 503);
  longr.join();
  EXPECT_EQ(long_status, 200);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST(Serve, SigtermFinishesInFlightRequests) {
  Server s(MOESQ_DEFAULT_MODEL, {"--max-num-seqs", "4", "--max-model-len", "256"});
  ASSERT_GT(s.port, 0) << s.log();
  std::vector<Answer> got(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c = s.client();
      got[i] = post(c, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 120}, {"seed", i}, {"stream", i % 2 == 1},
                                               {"return_token_ids", true}});
    });
  httplib::Client c = s.client();
  bool running = false;
  for (int i = 0; i < 300 && !running; ++i) {
    auto m = c.Get("/metrics");
    running = m && m->body.find("moesq:num_requests_running 4") != std::string::npos;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(running);
  EXPECT_EQ(s.stop(), 0) << s.log();
  for (auto& t : clients) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i].status, 200) << i;
    EXPECT_EQ(got[i].ids.size(), 120u) << i;
  }
}

TEST(Serve, ChatPrefillsTheRenderedTemplate) {
  test::TempDir dir("moesq_serve_chat");
  for (const auto& e : fs::directory_iterator(MOESQ_DEFAULT_MODEL))
    fs::create_symlink(fs::absolute(e.path()), dir.path / e.path().filename());
  fs::copy_file(fs::path(MOESQ_FIXTURES) / "chat_templates" / "Qwen-Qwen3-0.6B.jinja", dir.path / "chat_template.jinja");
  Server s(dir.path.string(), {"--max-num-seqs", "2", "--max-model-len", "256"});
  ASSERT_GT(s.port, 0) << s.log();
  serve::ChatRequest cr;
  cr.messages = nlohmann::ordered_json::parse(R"([{"role":"user","content":"hi there"}])");
  const std::string rendered = serve::ChatTemplate::from_dir(dir.path).render(cr);
  const io::Tokenizer tok = io::load_tokenizer_for_checkpoint(MOESQ_DEFAULT_MODEL);
  const std::vector<int32_t> ids = tok.encode(rendered, io::EncodeOptions{.add_special_tokens = false});
  httplib::Client c = s.client();
  const json common = {{"max_tokens", 6}, {"temperature", 0}, {"return_token_ids", true}};
  json chat = common;
  chat["messages"] = json::parse(cr.messages.dump());
  const Answer a = post(c, "/v1/chat/completions", chat);
  ASSERT_EQ(a.status, 200) << a.last.dump();
  EXPECT_EQ(a.last["object"], "chat.completion");
  EXPECT_EQ(a.last["usage"]["prompt_tokens"], ids.size());
  json comp = common;
  comp["prompt"] = ids;
  const Answer b = post(c, "/v1/completions", comp);
  ASSERT_EQ(b.status, 200);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.ids.size(), 6u);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

#else
TEST(Serve, NeedsHttplib) { GTEST_SKIP() << "built without cpp-httplib"; }
#endif

// `serve --synthetic`: every wrong combination of flags is an error naming the flag, before any
// model is built (so these run without a GPU, in any build).
#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace {
void expect_refused(const std::string& args, const std::string& says) {
  const moesq::test::TempDir t("moesq_serve_flags");
  const moesq::test::CliRun r = moesq::test::run_moesq("serve " + args, t.path.string());
  EXPECT_EQ(r.rc, 1) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(says), std::string::npos) << args << "\n" << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}
}  // namespace

TEST(ServeSynthetic, FlagErrorsNameTheFlag) {
  const std::string dir = MOESQ_DEFAULT_MODEL;
  const std::string syn = "--synthetic qwen3-30b-a3b --device cuda --experts sparse-w4a4";
  expect_refused("--port 0", "give a checkpoint DIR or --synthetic MODEL");
  expect_refused(dir + " " + syn, "are exclusive");
  expect_refused("--synthetic qwen3-30b-a3b --experts bf16", "--synthetic: the synthetic weights are drawn on the GPU: add --device cuda");
  expect_refused("--synthetic qwen3-30b-a3b --device cpu --experts bf16", "add --device cuda (got --device cpu)");
  expect_refused("--synthetic qwen3-30b-a3b --device cuda", "--synthetic: give --experts bf16, sparse-w4a4 or sparse-w4a16");
  expect_refused("--synthetic qwen9-moe --device cuda --experts bf16", "--synthetic: \"qwen9-moe\" is not one of qwen3-30b-a3b");
  expect_refused(syn + " --layers 49", "--layers: 49 not in [0, 48]");
  expect_refused("--synthetic qwen3-30b-a3b --device cuda --experts fp8", "--experts");
  expect_refused(syn + " --chat-template " + dir + "/config.json", "--chat-template: the synthetic model has no tokenizer");
  expect_refused(dir + " --layers 2", "--layers and --seed apply to --synthetic only");
  expect_refused(dir + " --seed 3", "--layers and --seed apply to --synthetic only");
  expect_refused(dir + " --max-num-batched-tokens -5", "--max-num-batched-tokens: -5 is not in [0, 1048576]");
  expect_refused(dir + " --kv-cache-tokens -3", "--kv-cache-tokens: -3 must be >= 0");
  expect_refused(dir + " --max-model-len 256 --kv-cache-tokens 100",
                 "--kv-cache-tokens 100 cannot hold one sequence of --max-model-len 256");
  expect_refused(dir + " --device cuda --max-num-batched-tokens 2000000",
                 "--max-num-batched-tokens: 2000000 is not in [0, 1048576]");
}

// The valid flags reach the engine: in a CPU build "built without CUDA" (before anything is built),
// in a CUDA build without a GPU "no CUDA device found"; with a GPU the one-layer engine is built and
// the address that cannot be bound (TEST-NET-1, not this machine's) ends the server (so this never leaves a server running).
TEST(ServeSynthetic, WithoutCudaOrAGpuSaysSo) {
  const moesq::test::TempDir t("moesq_serve_flags");
  const moesq::test::CliRun r = moesq::test::run_moesq(
      "serve --synthetic qwen3-30b-a3b --layers 1 --device cuda --experts sparse-w4a4 --max-num-seqs 1 "
      "--max-model-len 16 --host 192.0.2.1 --port 0",
      t.path.string());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  const bool no_build = r.err.find("--synthetic --device cuda: this moesq was built without CUDA") != std::string::npos;
  const bool no_device = r.err.find("no CUDA device found") != std::string::npos;
  const bool gpu = r.err.find("--host 192.0.2.1 --port 0: cannot listen there") != std::string::npos;
  EXPECT_TRUE(no_build || no_device || gpu) << r.err;
}
