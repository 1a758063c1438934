// Malformed templates and misused values give errors naming the problem and the template line;
// plus whitespace-control and scoping rules checked against outputs of the real Jinja2 3.1.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "serve/chat_template.h"
#include "serve/jinja/parser.h"
#include "serve/jinja/render.h"

#include "support/temp_dir.h"

using namespace moesq::serve;

namespace {

std::string render_text(const std::string& src, const jinja::Dict& vars = {}) {
  return jinja::render(jinja::parse(src, "t"), vars);
}

// Throws with a message containing every one of `parts`.
void expect_error(const std::string& src, std::vector<std::string> parts) {
  try {
    render_text(src);
    ADD_FAILURE() << "no error for: " << src;
  } catch (const moesq::Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

TEST(JinjaErrors, MalformedTemplatesNameTheLine) {
  expect_error("a\n{% if x %}\nb", {"line 2", "'if'", "never closed", "endif"});
  expect_error("a\n\n{{ x ", {"line 3", "'{{'", "never closed"});
  expect_error("{# note", {"line 1", "comment"});
  expect_error("x\n{{ x|frobnicate }}", {"line 2", "unknown filter 'frobnicate'"});
  expect_error("{{ x is frob }}", {"line 1", "unknown test 'frob'"});
  expect_error("\n{{ 1 + }}", {"line 2", "expected an expression"});
  expect_error("{{ (1 }}", {"line 1"});
  expect_error("{% endfor %}", {"unexpected 'endfor'"});
  expect_error("{% frob %}", {"unknown tag 'frob'"});
  expect_error("\n\n{% call m() %}{% endcall %}", {"line 3", "'call' tag is not supported"});
  expect_error("{% break %}", {"outside of a 'for' loop"});
  expect_error("{{ 'abc }}", {"string literal is never closed"});
}

TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
  expect_error("\n{{ undefined_thing.attr }}", {"line 2", "'undefined_thing' is undefined"});
  expect_error("{{ 'a' + 1 }}", {"line 1", "unsupported operand type(s) for +: 'str' and 'int'"});
  expect_error("{{ 1 / 0 }}", {"division by zero"});
  expect_error("{% set x = 1 %}{% set x.a = 2 %}", {"not a namespace()"});
  expect_error("{{ 'a'() }}", {"not callable"});
  expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {"takes not more than 1 argument"});
  expect_error("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", {"recursed deeper"});
  try {
    render_text("{{ raise_exception('no way') }}");
    ADD_FAILURE();
  } catch (const jinja::TemplateError& e) {
    EXPECT_EQ(e.message(), "no way");
  }
}

// Expected strings produced by jinja2 3.1.6 with trim_blocks=True, lstrip_blocks=True.
TEST(JinjaSemantics, MatchesJinja2) {
  EXPECT_EQ(render_text("{% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}"), "[]");
  EXPECT_EQ(render_text("{% set x = 5 %}{% for i in [1,2] %}{{ x }}{% set x = i %}{{x}}{% endfor %}{{x}}"), "51525");
  EXPECT_EQ(render_text("{{ 1.0 }} {{ 1e20 }} {{ [1,'a',none,true] }} {{ 'héllo'[::-1] }} {{ 'héllo'|length }}"),
            "1.0 1e+20 [1, 'a', None, True] olléh 5");
  EXPECT_EQ(render_text("{{ 1 if false }}|{{ [1,2]|tojson(indent=2) }}"), "|[\n  1,\n  2\n]");
  EXPECT_EQ(render_text("  {% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render_text("a  {%- if true -%}  b  {%- endif %}\n"), "ab");
  EXPECT_EQ(render_text("{{ 'x' + 1|string }}{{ 7 % 3 }}{{ -7 // 2 }}"), "x11-4");
  EXPECT_EQ(render_text("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "3");
  EXPECT_EQ(render_text("{{ {'a': 'ü', 'b': [1.5, none]}|tojson }}"), "{\"a\": \"ü\", \"b\": [1.5, null]}");
  EXPECT_EQ(render_text("{{ ' a b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ '\\nx\\n'.strip('\\n') }}"),
            "['a', 'b']['a', 'b,c']x");
}

TEST(ChatTemplateLoad, FromTokenizerConfig) {
  moesq::test::TempDir dir;
  {
    std::ofstream f(dir.path / "tokenizer_config.json");
    f << R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
             "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"}]})";
  }
  ChatRequest r;
  r.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(ChatTemplate::from_dir(dir.path).render(r), "<s>hi</s>");
  { std::ofstream f(dir.path / "chat_template.jinja"); f << "J{{ messages|length }}"; }
  EXPECT_EQ(ChatTemplate::from_dir(dir.path).render(r), "J1");
  moesq::test::TempDir empty;
  EXPECT_THROW(ChatTemplate::from_dir(empty.path), moesq::Error);
}

}  // namespace
