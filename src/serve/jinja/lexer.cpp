// Tokeniser: one pass over the source with Jinja2's two states (data, and the inside of a tag).
// The non-obvious rule (jinja2 lexer `line_starting`): lstrip_blocks strips the spaces before a tag
// on a line only when they follow a newline in the same text or the previous tag ended with one.
#include "serve/jinja/lexer.h"

#include <cctype>

#include "core/error.h"
#include "serve/jinja/value.h"

namespace moesq::serve::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int count_newlines(const std::string& s, size_t from, size_t to) {
  int n = 0;
  for (size_t i = from; i < to && i < s.size(); ++i) n += s[i] == '\n';
  return n;
}

std::string normalize_newlines(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      out += '\n';
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      out += in[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name) : src_(normalize_newlines(source)), name_(name) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t tag = next_tag(pos_);
      if (tag == std::string::npos) {
        emit(Token::Kind::Text, src_.substr(pos_), line_);
        line_ += count_newlines(src_, pos_, src_.size());
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      std::string text = src_.substr(pos_, tag - pos_);
      if (sign == '-') {
        size_t n = text.size();
        while (n > 0 && is_space(text[n - 1])) --n;
        text.resize(n);
      } else if (sign != '+' && type != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
          bool all_space = true;
          for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && is_space(text[i]);
          if (all_space) text.resize(l_pos);
        }
      }
      if (!text.empty()) emit(Token::Kind::Text, text, line_);
      line_ += count_newlines(src_, pos_, tag);
      pos_ = tag + 2 + (sign ? 1 : 0);
      if (type == '#') comment();
      else inside_tag(type == '%');
    }
    emit(Token::Kind::End, "", line_);
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    MOESQ_FAIL("chat template ", name_, " line ", line, ": ", what);
  }
  void emit(Token::Kind k, std::string v, int line) { out_.push_back({k, std::move(v), line}); }

  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  // After a block/comment end: "-" eats all following whitespace, trim_blocks eats one newline.
  void after_end(size_t end, char sign, bool block_like) {
    size_t p = end;
    if (sign == '-') {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (sign != '+' && block_like && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    line_starting_ = p > 0 && src_[p - 1] == '\n';
    line_ += count_newlines(src_, pos_, p);
    pos_ = p;
  }

  void comment() {
    const int start_line = line_;
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail(start_line, "comment '{#' opened here is never closed with '#}'");
    const char sign = close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
    after_end(close + 2, sign, true);
  }

  void inside_tag(bool block) {
    const int start_line = line_;
    emit(block ? Token::Kind::BlockBegin : Token::Kind::VarBegin, "", line_);
    std::vector<char> brackets;
    const char close = block ? '%' : '}';
    while (true) {
      if (pos_ >= src_.size())
        fail(start_line, std::string(block ? "'{%'" : "'{{'") + " opened here is never closed with '" +
                             (block ? "%}" : "}}") + "'");
      if (brackets.empty()) {
        size_t p = pos_;
        char sign = 0;
        if ((src_[p] == '-' || (block && src_[p] == '+')) && p + 2 < src_.size() + 0 && src_[p + 1] == close &&
            src_[p + 2] == '}') {
          sign = src_[p];
          ++p;
        }
        if (p + 1 < src_.size() && src_[p] == close && src_[p + 1] == '}') {
          emit(block ? Token::Kind::BlockEnd : Token::Kind::VarEnd, "", line_);
          after_end(p + 2, sign, block);
          return;
        }
      }
      const char c = src_[pos_];
      if (is_space(c)) {
        line_ += c == '\n';
        ++pos_;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        emit(Token::Kind::Name, src_.substr(pos_, e - pos_), line_);
        pos_ = e;
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        op(brackets);
      }
    }
  }

  void number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      ++e;
      digits();
      is_float = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
        e = f;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos_; i < e; ++i)
      if (src_[i] != '_') text += src_[i];
    emit(is_float ? Token::Kind::Float : Token::Kind::Int, text, line_);
    pos_ = e;
  }

  // A quoted literal with Python's escapes (\n \t \r \\ \' \" \xHH \uXXXX \UXXXXXXXX, octal);
  // an unknown escape keeps its backslash, as Python's unicode-escape does.
  void string_literal(char quote) {
    const int start_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) fail(start_line, "string literal is never closed");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail(start_line, "string literal is never closed");
      const char e = src_[p + 1];
      p += 2;
      auto hex = [&](int n) {
        if (p + n > src_.size()) fail(line_, "truncated \\x/\\u escape in a string literal");
        const char32_t cp = static_cast<char32_t>(std::stoul(src_.substr(p, n), nullptr, 16));
        p += n;
        out += utf8_encode({cp});
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // line continuation
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0';
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) v = v * 8 + (src_[p++] - '0');
            out += utf8_encode({static_cast<char32_t>(v)});
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    emit(Token::Kind::String, out, start_line);
    line_ += count_newlines(src_, pos_, p);
    pos_ = p + 1;
  }

  void op(std::vector<char>& brackets) {
    static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                       "(",  ")",  "{",  "}",  ">",  "<",  "=", ".", ":", "|", ",", ";"};
    for (const char* o : kOps) {
      const std::string s(o);
      if (src_.compare(pos_, s.size(), s) != 0) continue;
      if (s == "(" || s == "[" || s == "{") {
        brackets.push_back(s == "(" ? ')' : s == "[" ? ']' : '}');
      } else if (s == ")" || s == "]" || s == "}") {
        if (brackets.empty()) fail(line_, "unexpected '" + s + "'");
        if (brackets.back() != s[0]) fail(line_, "unexpected '" + s + "', expected '" + brackets.back() + "'");
        brackets.pop_back();
      }
      emit(Token::Kind::Op, s, line_);
      pos_ += s.size();
      return;
    }
    fail(line_, std::string("unexpected character '") + src_[pos_] + "' inside a tag");
  }

  std::string src_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace moesq::serve::jinja
