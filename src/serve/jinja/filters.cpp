// Built-in filters and tests. Each is a plain function of (input, call arguments); arguments are
// read by position or keyword with the names Jinja2 gives them.
#include "serve/jinja/filters.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "serve/jinja/methods.h"

namespace moesq::serve::jinja {
namespace {

const Value& arg(const CallArgs& a, size_t i, const char* kw) { return arg_at(a, i, kw); }

Value f_tojson(const Value& v, const CallArgs& a) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  if (arg(a, 0, "ensure_ascii").truthy()) throw EvalError("tojson(ensure_ascii=true) is not supported");
  const Value& ind = arg(a, 1, "indent");
  int indent = -1;
  if (ind.kind() == Value::Kind::Int) indent = static_cast<int>(std::max<int64_t>(0, ind.as_int()));
  else if (!ind.is_undefined() && !ind.is_none()) throw EvalError("tojson: indent must be an integer");
  std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
  const Value& sep = arg(a, 2, "separators");
  if (sep.is_list()) {
    if (sep.items().size() != 2 || !sep.items()[0].is_string() || !sep.items()[1].is_string())
      throw EvalError("tojson: separators must be two strings");
    item_sep = sep.items()[0].str();
    key_sep = sep.items()[1].str();
  }
  return Value(to_json_text(v, indent, item_sep, key_sep, arg(a, 3, "sort_keys").truthy()));
}

Value f_length(const Value& v, const CallArgs&) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return Value(int64_t{0});
    case Value::Kind::String: return Value(static_cast<int64_t>(utf8_decode(v.str()).size()));
    case Value::Kind::List: return Value(static_cast<int64_t>(v.items().size()));
    case Value::Kind::Dict: return Value(static_cast<int64_t>(v.entries().size()));
    default: throw EvalError("object of type '" + v.type_name() + "' has no len()");
  }
}

Value f_join(const Value& v, const CallArgs& a) {
  const Value& sep = arg(a, 0, "d");
  const Value& attr = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    const Value x = attr.is_string() ? get_attribute(item, attr.str()) : item;
    out += (first ? "" : to_output(sep)) + to_output(x);
    first = false;
  }
  return Value(out);
}

Value f_string(const Value& v, const CallArgs&) { return Value(to_output(v)); }
Value f_safe(const Value& v, const CallArgs&) { return v; }
Value f_trim(const Value& v, const CallArgs& a) { return Value(py_strip(to_output(v), arg(a, 0, "chars"), true, true)); }

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(upper ? ::toupper(c) : ::tolower(c));
  return s;
}
Value f_upper(const Value& v, const CallArgs&) { return Value(ascii_case(to_output(v), true)); }
Value f_lower(const Value& v, const CallArgs&) { return Value(ascii_case(to_output(v), false)); }
Value f_capitalize(const Value& v, const CallArgs&) {
  std::string s = ascii_case(to_output(v), false);
  if (!s.empty() && static_cast<unsigned char>(s[0]) < 0x80) s[0] = static_cast<char>(::toupper(s[0]));
  return Value(s);
}
Value f_title(const Value& v, const CallArgs&) {
  std::string s = to_output(v);
  bool start = true;
  for (char& c : s) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    if (alpha) c = static_cast<char>(start ? ::toupper(c) : ::tolower(c));
    start = !alpha && !std::isdigit(static_cast<unsigned char>(c)) && c != '\'';
  }
  return Value(s);
}

Value f_default(const Value& v, const CallArgs& a) {
  const bool boolean = arg(a, 1, "boolean").truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) {
    const Value& d = arg(a, 0, "default_value");
    return d.is_undefined() ? Value(std::string()) : d;
  }
  return v;
}

Value f_first(const Value& v, const CallArgs&) {
  const List items = iterate(v);
  return items.empty() ? Value::undefined("first: the sequence is empty") : items.front();
}
Value f_last(const Value& v, const CallArgs&) {
  const List items = iterate(v);
  return items.empty() ? Value::undefined("last: the sequence is empty") : items.back();
}
Value f_list(const Value& v, const CallArgs&) { return Value::list(iterate(v)); }
Value f_reverse(const Value& v, const CallArgs&) {
  if (v.is_string()) return get_slice(v, Value(), Value(), Value(int64_t{-1}));
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}
Value f_items(const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw EvalError("items: expected a mapping, got " + v.type_name());
  List out;
  for (const auto& [k, e] : v.entries()) out.push_back(Value::list({Value(k), e}));
  return Value::list(std::move(out));
}

