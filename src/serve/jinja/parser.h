// Tokens → syntax tree, following Jinja2's grammar and operator precedence (jinja2/parser.py):
// `a if c else b` < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary - <
// postfix (.x, [i], [a:b:c], calls) < filters and tests, so `x + y|f` is `x + (y|f)`.
// Statements: if/elif/else, for (tuple targets, `if` filter, else, break/continue), set (name,
// ns.attr, block set), macro, comments. Any other tag is an error naming it and its line.
#pragma once
#include <string>

#include "serve/jinja/ast.h"

namespace moesq::serve::jinja {

// Parses a whole template. `name` names it in errors ("chat template NAME line L: ..."). Throws
// moesq::Error for a syntax error, an unclosed block, an unknown filter/test/tag, or a feature this
// renderer does not implement (the error names the feature).
Template parse(const std::string& source, const std::string& name);

}  // namespace moesq::serve::jinja
