// Chat-template loading and the variables transformers passes: messages, tools, documents=None,
// add_generation_prompt, the special tokens it has, the caller's extras, and strftime_now().
#include "serve/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "serve/jinja/parser.h"
#include "serve/jinja/render.h"

namespace moesq::serve {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  MOESQ_CHECK(f, "cannot read ", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::optional<std::string> special_token(const nlohmann::ordered_json& cfg, const char* key, const std::string& file) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  MOESQ_FAIL(file, ": '", key, "' must be a string or an object with a string 'content'");
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string name, std::optional<std::string> bos_token,
                           std::optional<std::string> eos_token)
    : tmpl_(jinja::parse(source, name)), bos_(std::move(bos_token)), eos_(std::move(eos_token)) {}

ChatTemplate ChatTemplate::from_dir(const std::filesystem::path& dir) {
  const auto cfg_path = dir / "tokenizer_config.json";
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  if (std::filesystem::exists(cfg_path)) {
    try {
      cfg = nlohmann::ordered_json::parse(read_file(cfg_path));
    } catch (const nlohmann::json::exception& e) {
      MOESQ_FAIL(cfg_path.string(), ": not valid JSON (", e.what(), ")");
    }
    MOESQ_CHECK(cfg.is_object(), cfg_path.string(), ": must be a JSON object");
  }
  const auto bos = special_token(cfg, "bos_token", cfg_path.string());
  const auto eos = special_token(cfg, "eos_token", cfg_path.string());
  const auto jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path))
    return ChatTemplate(read_file(jinja_path), jinja_path.string(), bos, eos);
  if (cfg.contains("chat_template")) {
    const auto& ct = cfg["chat_template"];
    if (ct.is_string()) return ChatTemplate(ct.get<std::string>(), cfg_path.string(), bos, eos);
    if (ct.is_array()) {
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          return ChatTemplate(e["template"].get<std::string>(), cfg_path.string() + " (default)", bos, eos);
      MOESQ_FAIL(cfg_path.string(), ": 'chat_template' is a list without a {\"name\": \"default\", \"template\": ...} entry");
    }
    MOESQ_FAIL(cfg_path.string(), ": 'chat_template' must be a string or a list of {name, template}");
  }
  MOESQ_FAIL("no chat template in ", dir.string(), " (neither chat_template.jinja nor 'chat_template' in tokenizer_config.json)");
}

std::string ChatTemplate::render(const ChatRequest& r) const {
  using jinja::Value;
  MOESQ_CHECK(r.messages.is_array(), "chat request: 'messages' must be a list");
  MOESQ_CHECK(r.extra.is_object() || r.extra.is_null(), "chat request: extra template variables must be an object");
  jinja::Dict vars = {{"messages", Value::from_json(r.messages)},
                      {"tools", Value::from_json(r.tools)},
                      {"documents", Value::none()},
                      {"add_generation_prompt", Value(r.add_generation_prompt)}};
  if (bos_) vars.emplace_back("bos_token", Value(*bos_));
  if (eos_) vars.emplace_back("eos_token", Value(*eos_));
  const std::time_t now = r.now ? r.now : std::time(nullptr);
  vars.emplace_back("strftime_now", Value::callable("strftime_now", [now](const jinja::CallArgs& a) {
                      if (a.args.empty() || !a.args[0].is_string()) throw jinja::EvalError("strftime_now(format) needs a format string");
                      std::tm tm{};
                      localtime_r(&now, &tm);
                      char buf[256];
                      const size_t n = std::strftime(buf, sizeof buf, a.args[0].str().c_str(), &tm);
                      return Value(std::string(buf, n));
                    }));
  if (r.extra.is_object())
    for (auto it = r.extra.begin(); it != r.extra.end(); ++it) vars.emplace_back(it.key(), Value::from_json(it.value()));
  return jinja::render(tmpl_, vars);
}

}  // namespace moesq::serve
