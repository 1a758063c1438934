// openai_protocol: every refused field answers 400 with `param` naming it; defaults; response and
// SSE shapes. StopStringFilter: text cut before a stop string, held back across token boundaries.
#include <gtest/gtest.h>

#include "io/tokenizer.h"
#include "serve/openai_protocol.h"
#include "serve/stop_strings.h"

using namespace moesq::serve;
using nlohmann::json;

namespace {

const ProtocolLimits kLim{256, 64};

// The param of the ApiError `f` throws ("<none>" when it throws nothing).
template <typename F>
std::string param_of(F&& f, int* status = nullptr) {
  try {
    f();
  } catch (const ApiError& e) {
    if (status) *status = e.status;
    EXPECT_EQ(error_body(e)["error"]["type"], "invalid_request_error");
    EXPECT_FALSE(std::string(e.what()).empty());
    return e.param;
  }
  return "<none>";
}

std::string completion_param(const std::string& body) {
  return param_of([&] { parse_completion_request(json::parse(body), kLim); });
}
std::string chat_param(const std::string& body) {
  return param_of([&] { parse_chat_request(json::parse(body), kLim); });
}

}  // namespace

TEST(OpenaiProtocol, CompletionDefaultsAndFields) {
  const CompletionRequest r = parse_completion_request(json::parse(R"({"prompt":"hi"})"), kLim);
  EXPECT_EQ(*r.prompt_text, "hi");
  EXPECT_EQ(r.common.max_tokens, 16);
  EXPECT_FLOAT_EQ(r.common.sampling.temperature, 1.0f);
  EXPECT_FALSE(r.common.stream);
  const CompletionRequest s = parse_completion_request(
      json::parse(R"({"prompt":[1,2,255],"max_tokens":5,"temperature":0,"top_p":0.5,"seed":7,"stop":["a","bc"],
                      "stop_token_ids":[3],"stream":true,"model":"m","n":1})"),
      kLim);
  EXPECT_EQ(s.prompt_ids, (std::vector<int32_t>{1, 2, 255}));
  EXPECT_EQ(s.common.max_tokens, 5);
  EXPECT_EQ(s.common.sampling.seed, 7u);
  EXPECT_EQ(s.common.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(s.common.stop_token_ids, (std::vector<int32_t>{3}));
  EXPECT_TRUE(s.common.stream);
  EXPECT_EQ(s.common.model, "m");
}

TEST(OpenaiProtocol, EveryBadCompletionFieldIsNamed) {
  EXPECT_EQ(completion_param(R"({"prompt":"x","bogus":1})"), "bogus");
  EXPECT_EQ(completion_param(R"({})"), "prompt");
  EXPECT_EQ(completion_param(R"({"prompt":5})"), "prompt");
  EXPECT_EQ(completion_param(R"({"prompt":[]})"), "prompt");
  EXPECT_EQ(completion_param(R"({"prompt":[1,256]})"), "prompt");
  EXPECT_EQ(completion_param(R"({"prompt":[1,-1]})"), "prompt");
  EXPECT_EQ(completion_param(R"({"prompt":[1,"a"]})"), "prompt");
  EXPECT_EQ(completion_param(R"({"prompt":["a","b"]})"), "prompt");
  EXPECT_EQ(completion_param(R"({"prompt":"x","max_tokens":0})"), "max_tokens");
  EXPECT_EQ(completion_param(R"({"prompt":"x","max_tokens":"3"})"), "max_tokens");
  EXPECT_EQ(completion_param(R"({"prompt":"x","max_tokens":1.5})"), "max_tokens");
  EXPECT_EQ(completion_param(R"({"prompt":"x","temperature":-1})"), "temperature");
  EXPECT_EQ(completion_param(R"({"prompt":"x","temperature":"hot"})"), "temperature");
  EXPECT_EQ(completion_param(R"({"prompt":"x","top_p":0})"), "top_p");
  EXPECT_EQ(completion_param(R"({"prompt":"x","top_p":1.5})"), "top_p");
  EXPECT_EQ(completion_param(R"({"prompt":"x","seed":-3})"), "seed");
  EXPECT_EQ(completion_param(R"({"prompt":"x","n":2})"), "n");
  EXPECT_EQ(completion_param(R"({"prompt":"x","stop":3})"), "stop");
  EXPECT_EQ(completion_param(R"({"prompt":"x","stop":["a",1]})"), "stop");
  EXPECT_EQ(completion_param(R"({"prompt":"x","stop":""})"), "stop");
  EXPECT_EQ(completion_param(R"({"prompt":"x","stop_token_ids":[999]})"), "stop_token_ids");
  EXPECT_EQ(completion_param(R"({"prompt":"x","stop_token_ids":4})"), "stop_token_ids");
  EXPECT_EQ(completion_param(R"({"prompt":"x","stream":"yes"})"), "stream");
  EXPECT_EQ(completion_param(R"({"prompt":"x","stream_options":{"x":true}})"), "stream_options");
  EXPECT_EQ(completion_param(R"({"prompt":"x","model":3})"), "model");
  int status = 0;
  EXPECT_EQ(param_of([] { parse_body("{not json"); }, &status), "");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(param_of([] { parse_completion_request(json::array(), kLim); }), "");
}

