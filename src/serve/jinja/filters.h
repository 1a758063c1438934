// The filters (`x|name`) and tests (`x is name`) a template may use, looked up by name when the
// template is parsed. Filters are Jinja2's built-ins that chat templates use plus transformers'
// `tojson` (json.dumps with ensure_ascii=False, indent, separators, sort_keys).
#pragma once
#include <string>

#include "serve/jinja/ast.h"

namespace moesq::serve::jinja {

// nullptr when there is no such filter / test.
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// "abs, capitalize, ..." for error messages.
std::string filter_names();
std::string test_names();

}  // namespace moesq::serve::jinja
