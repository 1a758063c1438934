// http_server.h: the routes, one generation path shared by both POST endpoints.
#include "serve/http_server.h"

#include <atomic>
#include <chrono>
#include <ctime>

#include "core/error.h"
#include "serve/stop_strings.h"

#ifdef MOESQ_HAVE_HTTPLIB
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#endif

namespace moesq::serve {

using nlohmann::json;

#ifdef MOESQ_HAVE_HTTPLIB

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);  // how often a waiting handler checks its client

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_body(e)); }

// A finished generation: its text, ids and why it ended.
struct Outcome {
  std::string text, finish_reason;
  std::vector<int32_t> ids;
};

// One generation as the handler drives it: the scheduler's stream and the stop-string filter.
struct Generation {
  std::shared_ptr<Stream> stream;
  StopStringFilter filter;
  int64_t prompt_tokens = 0;
  bool done = false;
  std::string finish_reason;
  // Waits up to kPoll; returns the text now safe to send and the ids that produced it.
  std::string poll(std::vector<int32_t>& ids_out) {
    const Stream::Chunk c = stream->next(kPoll);
    std::string text = filter.stopped() ? "" : filter.add(c.tokens);
    ids_out = c.tokens;
    if (filter.stopped() && !done) {
      stream->cancel();  // a stop string: the sequence ends here (its slot is freed next step)
      done = true, finish_reason = "stop";
      return text;
    }
    if (c.done && !done) {
      if (c.finish_reason == "error") throw ApiError(500, "generation failed: " + c.error, "", "server_error");
      done = true, finish_reason = c.finish_reason;
      text += filter.flush();
    }
    return text;
  }
};

}  // namespace

struct HttpServer::Impl {
  ServeContext& ctx;
  httplib::Server svr;
  std::atomic<int64_t> next_id{0};

