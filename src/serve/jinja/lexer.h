// Jinja template → tokens, with the whitespace rules transformers renders chat templates under:
// trim_blocks (the first newline after a block or comment tag is dropped), lstrip_blocks (spaces and
// tabs before a block or comment tag at the start of a line are dropped), `-` / `+` on a tag, newlines
// normalised to "\n" and one trailing newline of the template dropped (keep_trailing_newline=False).
// The rules follow jinja2/lexer.py (3.1) step by step, so the output matches Jinja2 byte for byte.
#pragma once
#include <string>
#include <vector>

namespace moesq::serve::jinja {

struct Token {
  enum class Kind {
    Text,        // template data between tags (value: the text)
    VarBegin,    // {{
    VarEnd,      // }}
    BlockBegin,  // {%
    BlockEnd,    // %}
    Name,        // identifier or keyword
    String,      // string literal (value: decoded)
    Int,         // integer literal (value: digits)
    Float,       // float literal (value: digits)
    Op,          // operator or punctuation (value: "+", "==", "(", ...)
    End,         // end of the template
  };
  Kind kind;
  std::string value;
  int line;  // 1-based line of the template where the token starts
};

// Tokenises `source`. `name` names the template in errors. Throws moesq::Error naming the template
// and line for an unclosed tag or comment, an unterminated string, an unexpected character or an
// unbalanced bracket.
std::vector<Token> tokenize(const std::string& source, const std::string& name);

}  // namespace moesq::serve::jinja
