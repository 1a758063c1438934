// The HTTP server without a tokenizer (what `moesq serve --synthetic` runs), in process on loopback
// over a fake decode backend whose greedy next token is (last token + 1) mod V: text prompts, stop
// strings and chat are refused with 400 naming the field; token-id prompts are answered with the ids
// and an empty text (whole and streamed); GET /v1/models reports the vocabulary; `bench serve`'s
// load client counts the id-carrying chunks. Every wait is bounded in time.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/decode_backend.h"
#include "serve/http_server.h"
#include "serve/load_client.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

#ifdef MOESQ_HAVE_HTTPLIB
#include <httplib.h>

#include <sstream>
#include <thread>

using nlohmann::json;
using namespace moesq;

namespace {

constexpr int64_t kVocab = 50;

// Logits [V] peaked at (t + 1) mod V: greedy decoding counts up from the prompt's last id.
std::vector<float> next_of(int32_t t) {
  std::vector<float> l(kVocab, 0.0f);
  l[(t + 1) % kVocab] = 10.0f;
  return l;
}

class CountingBackend final : public runtime::DecodeBackend {
 public:
  int64_t vocab_size() const override { return kVocab; }
  int num_slots() const override { return 4; }
  std::vector<float> prefill(int, const std::vector<int32_t>& prompt) override { return next_of(prompt.back()); }
  std::vector<float> decode(const std::vector<int32_t>&, const std::vector<int32_t>& tokens) override {
    std::vector<float> out;
    for (int32_t t : tokens) {
      const std::vector<float> l = next_of(t);
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  }
};

struct TokenizerFreeServer {
  CountingBackend backend;
  serve::Metrics metrics;
  serve::Scheduler sched{backend, serve::SchedulerOptions{64}, metrics};
  serve::ServeContext ctx;
  std::unique_ptr<serve::HttpServer> http;
  std::thread thread;
  int port = 0;

  TokenizerFreeServer() {
    ctx.scheduler = &sched, ctx.metrics = &metrics, ctx.tokenizer = nullptr;
    ctx.limits = serve::ProtocolLimits{kVocab, 64};
    ctx.model_name = "synthetic:counting";
    http = std::make_unique<serve::HttpServer>(ctx, 16);
    port = http->bind("127.0.0.1", 0);
    thread = std::thread([this] { http->run(); });
    for (int i = 0; i < 100; ++i) {  // until it answers (10 s)
      httplib::Client c("127.0.0.1", port);
      auto r = c.Get("/health");
      if (r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~TokenizerFreeServer() {
    http->stop();
    thread.join();
    sched.shutdown(false);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    return c;
  }
};

// POST → (status, parsed body); a stream's events are parsed into `events` ([DONE] excluded).
struct Reply {
  int status = 0;
  json body;
  std::vector<json> events;
  bool done = false;
};
Reply post(httplib::Client& c, const std::string& path, const json& body) {
  Reply r;
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  if (!res) return r;
  r.status = res->status;
  if (!body.value("stream", false) || res->status != 200) {
    r.body = json::parse(res->body, nullptr, false);
    return r;
  }
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") r.done = true;
    else r.events.push_back(json::parse(line.substr(6)));
  }
  return r;
}

void expect_400(const Reply& r, const std::string& param, const std::string& says) {
  EXPECT_EQ(r.status, 400) << r.body.dump();
  ASSERT_TRUE(r.body.contains("error")) << r.body.dump();
  EXPECT_EQ(r.body["error"]["param"], param) << r.body.dump();
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find(says), std::string::npos) << r.body.dump();
}

}  // namespace

TEST(TokenizerFreeServer, RefusesWhatNeedsATokenizer) {
  TokenizerFreeServer s;
  ASSERT_GT(s.port, 0);
  httplib::Client c = s.client();
  expect_400(post(c, "/v1/completions", json{{"prompt", "hello"}, {"max_tokens", 2}}), "prompt",
             "has no tokenizer: send 'prompt' as a list of token ids");
  expect_400(post(c, "/v1/completions", json{{"prompt", {1, 2}}, {"stop", "x"}}), "stop", "use stop_token_ids");
  expect_400(post(c, "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}}), "messages",
             "/v1/chat/completions is not served");
  // The ordinary checks still apply: an id outside the vocabulary is named.
  expect_400(post(c, "/v1/completions", json{{"prompt", {1, kVocab}}}), "prompt", "outside the vocabulary");
  // The server goes on.
  EXPECT_EQ(post(c, "/v1/completions", json{{"prompt", {3}}, {"max_tokens", 1}}).status, 200);
}

TEST(TokenizerFreeServer, AnswersIdsWithEmptyText) {
  TokenizerFreeServer s;
  ASSERT_GT(s.port, 0);
  httplib::Client c = s.client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body)["data"][0];
  EXPECT_EQ(m["id"], "synthetic:counting");
  EXPECT_EQ(m["vocab_size"], kVocab);

  const Reply whole = post(c, "/v1/completions", json{{"prompt", {7, 48}}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(whole.status, 200) << whole.body.dump();
  const json& ch = whole.body["choices"][0];
  EXPECT_EQ(ch["text"], "");
  EXPECT_EQ(ch["token_ids"], json({49, 0, 1, 2}));  // counts up from 48, mod 50
  EXPECT_EQ(ch["finish_reason"], "length");
  EXPECT_EQ(whole.body["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(whole.body["usage"]["completion_tokens"], 4);

  const Reply streamed = post(c, "/v1/completions",
                              json{{"prompt", {20}}, {"max_tokens", 5}, {"temperature", 0}, {"stream", true},
                                   {"stop_token_ids", {24}}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(streamed.status, 200);
  EXPECT_TRUE(streamed.done);
  std::vector<int32_t> ids;
  std::string finish;
  for (const json& e : streamed.events) {
    if (e["choices"].empty()) {
      EXPECT_EQ(e["usage"]["completion_tokens"], 4);  // 21 22 23 24: the stop id ends it
      continue;
    }
    const json& ec = e["choices"][0];
    EXPECT_EQ(ec["text"], "");
    for (const auto& t : ec["token_ids"]) ids.push_back(t.get<int32_t>());
    if (!ec["finish_reason"].is_null()) finish = ec["finish_reason"];
  }
  EXPECT_EQ(ids, (std::vector<int32_t>{21, 22, 23, 24}));
  EXPECT_EQ(finish, "stop");
}

TEST(TokenizerFreeServer, LoadClientCountsIdChunks) {
  TokenizerFreeServer s;
  ASSERT_GT(s.port, 0);
  serve::LoadOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(s.port);
  o.workload = {"custom", 6, 5};
  o.num_requests = 12, o.concurrency = 4, o.timeout_s = 30;
  const serve::LoadReport r = serve::run_load(o);
  EXPECT_EQ(r.model, "synthetic:counting");
  EXPECT_EQ(r.completed, 12) << (r.errors.empty() ? "" : r.errors[0]);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.output_tokens, 12 * 5);
  EXPECT_EQ(r.ttft_ms.count, 12);
  EXPECT_EQ(r.tpot_ms.count, 12);
  // An inter-token gap per id-carrying chunk after the first: at most one per token after the first
  // (a poll may take several ids at once).
  EXPECT_LE(r.itl_ms.count, 12 * 4);
}

#else
TEST(TokenizerFreeServer, NeedsHttplib) { GTEST_SKIP() << "built without cpp-httplib"; }
#endif