  Impl(ServeContext& c, int num_threads) : ctx(c) {
    svr.new_task_queue = [num_threads] { return new httplib::ThreadPool(static_cast<size_t>(num_threads)); };
    svr.set_payload_max_length(64u << 20);
    svr.set_tcp_nodelay(true);  // a streamed token leaves at once (Nagle + delayed ACK held them ~40 ms)
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { guard(r, [&] { completions(q, r, false); }); });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { guard(r, [&] { completions(q, r, true); }); });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
      guard(r, [&] {
        json m = {{"id", ctx.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "moesq"},
                  {"max_model_len", ctx.limits.max_model_len}, {"vocab_size", ctx.limits.vocab_size}};
        send_json(r, 200, json{{"object", "list"}, {"data", json::array({m})}});
      });
    });
    svr.Get("/health", [](const httplib::Request&, httplib::Response& r) { r.set_content("", "text/plain"); });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      guard(r, [&] { r.set_content(ctx.metrics->prometheus_text(), "text/plain; version=0.0.4"); });
    });
    svr.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
      if (r.status == 404 && r.body.empty()) send_error(r, ApiError(404, "no route " + q.method + " " + q.path, "", "not_found_error"));
    });
  }

  template <typename F>
  void guard(httplib::Response& res, F&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("the server failed on this request: ") + e.what(), "", "server_error"));
    } catch (...) {
      send_error(res, ApiError(500, "the server failed on this request", "", "server_error"));
    }
  }

  std::vector<int32_t> tokenize(const std::string& text, bool add_special, const std::string& param) {
    try {
      return ctx.tokenizer->encode(text, io::EncodeOptions{.add_special_tokens = add_special});
    } catch (const std::exception& e) {
      throw ApiError(400, std::string("cannot tokenize the prompt: ") + e.what(), param);
    }
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat) {
    const json body = parse_body(req.body);
    SamplingRequest common;
    std::vector<int32_t> prompt;
    std::string param = chat ? "messages" : "prompt";
    if (chat) {
      ChatCompletionRequest c = parse_chat_request(body, ctx.limits);
      if (!ctx.tokenizer) throw chat_without_tokenizer(ctx.model_name);
      if (!ctx.chat_template) throw ApiError(400, ctx.no_template_reason, "messages");
      std::string text;
      try {
        text = ctx.chat_template->render(c.chat);
      } catch (const std::exception& e) {
        throw ApiError(400, std::string("the chat template failed on these messages: ") + e.what(), "messages");
      }
      prompt = tokenize(text, false, param);  // the template writes the special tokens itself
      common = std::move(c.common);
    } else {
      CompletionRequest c = parse_completion_request(body, ctx.limits);
      if (!ctx.tokenizer) require_token_ids(c, ctx.model_name);
      prompt = c.prompt_text ? tokenize(*c.prompt_text, true, param) : std::move(c.prompt_ids);
      common = std::move(c.common);
    }
    const int64_t max_tokens = check_prompt(prompt, common, ctx.limits, param);
    GenRequest g;
    g.prompt = prompt;
    g.sampling = common.sampling;
    g.stop.max_new_tokens = max_tokens;
    g.stop.stop_ids = common.stop_token_ids;
    auto gen = std::make_shared<Generation>(Generation{.stream = nullptr,
                                                       .filter = StopStringFilter(ctx.tokenizer, common.stop),
                                                       .prompt_tokens = static_cast<int64_t>(prompt.size()),
                                                       .done = false, .finish_reason = {}});
    try {
      gen->stream = ctx.scheduler->submit(std::move(g));
    } catch (const SchedulerBusy& e) {
      throw ApiError(503, e.what(), "", "server_error", "server_busy");
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
    ResponseMeta meta{(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++),
                      common.model.empty() ? ctx.model_name : common.model, static_cast<int64_t>(std::time(nullptr)), chat};
    if (!common.stream) return whole(res, *gen, meta, common.return_token_ids);
    stream(res, gen, meta, common);
  }

  void whole(httplib::Response& res, Generation& gen, const ResponseMeta& meta, bool with_ids) {
    std::string text;
    std::vector<int32_t> ids;
    try {
      while (!gen.done) text += gen.poll(ids);
    } catch (...) {
      gen.stream->cancel();
      throw;
    }
    const Usage u{gen.prompt_tokens, static_cast<int64_t>(gen.filter.ids().size())};
    send_json(res, 200, full_response(meta, text, gen.finish_reason, u, with_ids ? &gen.filter.ids() : nullptr));
  }

  void stream(httplib::Response& res, std::shared_ptr<Generation> gen, const ResponseMeta& meta, const SamplingRequest& common) {
    const bool with_ids = common.return_token_ids, with_usage = common.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [gen, meta, with_ids, with_usage](size_t, httplib::DataSink& sink) {
          bool first = true;
          try {
            while (!gen->done) {
              if (!sink.is_writable()) return gen->stream->cancel(), false;  // the client went away
              std::vector<int32_t> ids;
              const std::string text = gen->poll(ids);
              if (text.empty() && ids.empty() && !gen->done) continue;
              const json chunk = stream_chunk(meta, text, gen->done ? gen->finish_reason : "", first, with_ids ? &ids : nullptr);
              first = false;
              const std::string ev = sse_event(chunk);
              if (!sink.write(ev.data(), ev.size())) return gen->stream->cancel(), false;
            }
            if (with_usage) {
              const std::string ev =
                  sse_event(usage_chunk(meta, Usage{gen->prompt_tokens, static_cast<int64_t>(gen->filter.ids().size())}));
              if (!sink.write(ev.data(), ev.size())) return false;
            }
          } catch (const ApiError& e) {
            const std::string ev = sse_event(error_body(e));
            sink.write(ev.data(), ev.size());
          } catch (const std::exception& e) {
            const std::string ev = sse_event(error_body(ApiError(500, e.what(), "", "server_error")));
            sink.write(ev.data(), ev.size());
          }
          sink.write(kSseDone, std::char_traits<char>::length(kSseDone));
          sink.done();
          return true;
        },
        [gen](bool success) {
          if (!success) gen->stream->cancel();
        });
  }
};

namespace {
// Debian's libcpp-httplib is a compiled library listening with a backlog of 5: a burst of clients
// connecting at once (64 in the tests) had connections dropped unanswered. httplib does not expose
// its socket, so the listening socket on `port` is found among this process's descriptors and
// listen() is called again with SOMAXCONN (Linux updates the backlog of a listening socket).
void widen_backlog(int port) {
  for (int fd = 3; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    const int p = addr.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                  : addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                               : -1;
    if (p == port) ::listen(fd, SOMAXCONN);
  }
}
}  // namespace

HttpServer::HttpServer(ServeContext& ctx, int num_threads) : impl_(std::make_unique<Impl>(ctx, num_threads)) {}
HttpServer::~HttpServer() = default;

int HttpServer::bind(const std::string& host, int port) {
  const int got = port == 0 ? impl_->svr.bind_to_any_port(host) : (impl_->svr.bind_to_port(host, port) ? port : -1);
  MOESQ_CHECK(got > 0, "--host ", host, " --port ", port, ": cannot listen there (in use, or not an address of this machine)");
  widen_backlog(got);
  return got;
}

void HttpServer::run() { impl_->svr.listen_after_bind(); }
void HttpServer::stop() { impl_->svr.stop(); }

#else  // !MOESQ_HAVE_HTTPLIB

struct HttpServer::Impl {};
HttpServer::HttpServer(ServeContext&, int) { MOESQ_FAIL("moesq serve: built without cpp-httplib: install libcpp-httplib-dev"); }
HttpServer::~HttpServer() = default;
int HttpServer::bind(const std::string&, int) { return -1; }
void HttpServer::run() {}
void HttpServer::stop() {}

#endif

}  // namespace moesq::serve
