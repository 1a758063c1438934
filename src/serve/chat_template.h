// A checkpoint's chat template: loaded from tokenizer_config.json `chat_template` (a string, or a
// list of {name, template} from which "default" is taken) or chat_template.jinja, with bos_token /
// eos_token from tokenizer_config.json (a string or an {"content": ...} added-token object), and
// rendered the way transformers' apply_chat_template renders it (serve/jinja/).
#pragma once
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/jinja/ast.h"

namespace moesq::serve {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content, ...}]
  nlohmann::ordered_json tools;                                       // null = no tools (None)
  bool add_generation_prompt = true;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();    // enable_thinking, reasoning_effort, ...
  std::time_t now = 0;  // what strftime_now() formats (local time); 0 = the current time
};

class ChatTemplate {
 public:
  // Parses `source` now (an unknown filter/tag or a syntax error throws moesq::Error naming `name`
  // and the line). bos/eos: std::nullopt = the variable is undefined in the template.
  ChatTemplate(const std::string& source, std::string name, std::optional<std::string> bos_token,
               std::optional<std::string> eos_token);
  // Loads from a checkpoint directory; throws moesq::Error naming the file when there is no template.
  static ChatTemplate from_dir(const std::filesystem::path& dir);

  // The prompt text. Throws jinja::TemplateError when the template calls raise_exception, and
  // moesq::Error (template name and line) for any other failure.
  std::string render(const ChatRequest& request) const;

 private:
  jinja::Template tmpl_;
  std::optional<std::string> bos_, eos_;
};

}  // namespace moesq::serve
