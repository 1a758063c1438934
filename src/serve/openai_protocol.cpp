// openai_protocol.h: field-by-field validation of the request bodies and the response builders.
#include "serve/openai_protocol.h"

#include <cmath>
#include <limits>
#include <set>

namespace moesq::serve {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a float";
    default: return "an integer";
  }
}

int64_t get_int(const json& v, const std::string& name) {
  if (!v.is_number_integer()) bad(name, "'" + name + "' must be an integer, not " + type_name(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad(name, "'" + name + "' is too large");
  return v.get<int64_t>();
}

double get_number(const json& v, const std::string& name) {
  if (!v.is_number()) bad(name, "'" + name + "' must be a number, not " + type_name(v));
  return v.get<double>();
}

bool get_bool(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, "'" + name + "' must be a boolean, not " + type_name(v));
  return v.get<bool>();
}

// A token id in [0, V), named "<name>[i]".
int32_t get_token(const json& v, const std::string& name, size_t i, int64_t V) {
  const std::string item = name + "[" + std::to_string(i) + "]";
  if (!v.is_number_integer()) bad(name, "'" + item + "' must be an integer token id, not " + type_name(v));
  const bool neg = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
  if (neg || v.get<uint64_t>() >= static_cast<uint64_t>(V))
    bad(name, "'" + item + "' = " + v.dump() + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  return static_cast<int32_t>(v.get<int64_t>());
}

// The fields both endpoints share; `known` collects the names this function consumed.
void parse_common(const json& body, const ProtocolLimits& lim, bool chat, SamplingRequest& r, std::set<std::string>& known) {
  auto has = [&](const char* k) {
    known.insert(k);
    return body.contains(k) && !body.at(k).is_null();
  };
  r.sampling.temperature = 1.0f;
  if (has("model")) {
    if (!body["model"].is_string()) bad("model", std::string("'model' must be a string, not ") + type_name(body["model"]));
    r.model = body["model"].get<std::string>();
  }
  const char* mt = "max_tokens";
  if (chat && has("max_completion_tokens")) mt = "max_completion_tokens";
  if (has(mt)) {
    r.max_tokens = get_int(body[mt], mt);
    r.max_tokens_given = true;
    if (r.max_tokens < 1) bad(mt, "'" + std::string(mt) + "' must be at least 1, got " + std::to_string(r.max_tokens));
  }
  has("max_tokens");
  if (has("temperature")) {
    const double t = get_number(body["temperature"], "temperature");
    if (!(t >= 0.0) || !std::isfinite(t) || t > 2.0) bad("temperature", "'temperature' must be in [0, 2], got " + body["temperature"].dump());
    r.sampling.temperature = static_cast<float>(t);
  }
  if (has("top_p")) {
    const double p = get_number(body["top_p"], "top_p");
    if (!(p > 0.0 && p <= 1.0)) bad("top_p", "'top_p' must be in (0, 1], got " + body["top_p"].dump());
    r.sampling.top_p = static_cast<float>(p);
  }
  if (has("seed")) {
    const int64_t s = get_int(body["seed"], "seed");
    if (s < 0) bad("seed", "'seed' must be >= 0, got " + std::to_string(s));
    r.sampling.seed = static_cast<uint64_t>(s);
  }
  if (has("n")) {
    const int64_t n = get_int(body["n"], "n");
    if (n != 1) bad("n", "'n' must be 1 (one choice per request), got " + std::to_string(n));
  }
  if (has("stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (size_t i = 0; i < s.size(); ++i) {
        if (!s[i].is_string()) bad("stop", "'stop[" + std::to_string(i) + "]' must be a string, not " + type_name(s[i]));
        r.stop.push_back(s[i].get<std::string>());
      }
    } else {
      bad("stop", std::string("'stop' must be a string or a list of strings, not ") + type_name(s));
    }
    for (const std::string& x : r.stop)
      if (x.empty()) bad("stop", "'stop' strings must not be empty");
  }
  if (has("stop_token_ids")) {
    const json& s = body["stop_token_ids"];
    if (!s.is_array()) bad("stop_token_ids", std::string("'stop_token_ids' must be a list of token ids, not ") + type_name(s));
    for (size_t i = 0; i < s.size(); ++i) r.stop_token_ids.push_back(get_token(s[i], "stop_token_ids", i, lim.vocab_size));
  }
  if (has("stream")) r.stream = get_bool(body["stream"], "stream");
  if (has("stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) bad("stream_options", std::string("'stream_options' must be an object, not ") + type_name(so));
    for (const auto& [k, v] : so.items()) {
      if (k != "include_usage") bad("stream_options", "unknown field 'stream_options." + k + "'");
      r.include_usage = get_bool(v, "stream_options.include_usage");
    }
  }
  if (has("return_token_ids")) r.return_token_ids = get_bool(body["return_token_ids"], "return_token_ids");
  // Accepted and without effect here (documented in docs/SERVE.md): as OpenAI's defaults.
  has("user");
}

void refuse_unknown(const json& body, const std::set<std::string>& known) {
  for (const auto& [k, v] : body.items())
    if (!known.count(k)) bad(k, "unknown field '" + k + "'");
}

void require_object(const json& body) {
  if (!body.is_object()) throw ApiError(400, std::string("the request body must be a JSON object, not ") + type_name(body));
}

}  // namespace

json error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}};
}

json parse_body(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
}

