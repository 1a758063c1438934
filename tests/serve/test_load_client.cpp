// run_load against an in-process fake OpenAI server (httplib on loopback): counts, token totals,
// the latency definitions, failures of each kind, the prompts' seeding, and option errors.
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "serve/load_client.h"

#ifdef MOESQ_HAVE_HTTPLIB
#include <httplib.h>

using namespace moesq::serve;

namespace {

// A fake server: streams max_tokens choice chunks (a usage chunk when asked), then [DONE].
// Request bodies are recorded. Failure modes by prompt: first id % fail_every == 0 → HTTP 400
// (fail_every > 0); cut_stream → the stream ends without [DONE].
class FakeServer {
 public:
  int fail_every = 0;
  bool cut_stream = false;
  bool report_vocab = true;
  std::mutex mu;
  std::vector<nlohmann::json> bodies;
  std::atomic<int> in_flight{0}, max_in_flight{0};

  FakeServer() {
    svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json m = {{"id", "fake-model"}, {"object", "model"}};
      if (report_vocab) m["vocab_size"] = 100;
      res.set_content(nlohmann::json{{"object", "list"}, {"data", {m}}}.dump(), "application/json");
    });
    svr_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const nlohmann::json body = nlohmann::json::parse(req.body);
      {
        std::lock_guard<std::mutex> lock(mu);
        bodies.push_back(body);
      }
      const int64_t first = body["prompt"][0].get<int64_t>();
      if (fail_every > 0 && first % fail_every == 0) {
        res.status = 400;
        res.set_content(R"({"error":{"message":"bad prompt","type":"invalid_request_error","param":"prompt","code":null}})",
                        "application/json");
        return;
      }
      const int64_t n = body["max_tokens"].get<int64_t>();
      const bool usage = body.contains("stream_options") && body["stream_options"].value("include_usage", false);
      const int now = ++in_flight;
      for (int m = max_in_flight.load(); now > m && !max_in_flight.compare_exchange_weak(m, now);) {
      }
      res.set_chunked_content_provider("text/event-stream", [this, n, usage](size_t, httplib::DataSink& sink) {
        for (int64_t i = 0; i < n; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          const std::string ev =
              "data: " + nlohmann::json{{"choices", {{{"index", 0}, {"text", "t"}}}}}.dump() + "\n\n";
          sink.write(ev.data(), ev.size());
        }
        const std::string fin =  // the final chunk: a finish_reason and no text (not a token event)
            "data: " + nlohmann::json{{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "length"}}}}}.dump() + "\n\n";
        sink.write(fin.data(), fin.size());
        if (usage) {
          const std::string ev =
              "data: " + nlohmann::json{{"choices", nlohmann::json::array()}, {"usage", {{"completion_tokens", n}}}}.dump() + "\n\n";
          sink.write(ev.data(), ev.size());
        }
        if (!cut_stream) sink.write("data: [DONE]\n\n", 14);
        --in_flight;
        sink.done();
        return true;
      });
    });
    svr_.set_tcp_nodelay(true);  // each token its own segment (as a streaming server must send it)
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    for (int i = 0; i < 2000 && !svr_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    svr_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server svr_;
  int port_ = 0;
  std::thread thread_;
};

LoadOptions options(const std::string& url) {
  LoadOptions o;
  o.url = url;
  o.workload = {"custom", 7, 5};
  o.num_requests = 12;
  o.concurrency = 4;
  o.seed = 3;
  o.timeout_s = 20;
  return o;
}

}  // namespace

