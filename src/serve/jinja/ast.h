// The syntax tree of a parsed template: expressions (Expr) and statements (Node). Plain structs with
// a kind tag; the renderer (render.cpp) switches on the kind. Filters and tests are resolved to their
// functions at parse time, so an unknown name is an error when the template is loaded, as in Jinja2.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "serve/jinja/value.h"

namespace moesq::serve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// A filter (`x|name(args)`) or test (`x is name(args)`): the piped value, then the call's arguments.
using FilterFn = Value (*)(const Value& input, const CallArgs& args);
using TestFn = bool (*)(const Value& input, const CallArgs& args);

struct Expr {
  enum class Kind {
    Literal,    // literal
    Name,       // name
    List,       // [args...]
    Tuple,      // (args...,)
    Dict,       // {args[0]: args[1], ...}
    Attr,       // args[0].name
    Item,       // args[0][args[1]]
    Slice,      // args[0][args[1]:args[2]:args[3]] (null children for omitted bounds)
    Call,       // args[0](args[1..], kwargs)
    Filter,     // args[0]|name(args[1..], kwargs)
    Test,       // args[0] is [not] name(args[1..], kwargs); negated
    Neg,        // -args[0]
    Not,        // not args[0]
    And,        // args[0] and args[1]
    Or,         // args[0] or args[1]
    Binary,     // args[0] name args[1]: + - * / // % ** ~
    Compare,    // args[0] ops[0] args[1] ops[1] args[2] ...: == != < > <= >= in, not in
    Cond,       // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  FilterFn filter = nullptr;
  TestFn test = nullptr;
  bool negated = false;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // branches: (cond, body)...; else_body
    For,       // for targets in expr [if cond]: body [else: else_body]
    Set,       // set target[.attr] = expr
    SetBlock,  // set target %}body{% endset
    Macro,     // macro target(params) body
    Break,
    Continue,
  };
  Kind kind;
  int line;
  std::string text;                    // Text
  ExprPtr expr;                        // Output, Set, For (iterable)
  ExprPtr cond;                        // For filter (may be null)
  std::vector<std::string> targets;    // For loop names; Set / SetBlock / Macro: [name] or [name, attr]
  std::vector<std::pair<ExprPtr, Body>> branches;  // If
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro: name, default (may be null)
};

// A parsed template: its top-level statements; `name` for errors.
struct Template {
  std::string name;
  Body body;
};

}  // namespace moesq::serve::jinja