CompletionRequest parse_completion_request(const json& body, const ProtocolLimits& lim) {
  require_object(body);
  CompletionRequest r;
  std::set<std::string> known{"prompt"};
  parse_common(body, lim, false, r.common, known);
  refuse_unknown(body, known);
  if (!body.contains("prompt")) bad("prompt", "'prompt' is required");
  const json& p = body["prompt"];
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && !p[0].is_array() && !p[0].is_string()) {
    for (size_t i = 0; i < p.size(); ++i) r.prompt_ids.push_back(get_token(p[i], "prompt", i, lim.vocab_size));
  } else if (p.is_array() && !p.empty()) {
    bad("prompt", "'prompt' must be one string or one list of token ids (batched prompts are not served)");
  } else {
    bad("prompt", std::string("'prompt' must be a string or a non-empty list of token ids, not ") +
                      (p.is_array() ? "an empty list" : type_name(p)));
  }
  return r;
}

ChatCompletionRequest parse_chat_request(const json& body, const ProtocolLimits& lim) {
  require_object(body);
  ChatCompletionRequest r;
  std::set<std::string> known{"messages", "chat_template_kwargs", "add_generation_prompt", "tools"};
  parse_common(body, lim, true, r.common, known);
  refuse_unknown(body, known);
  if (!body.contains("messages")) bad("messages", "'messages' is required");
  const json& m = body["messages"];
  if (!m.is_array() || m.empty()) bad("messages", "'messages' must be a non-empty list of {role, content} objects");
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) bad("messages", "'" + at + "' must be an object, not " + type_name(m[i]));
    if (!m[i].contains("role") || !m[i]["role"].is_string()) bad("messages", "'" + at + ".role' must be a string");
    if (m[i].contains("content") && !m[i]["content"].is_string() && !m[i]["content"].is_null())
      bad("messages", "'" + at + ".content' must be a string (content parts are not served)");
  }
  r.chat.messages = nlohmann::ordered_json::parse(m.dump());
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) bad("tools", "'tools' must be a list");
    r.chat.tools = nlohmann::ordered_json::parse(body["tools"].dump());
  }
  if (body.contains("add_generation_prompt"))
    r.chat.add_generation_prompt = get_bool(body["add_generation_prompt"], "add_generation_prompt");
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    const json& kw = body["chat_template_kwargs"];
    if (!kw.is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.chat.extra = nlohmann::ordered_json::parse(kw.dump());
  }
  return r;
}

void require_token_ids(CompletionRequest& r, const std::string& model) {
  if (r.prompt_text)
    bad("prompt", "'prompt' is text, but this server's model (" + model +
                      ") has no tokenizer: send 'prompt' as a list of token ids");
  if (!r.common.stop.empty())
    bad("stop", "'stop' strings need a tokenizer, which this server's model (" + model + ") lacks: use stop_token_ids");
  r.common.return_token_ids = true;
}

ApiError chat_without_tokenizer(const std::string& model) {
  return ApiError(400,
                  "this server's model (" + model +
                      ") has no tokenizer and no chat template, so /v1/chat/completions is not served: POST "
                      "/v1/completions with 'prompt' as a list of token ids",
                  "messages");
}

int64_t check_prompt(const std::vector<int32_t>& prompt, const SamplingRequest& req, const ProtocolLimits& lim,
                     const std::string& prompt_param) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) bad(prompt_param, "the prompt is empty (0 tokens)");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= lim.vocab_size)
      bad(prompt_param, "prompt token " + std::to_string(prompt[i]) + " (position " + std::to_string(i) +
                            ") is outside the vocabulary [0, " + std::to_string(lim.vocab_size) + ")");
  if (n >= lim.max_model_len)
    bad(prompt_param, "the prompt has " + std::to_string(n) + " tokens; this server's --max-model-len is " +
                          std::to_string(lim.max_model_len) + " (prompt + max_tokens must fit)");
  if (!req.max_tokens_given && prompt_param == "messages") return lim.max_model_len - n;
  if (n + req.max_tokens > lim.max_model_len)
    bad("max_tokens", "the prompt (" + std::to_string(n) + " tokens) + max_tokens " + std::to_string(req.max_tokens) +
                          " = " + std::to_string(n + req.max_tokens) + " exceeds --max-model-len " +
                          std::to_string(lim.max_model_len));
  return req.max_tokens;
}

namespace {
json finish_value(const std::string& r) { return r.empty() ? json(nullptr) : json(r); }
json head(const ResponseMeta& meta, const char* object) {
  return json{{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}
json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}
}  // namespace

json full_response(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                   const Usage& usage, const std::vector<int32_t>* token_ids) {
  json j = head(meta, meta.chat ? "chat.completion" : "text_completion");
  json c = {{"index", 0}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", nullptr}};
  if (meta.chat)
    c["message"] = {{"role", "assistant"}, {"content", text}};
  else
    c["text"] = text;
  if (token_ids) c["token_ids"] = *token_ids;
  j["choices"] = json::array({c});
  j["usage"] = usage_json(usage);
  return j;
}

json stream_chunk(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason, bool first,
                  const std::vector<int32_t>* token_ids) {
  json j = head(meta, meta.chat ? "chat.completion.chunk" : "text_completion");
  json c = {{"index", 0}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", nullptr}};
  if (meta.chat) {
    c["delta"] = json::object();
    if (first) c["delta"]["role"] = "assistant";
    if (!text.empty() || finish_reason.empty()) c["delta"]["content"] = text;
  } else {
    c["text"] = text;
  }
  if (token_ids) c["token_ids"] = *token_ids;
  j["choices"] = json::array({c});
  return j;
}

json usage_chunk(const ResponseMeta& meta, const Usage& usage) {
  json j = head(meta, meta.chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return j;
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace moesq::serve
