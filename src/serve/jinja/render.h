// Renders a parsed template with a set of variables, with Jinja2's semantics as transformers
// configures them (no autoescape; Undefined prints as "" and is an error when used as a value).
// Scoping as in Jinja2: each `for` iteration and each macro call has its own scope (a `set` there
// does not leak out; `namespace()` objects are how templates carry state out of a loop), `if` has none.
// Globals: namespace(), range(), dict(), raise_exception(msg); callers add their own (strftime_now).
#pragma once
#include <string>

#include "core/error.h"
#include "serve/jinja/ast.h"
#include "serve/jinja/value.h"

namespace moesq::serve::jinja {

// The template called raise_exception(message): the template author's refusal of the input
// (e.g. "conversation roles must alternate"). what() names the template; message() is the text.
class TemplateError : public moesq::Error {
 public:
  TemplateError(const std::string& template_name, std::string message)
      : moesq::Error("chat template " + template_name + " refused the input: " + message),
        message_(std::move(message)) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// Renders `t` with `variables` (name → value; names not given are undefined). Throws TemplateError
// from raise_exception, and moesq::Error naming the template and line for any other failure (an
// undefined value used, a type error, a call of something that is not callable, ...).
std::string render(const Template& t, const Dict& variables);

}  // namespace moesq::serve::jinja
