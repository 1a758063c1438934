// Every case of tests/fixtures/chat_templates/*.cases.json (renderings by the real Jinja2, set up as
// transformers sets it up) rendered by serve::ChatTemplate and compared byte for byte; the cases
// where the template calls raise_exception must raise it with the same message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "serve/chat_template.h"
#include "serve/jinja/render.h"

namespace fs = std::filesystem;
using moesq::serve::ChatRequest;
using moesq::serve::ChatTemplate;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The fixture's clock: 2025-01-15 12:00:00 local time.
std::time_t fixed_now() {
  std::tm tm{};
  tm.tm_year = 125;
  tm.tm_mon = 0;
  tm.tm_mday = 15;
  tm.tm_hour = 12;
  tm.tm_isdst = -1;
  return std::mktime(&tm);
}

TEST(ChatTemplateFixtures, EveryCaseMatchesJinja2) {
  const fs::path dir = fs::path(MOESQ_FIXTURES) / "chat_templates";
  int templates = 0, cases = 0, errors = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    ++templates;
    const std::string stem = entry.path().stem().string();
    const auto list = nlohmann::ordered_json::parse(slurp(dir / (stem + ".cases.json")));
    const std::string source = slurp(entry.path());
    for (const auto& c : list) {
      SCOPED_TRACE(stem + " / " + c["name"].get<std::string>());
      auto tok = [&](const char* k) -> std::optional<std::string> {
        return c[k].is_null() ? std::nullopt : std::optional<std::string>(c[k].get<std::string>());
      };
      const ChatTemplate t(source, stem, tok("bos_token"), tok("eos_token"));
      ChatRequest r;
      r.messages = c["messages"];
      r.tools = c.contains("tools") ? c["tools"] : nlohmann::ordered_json();
      r.add_generation_prompt = c["add_generation_prompt"].get<bool>();
      r.extra = c["extra"];
      r.now = fixed_now();
      ++cases;
      if (c.contains("error")) {
        ++errors;
        try {
          t.render(r);
          ADD_FAILURE() << "expected " << c["error"].get<std::string>();
        } catch (const moesq::serve::jinja::TemplateError& e) {
          EXPECT_EQ("TemplateError: " + e.message(), c["error"].get<std::string>());
        }
      } else {
        EXPECT_EQ(t.render(r), c["rendered"].get<std::string>());
      }
    }
  }
  EXPECT_EQ(templates, 5);
  EXPECT_EQ(cases, 51);
  EXPECT_EQ(errors, 3);
}

}  // namespace