Value f_replace(const Value& v, const CallArgs& a) {
  CallArgs method_args;
  method_args.args = {Value(to_output(arg(a, 0, "old"))), Value(to_output(arg(a, 1, "new")))};
  if (arg(a, 2, "count").kind() == Value::Kind::Int) method_args.args.push_back(arg(a, 2, "count"));
  return get_attribute(Value(to_output(v)), "replace").function()(method_args);
}

Value f_int(const Value& v, const CallArgs& a) {
  if (v.kind() == Value::Kind::Int || v.kind() == Value::Kind::Bool) return Value(v.as_int());
  if (v.kind() == Value::Kind::Float) return Value(static_cast<int64_t>(v.as_double()));
  if (v.is_string()) {
    try {
      size_t used = 0;
      const int64_t i = std::stoll(v.str(), &used);
      if (used == v.str().size()) return Value(i);
    } catch (const std::exception&) {
    }
  }
  const Value& d = arg(a, 0, "default");
  return d.is_undefined() ? Value(int64_t{0}) : d;
}
Value f_float(const Value& v, const CallArgs& a) {
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    try {
      size_t used = 0;
      const double d = std::stod(v.str(), &used);
      if (used == v.str().size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  const Value& d = arg(a, 0, "default");
  return d.is_undefined() ? Value(0.0) : d;
}
Value f_abs(const Value& v, const CallArgs&) {
  if (v.kind() == Value::Kind::Float) return Value(std::fabs(v.as_double()));
  if (v.is_number()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  throw EvalError("bad operand type for abs(): '" + v.type_name() + "'");
}

// selectattr/rejectattr(attribute, [test, args...]) and select/reject([test, args...]).
Value select_impl(const Value& v, const CallArgs& a, bool by_attr, bool keep) {
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    const Value& at = arg(a, i++, "attribute");
    if (!at.is_string()) throw EvalError("selectattr/rejectattr need an attribute name");
    attr = at.str();
  }
  TestFn test = nullptr;
  CallArgs test_args;
  if (i < a.args.size()) {
    if (!a.args[i].is_string()) throw EvalError("select: the test name must be a string");
    test = find_test(a.args[i].str());
    if (!test) throw EvalError("select: unknown test '" + a.args[i].str() + "'");
    test_args.args.assign(a.args.begin() + i + 1, a.args.end());
  }
  List out;
  for (const Value& item : iterate(v)) {
    const Value x = by_attr ? get_attribute(item, attr) : item;
    const bool pass = test ? test(x, test_args) : x.truthy();
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value f_selectattr(const Value& v, const CallArgs& a) { return select_impl(v, a, true, true); }
Value f_rejectattr(const Value& v, const CallArgs& a) { return select_impl(v, a, true, false); }
Value f_select(const Value& v, const CallArgs& a) { return select_impl(v, a, false, true); }
Value f_reject(const Value& v, const CallArgs& a) { return select_impl(v, a, false, false); }

Value f_map(const Value& v, const CallArgs& a) {
  List out;
  const Value& attr = arg(a, 99, "attribute");
  if (attr.is_string()) {
    const Value& def = arg(a, 99, "default");
    for (const Value& item : iterate(v)) {
      Value x = get_attribute(item, attr.str());
      out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
    }
    return Value::list(std::move(out));
  }
  if (a.args.empty() || !a.args[0].is_string()) throw EvalError("map needs a filter name or attribute=");
  const FilterFn f = find_filter(a.args[0].str());
  if (!f) throw EvalError("map: unknown filter '" + a.args[0].str() + "'");
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  for (const Value& item : iterate(v)) out.push_back(f(item, rest));
  return Value::list(std::move(out));
}

Value f_unique(const Value& v, const CallArgs&) {
  List out;
  for (const Value& item : iterate(v))
    if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equals(o, item); })) out.push_back(item);
  return Value::list(std::move(out));
}

// ---- tests ----
bool t_defined(const Value& v, const CallArgs&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, const CallArgs&) { return v.is_undefined(); }
bool t_none(const Value& v, const CallArgs&) { return v.is_none(); }
bool t_string(const Value& v, const CallArgs&) { return v.is_string(); }
bool t_mapping(const Value& v, const CallArgs&) { return v.is_dict(); }
bool t_iterable(const Value& v, const CallArgs&) {
  return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string();
}
bool t_sequence(const Value& v, const CallArgs&) { return v.is_list() || v.is_dict() || v.is_string(); }
bool t_number(const Value& v, const CallArgs&) { return v.is_number(); }
bool t_integer(const Value& v, const CallArgs&) { return v.kind() == Value::Kind::Int; }
bool t_float(const Value& v, const CallArgs&) { return v.kind() == Value::Kind::Float; }
bool t_boolean(const Value& v, const CallArgs&) { return v.kind() == Value::Kind::Bool; }
bool t_true(const Value& v, const CallArgs&) { return v.kind() == Value::Kind::Bool && v.as_bool(); }
bool t_false(const Value& v, const CallArgs&) { return v.kind() == Value::Kind::Bool && !v.as_bool(); }
bool t_callable(const Value& v, const CallArgs&) { return v.is_callable(); }
int64_t int_of(const Value& v, const char* test) {
  if (v.kind() != Value::Kind::Int && v.kind() != Value::Kind::Bool)
    throw EvalError(std::string("test '") + test + "' needs an integer, got " + v.type_name());
  return v.as_int();
}
bool t_odd(const Value& v, const CallArgs&) { return int_of(v, "odd") % 2 != 0; }
bool t_even(const Value& v, const CallArgs&) { return int_of(v, "even") % 2 == 0; }
bool t_divisibleby(const Value& v, const CallArgs& a) {
  const int64_t d = int_of(arg(a, 0, "num"), "divisibleby");
  if (d == 0) throw EvalError("divisibleby(0)");
  return int_of(v, "divisibleby") % d == 0;
}
bool t_eq(const Value& v, const CallArgs& a) { return equals(v, arg(a, 0, "other")); }
bool t_ne(const Value& v, const CallArgs& a) { return !equals(v, arg(a, 0, "other")); }
bool t_in(const Value& v, const CallArgs& a) {
  const Value& seq = arg(a, 0, "seq");
  if (seq.is_string() && v.is_string()) return seq.str().find(v.str()) != std::string::npos;
  if (seq.is_dict()) return v.is_string() && seq.find(v.str()) != nullptr;
  for (const Value& x : iterate(seq))
    if (equals(x, v)) return true;
  return false;
}
bool t_lower(const Value& v, const CallArgs&) { return v.is_string() && ascii_case(v.str(), false) == v.str(); }
bool t_upper(const Value& v, const CallArgs&) { return v.is_string() && ascii_case(v.str(), true) == v.str(); }

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"tojson", f_tojson},   {"length", f_length},     {"count", f_length},       {"join", f_join},
      {"string", f_string},   {"safe", f_safe},         {"trim", f_trim},          {"upper", f_upper},
      {"lower", f_lower},     {"capitalize", f_capitalize}, {"title", f_title},    {"default", f_default},
      {"d", f_default},       {"first", f_first},       {"last", f_last},          {"list", f_list},
      {"reverse", f_reverse}, {"items", f_items},       {"replace", f_replace},    {"int", f_int},
      {"float", f_float},     {"abs", f_abs},           {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
      {"select", f_select},   {"reject", f_reject},     {"map", f_map},            {"unique", f_unique},
  };
  return m;
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none},       {"string", t_string},
      {"mapping", t_mapping}, {"iterable", t_iterable},   {"sequence", t_sequence}, {"number", t_number},
      {"integer", t_integer}, {"float", t_float},         {"boolean", t_boolean}, {"true", t_true},
      {"false", t_false},     {"callable", t_callable},   {"odd", t_odd},         {"even", t_even},
      {"divisibleby", t_divisibleby}, {"eq", t_eq},       {"equalto", t_eq},
      {"ne", t_ne},           {"in", t_in},           {"lower", t_lower},
      {"upper", t_upper},
  };
  return m;
}

template <typename M>
std::string names(const M& m) {
  std::string out;
  for (const auto& [k, v] : m) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  const auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}
TestFn find_test(const std::string& name) {
  const auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}
std::string filter_names() { return names(filters()); }
std::string test_names() { return names(tests()); }

}  // namespace moesq::serve::jinja
