// The OpenAI wire format of `moesq serve`, without any HTTP: parsing and validating the bodies of
// POST /v1/completions and /v1/chat/completions into typed requests, and building the response
// objects (whole, or server-sent-event chunks ending in `data: [DONE]`). A bad request is an
// ApiError carrying the HTTP status and the OpenAI error body's fields; `param` names the field.
// The one non-obvious decision: unknown fields are refused (400 naming the field) rather than
// ignored, so that a client never believes a sampling option took effect when it did not.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"
#include "serve/chat_template.h"

namespace moesq::serve {

// An error answered to the client: status 400 (invalid_request_error), 404, 503, 500 ...
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error",
           std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)),
        code(std::move(code)) {}
  int status;
  std::string param, type, code;
};

// {"error": {"message", "type", "param", "code"}} (param / code null when empty).
nlohmann::json error_body(const ApiError& e);

// What a request is checked against: the vocabulary [0, V) and the context length (prompt +
// max_tokens <= max_model_len, as vLLM checks it).
struct ProtocolLimits {
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
};

// The fields both endpoints share.
struct SamplingRequest {
  int64_t max_tokens = 16;               // >= 1 (OpenAI's default for completions)
  bool max_tokens_given = false;         // chat: absent = up to max_model_len
  runtime::SamplerOptions sampling;      // temperature (default 1 as OpenAI), top_p, seed
  std::vector<std::string> stop;         // stop strings: the text ends before the first one found
  std::vector<int32_t> stop_token_ids;   // a sampled id in this list ends the sequence
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage: a last chunk with usage
  bool return_token_ids = false;         // extension (as vLLM): the generated ids beside the text
  std::string model;                     // echoed back
};

struct CompletionRequest {
  SamplingRequest common;
  std::optional<std::string> prompt_text;  // `prompt` as a string ...
  std::vector<int32_t> prompt_ids;         // ... or as token ids in [0, V)
};

struct ChatCompletionRequest {
  SamplingRequest common;
  ChatRequest chat;  // messages, chat_template_kwargs (extra), add_generation_prompt
};

// Parse + validate (everything but the prompt's length, which needs the tokenizer: check_prompt).
// Throws ApiError 400 naming the field.
CompletionRequest parse_completion_request(const nlohmann::json& body, const ProtocolLimits& lim);
ChatCompletionRequest parse_chat_request(const nlohmann::json& body, const ProtocolLimits& lim);
// A body that is not JSON: ApiError 400.
nlohmann::json parse_body(const std::string& text);

// A server whose model has no tokenizer (`moesq serve --synthetic`, named `model` in the messages):
// a completion must give `prompt` as token ids and no stop strings; its responses carry the
// generated ids (return_token_ids is set) beside an empty text. Throws ApiError 400 naming "prompt"
// (a text prompt) or "stop". chat_without_tokenizer: the answer to every chat request there (400,
// param "messages": it needs a tokenizer and a chat template).
void require_token_ids(CompletionRequest& r, const std::string& model);
ApiError chat_without_tokenizer(const std::string& model);

// The tokenized prompt against the limits: non-empty, ids in [0, V), prompt + max_tokens <=
// max_model_len (a chat request without max_tokens gets the rest of the context). Returns the
// max_tokens to run. Throws ApiError 400 (param "prompt" / "messages" / "max_tokens").
int64_t check_prompt(const std::vector<int32_t>& prompt, const SamplingRequest& req, const ProtocolLimits& lim,
                     const std::string& prompt_param);

// Response objects. `kind` is "completion" (text_completion, choices[].text) or "chat"
// (chat.completion, choices[].message / delta). finish_reason: "stop", "length", or empty = null.
struct ResponseMeta {
  std::string id, model;
  int64_t created = 0;
  bool chat = false;
};
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
nlohmann::json full_response(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                             const Usage& usage, const std::vector<int32_t>* token_ids);
// One streamed chunk; `first` adds the assistant role to a chat delta.
nlohmann::json stream_chunk(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                            bool first, const std::vector<int32_t>* token_ids);
// The last chunk of stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(const ResponseMeta& meta, const Usage& usage);
// "data: <json>\n\n" (invalid UTF-8 in text replaced by U+FFFD) and "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
// json.dump with invalid UTF-8 replaced (model output may cut a character in two).
std::string dump_json(const nlohmann::json& j);

}  // namespace moesq::serve