TEST(OpenaiProtocol, EveryBadChatFieldIsNamed) {
  const ChatCompletionRequest r = parse_chat_request(
      json::parse(R"({"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4,
                      "chat_template_kwargs":{"enable_thinking":false}})"),
      kLim);
  EXPECT_EQ(r.common.max_tokens, 4);
  EXPECT_EQ(r.chat.messages[0]["content"], "hi");
  EXPECT_EQ(r.chat.extra["enable_thinking"], false);
  EXPECT_EQ(chat_param(R"({})"), "messages");
  EXPECT_EQ(chat_param(R"({"messages":[]})"), "messages");
  EXPECT_EQ(chat_param(R"({"messages":["hi"]})"), "messages");
  EXPECT_EQ(chat_param(R"({"messages":[{"content":"hi"}]})"), "messages");
  EXPECT_EQ(chat_param(R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})"), "messages");
  EXPECT_EQ(chat_param(R"({"messages":[{"role":"user","content":"x"}],"prompt":"x"})"), "prompt");
  EXPECT_EQ(chat_param(R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})"), "max_completion_tokens");
  EXPECT_EQ(chat_param(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":1})"), "chat_template_kwargs");
}

TEST(OpenaiProtocol, PromptLengthAgainstMaxModelLen) {
  SamplingRequest req;
  req.max_tokens = 10;
  req.max_tokens_given = true;
  EXPECT_EQ(check_prompt(std::vector<int32_t>(54, 1), req, kLim, "prompt"), 10);
  EXPECT_EQ(param_of([&] { check_prompt(std::vector<int32_t>(55, 1), req, kLim, "prompt"); }), "max_tokens");
  EXPECT_EQ(param_of([&] { check_prompt(std::vector<int32_t>(64, 1), req, kLim, "prompt"); }), "prompt");
  EXPECT_EQ(param_of([&] { check_prompt({}, req, kLim, "prompt"); }), "prompt");
  EXPECT_EQ(param_of([&] { check_prompt({1, 300}, req, kLim, "prompt"); }), "prompt");
  SamplingRequest chat;  // no max_tokens: the rest of the context
  EXPECT_EQ(check_prompt(std::vector<int32_t>(60, 1), chat, kLim, "messages"), 4);
}

TEST(OpenaiProtocol, WithoutATokenizerPromptsAreIds) {
  CompletionRequest text = parse_completion_request(json{{"prompt", "hi"}}, kLim);
  try {
    require_token_ids(text, "synthetic:m");
    ADD_FAILURE() << "a text prompt was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "prompt");
    EXPECT_NE(std::string(e.what()).find("synthetic:m) has no tokenizer"), std::string::npos) << e.what();
  }
  CompletionRequest stop = parse_completion_request(json{{"prompt", {1}}, {"stop", {"a"}}}, kLim);
  int status = 0;
  EXPECT_EQ(param_of([&] { require_token_ids(stop, "m"); }, &status), "stop");
  EXPECT_EQ(status, 400);
  CompletionRequest ids = parse_completion_request(json{{"prompt", {1, 2}}, {"stop_token_ids", {3}}}, kLim);
  require_token_ids(ids, "m");
  EXPECT_TRUE(ids.common.return_token_ids);  // the ids are the whole answer
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2}));
  const ApiError chat = chat_without_tokenizer("m");
  EXPECT_EQ(chat.status, 400);
  EXPECT_EQ(chat.param, "messages");
}

TEST(OpenaiProtocol, ResponsesAndSse) {
  const ResponseMeta meta{"cmpl-1", "m", 5, false};
  const std::vector<int32_t> ids{1, 2};
  const json full = full_response(meta, "ab", "length", Usage{3, 2}, &ids);
  EXPECT_EQ(full["object"], "text_completion");
  EXPECT_EQ(full["choices"][0]["text"], "ab");
  EXPECT_EQ(full["choices"][0]["token_ids"], json(ids));
  EXPECT_EQ(full["usage"]["total_tokens"], 5);
  const ResponseMeta chat{"chatcmpl-1", "m", 5, true};
  const json c = stream_chunk(chat, "a", "", true, nullptr);
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  const std::string ev = sse_event(c);
  EXPECT_EQ(ev.rfind("data: {", 0), 0u);
  EXPECT_EQ(ev.substr(ev.size() - 2), "\n\n");
  EXPECT_EQ(json::parse(ev.substr(6)), c);
  EXPECT_EQ(sse_event(json{{"t", std::string("\xff")}}), "data: {\"t\":\"\xef\xbf\xbd\"}\n\n");  // invalid UTF-8 replaced
}

TEST(StopStrings, CutBeforeTheFirstStopAcrossTokens) {
  const moesq::io::Tokenizer tok = moesq::io::load_tokenizer_for_checkpoint(MOESQ_DEFAULT_MODEL);  // bytes
  StopStringFilter f(&tok, {"cd", "xyz"});
  std::string out;
  for (char ch : std::string("abcdef")) {
    out += f.add({static_cast<int32_t>(static_cast<unsigned char>(ch))});
    if (f.stopped()) break;
  }
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(out, "ab");
  EXPECT_EQ(f.ids().size(), 4u);  // a b c d: the ids up to the one completing the stop string
  StopStringFilter g(&tok, {"zz"});
  std::string o2 = g.add({'a', 'z'});
  EXPECT_EQ(o2, "a");  // "z" could start "zz": held back
  o2 += g.add({'b'});
  o2 += g.flush();
  EXPECT_FALSE(g.stopped());
  EXPECT_EQ(o2, "azb");
}
