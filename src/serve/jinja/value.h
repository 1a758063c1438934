// The value type of the Jinja renderer: what a template expression evaluates to.
// Why not nlohmann::json directly: templates also need Undefined (with the reason it is undefined,
// for the error when it is misused), namespace() objects that `set ns.attr` mutates in place, and
// callables (macros, string methods, globals). Lists, dicts and namespaces share their storage on
// copy, as Python objects do; dicts keep insertion order (JSON objects keep theirs).
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace moesq::serve::jinja {

// A run-time error inside an expression (wrong type, bad call). The renderer catches it and
// rethrows it as moesq::Error with the template's name and the expression's line.
struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, string keys

// Arguments of a call: positional, then keyword (name, value) in call order.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};
using Function = std::function<Value(const CallArgs&)>;
// Argument `i` by position, else by keyword `kw`; Undefined when neither was given.
const Value& arg_at(const CallArgs& a, size_t i, const char* kw);

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

  Value() = default;  // Undefined
  static Value undefined(std::string why);  // why: "'x' is undefined", "'dict object' has no attribute 'k'"
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(List items);
  static Value dict(Dict items);
  static Value namespace_(Dict items);
  static Value callable(std::string name, Function fn);
  // JSON → Value (objects keep key order; integers that do not fit int64 become floats).
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const;  // Int, Float or Bool as a double
  const std::string& str() const { return s_; }  // String; also the reason of an Undefined, the name of a Callable
  const List& items() const { return *list_; }
  const Dict& entries() const { return *dict_; }  // Dict or Namespace
  Dict& mutable_entries() const { return *dict_; }  // Namespace attribute assignment
  const Function& function() const { return *fn_; }

  // Dict / Namespace lookup; nullptr when the key is absent.
  const Value* find(const std::string& key) const;
  // Python truthiness (Undefined and None are false; empty string, list and dict are false).
  bool truthy() const;
  // Python's type name, for messages: "str", "int", "list", "dict", "undefined", ...
  std::string type_name() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// Python str(): strings as they are, None → "None", True → "True", floats as repr, lists and dicts
// as Python's repr (['a', 1], {'k': None}); Undefined → "" (Jinja prints undefined as nothing).
std::string to_output(const Value& v);
// Python repr() (strings quoted the way Python quotes them).
std::string to_repr(const Value& v);
// Python's repr of a float: shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf", "nan".
std::string float_repr(double d);
// Python json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) byte for byte, the
// `tojson` that transformers installs; indent < 0 means None. Throws EvalError for values JSON
// cannot hold (Undefined, namespaces, callables), naming the type.
std::string to_json_text(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                         bool sort_keys);
// Python == between template values (1 == 1.0 == True, lists and dicts element-wise).
bool equals(const Value& a, const Value& b);

// UTF-8 helpers: Python indexes strings by code point.
std::vector<char32_t> utf8_decode(const std::string& s);
std::string utf8_encode(const std::vector<char32_t>& cps);

}  // namespace moesq::serve::jinja
