// The HTTP front end of `moesq serve` (cpp-httplib): POST /v1/completions, POST /v1/chat/completions
// (whole responses or server-sent events), GET /v1/models, /health, /metrics. Each request is parsed
// by openai_protocol, tokenized here, run by the Scheduler and detokenized with stop strings
// (stop_strings.h). Errors are OpenAI error bodies; no exception leaves a handler (500, and the
// server keeps serving). A streaming client that goes away cancels its request.
// Built only with cpp-httplib (MOESQ_HAVE_HTTPLIB); without it the constructor throws saying what to
// install.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "io/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/metrics.h"
#include "serve/openai_protocol.h"
#include "serve/scheduler.h"

namespace moesq::serve {

struct ServeContext {
  Scheduler* scheduler = nullptr;
  Metrics* metrics = nullptr;
  // null: a model without a tokenizer (synthetic): completions take token-id prompts only and
  // answer the ids with an empty text, chat requests get 400 (openai_protocol.h require_token_ids).
  const io::Tokenizer* tokenizer = nullptr;
  std::optional<ChatTemplate> chat_template;  // none: chat requests get 400 with no_template_reason
  std::string no_template_reason;
  ProtocolLimits limits;
  std::string model_name;                      // GET /v1/models, echoed when a request names none
};

class HttpServer {
 public:
  // `ctx` must outlive the server; num_threads = connections served at once.
  HttpServer(ServeContext& ctx, int num_threads);
  ~HttpServer();
  // Binds host:port (port 0 = a free one); returns the port. Error naming HOST:PORT.
  int bind(const std::string& host, int port);
  // Serves until stop(); in-flight requests finish before it returns.
  void run();
  // Stops accepting (thread-safe, also before run()).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesq::serve