TEST(LoadClient, CountsTokensAndLatencies) {
  FakeServer fake;
  const LoadReport r = run_load(options(fake.url()));
  EXPECT_EQ(r.completed, 12);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.model, "fake-model");
  EXPECT_EQ(r.input_tokens, 12 * 7);
  EXPECT_EQ(r.output_tokens, 12 * 5);
  EXPECT_EQ(r.ttft_ms.count, 12);
  EXPECT_EQ(r.tpot_ms.count, 12);
  EXPECT_EQ(r.itl_ms.count, 12 * 4);  // 5 text chunks: 4 gaps each (the finish and usage chunks carry no text)
  EXPECT_GT(r.ttft_ms.min, 0);
  EXPECT_LE(r.ttft_ms.max, r.e2e_ms.max);
  EXPECT_GE(r.itl_ms.median, 1.0) << "ttft " << r.ttft_ms.mean << " e2e " << r.e2e_ms.mean << " itl max " << r.itl_ms.max;  // the fake sleeps 2 ms per token
  EXPECT_GT(r.output_throughput, 0);
  EXPECT_NEAR(r.total_throughput, r.output_throughput * 12.0 / 5.0, 1e-6 * r.total_throughput);
  EXPECT_LE(fake.max_in_flight.load(), 4);
  ASSERT_EQ(fake.bodies.size(), 12u);
  for (const auto& b : fake.bodies) {
    ASSERT_EQ(b["prompt"].size(), 7u);
    for (const auto& id : b["prompt"]) EXPECT_TRUE(id.get<int64_t>() >= 0 && id.get<int64_t>() < 100);
    EXPECT_EQ(b["max_tokens"], 5);
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["model"], "fake-model");
  }
  const nlohmann::ordered_json j = r.to_json();
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["ttft_ms"]["count"], 12);
  EXPECT_NE(r.to_text().find("Output token throughput (tok/s):"), std::string::npos);
}

TEST(LoadClient, PromptsDependOnSeedAndIndexOnly) {
  auto prompts = [](FakeServer& f) {
    std::set<std::string> s;
    for (const auto& b : f.bodies) s.insert(b["prompt"].dump());
    return s;
  };
  FakeServer a, b, c;
  LoadOptions o = options(a.url());
  run_load(o);
  o.url = b.url();
  o.concurrency = 1;  // another interleaving: the same 12 prompts
  run_load(o);
  o.url = c.url();
  o.seed = 4;
  run_load(o);
  EXPECT_EQ(prompts(a), prompts(b));
  EXPECT_EQ(prompts(a).size(), 12u);
  EXPECT_NE(prompts(a), prompts(c));
}

TEST(LoadClient, FailuresAreCountedAndNamed) {
  FakeServer fake;
  fake.fail_every = 2;  // prompts whose first id is even answer 400
  const LoadReport r = run_load(options(fake.url()));
  EXPECT_EQ(r.completed + r.failed, 12);
  EXPECT_GT(r.failed, 0);
  ASSERT_FALSE(r.errors.empty());
  EXPECT_NE(r.errors[0].find("HTTP 400"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[0].find("bad prompt"), std::string::npos) << r.errors[0];
  EXPECT_EQ(r.output_tokens, r.completed * 5);

  FakeServer cut;
  cut.cut_stream = true;
  const LoadReport rc = run_load(options(cut.url()));
  EXPECT_EQ(rc.failed, 12);
  EXPECT_NE(rc.errors[0].find("[DONE]"), std::string::npos) << rc.errors[0];
}

TEST(LoadClient, OptionAndServerErrors) {
  FakeServer fake;
  auto fails = [](LoadOptions o, const std::string& what) {
    try {
      run_load(o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const moesq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  LoadOptions o = options(fake.url());
  o.num_requests = 0;
  fails(o, "--num-requests");
  o = options(fake.url());
  o.concurrency = 0;
  fails(o, "--concurrency");
  o = options(fake.url());
  o.workload.input_len = 0;
  fails(o, "--input-len");
  o = options("localhost:8000");
  fails(o, "--url");
  o = options("http://127.0.0.1:1");  // nothing listens on port 1
  fails(o, "cannot reach");
  fake.report_vocab = false;
  fails(options(fake.url()), "--vocab-size");
  o = options(fake.url());
  o.vocab_size = 50;
  const LoadReport r = run_load(o);
  EXPECT_EQ(r.completed, 12);
  for (const auto& b : fake.bodies)
    for (const auto& id : b["prompt"]) EXPECT_LT(id.get<int64_t>(), 50);
}

TEST(LoadClient, NamedWorkloads) {
  EXPECT_EQ(named_workload("decode").input_len, 384);
  EXPECT_EQ(named_workload("decode").output_len, 128);
  EXPECT_EQ(named_workload("prefill").input_len, 4096);
  EXPECT_EQ(named_workload("prefill").output_len, 1);
  EXPECT_EQ(named_workload("reference").input_len, 1024);
  EXPECT_EQ(named_workload("reference").output_len, 256);
  EXPECT_THROW(named_workload("chat"), moesq::Error);
}

#else

TEST(LoadClient, NeedsHttplib) { GTEST_SKIP() << "built without cpp-httplib"; }

#endif
