// Attribute/item access and the Python str/dict methods. Strings are indexed and sliced by code
// point (UTF-8 decoded), as Python indexes str.
#include "serve/jinja/methods.h"

#include <algorithm>
#include <optional>

namespace moesq::serve::jinja {
namespace {

const Value& arg(const CallArgs& a, size_t i, const char* kw) { return arg_at(a, i, kw); }

const std::string& str_arg(const CallArgs& a, size_t i, const char* kw, const std::string& method) {
  const Value& v = arg(a, i, kw);
  if (!v.is_string()) throw EvalError("str." + method + "() needs a string argument, got " + v.type_name());
  return v.str();
}

bool is_py_space(char32_t c) { return c == ' ' || (c >= '\t' && c <= '\r') || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x1f || c == 0x85 || c == 0xa0 || c == 0x3000 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x1680 || c == 0x202f || c == 0x205f; }

List split(const std::string& s, const Value& sep_v, int64_t maxsplit) {
  List out;
  if (sep_v.is_undefined() || sep_v.is_none()) {  // runs of whitespace, no empty strings
    const auto cps = utf8_decode(s);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && is_py_space(cps[e - 1])) --e;
        out.push_back(Value(utf8_encode({cps.begin() + i, cps.begin() + e})));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      out.push_back(Value(utf8_encode({cps.begin() + i, cps.begin() + j})));
      i = j;
    }
    return out;
  }
  if (!sep_v.is_string()) throw EvalError("str.split() separator must be a string, got " + sep_v.type_name());
  const std::string& sep = sep_v.str();
  if (sep.empty()) throw EvalError("str.split(): empty separator");
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t f = s.find(sep, start);
    if (f == std::string::npos) break;
    out.push_back(Value(s.substr(start, f - start)));
    start = f + sep.size();
  }
  out.push_back(Value(s.substr(start)));
  return out;
}

std::string ascii_map(std::string s, int (*f)(int)) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(f(c));
  return s;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) throw EvalError("replace: an empty search string is not supported");
  std::string out;
  size_t start = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t f = s.find(from, start);
    if (f == std::string::npos) break;
    out += s.substr(start, f - start) + to;
    start = f + from.size();
  }
  return out + s.substr(start);
}

Value string_method(const std::string& s, const std::string& name) {
  auto method = [&](Function fn) { return Value::callable("str." + name, std::move(fn)); };
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return method([s, starts, name](const CallArgs& a) {
      const Value& p = arg(a, 0, "prefix");
      auto test = [&](const std::string& x) {
        if (x.size() > s.size()) return false;
        return starts ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
      };
      if (p.is_list()) {
        for (const Value& x : p.items())
          if (x.is_string() && test(x.str())) return Value(true);
        return Value(false);
      }
      return Value(test(str_arg(a, 0, "prefix", name)));
    });
  }
  if (name == "split")
    return method([s](const CallArgs& a) {
      const Value& m = arg(a, 1, "maxsplit");
      return Value::list(split(s, arg(a, 0, "sep"), m.kind() == Value::Kind::Int ? m.as_int() : -1));
    });
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return method([s, l, r](const CallArgs& a) { return Value(py_strip(s, arg(a, 0, "chars"), l, r)); });
  }
  if (name == "upper") return method([s](const CallArgs&) { return Value(ascii_map(s, ::toupper)); });
  if (name == "lower") return method([s](const CallArgs&) { return Value(ascii_map(s, ::tolower)); });
  if (name == "replace")
    return method([s](const CallArgs& a) {
      const Value& c = arg(a, 2, "count");
      return Value(replace_all(s, str_arg(a, 0, "old", "replace"), str_arg(a, 1, "new", "replace"),
                               c.kind() == Value::Kind::Int ? c.as_int() : -1));
    });
  if (name == "find")
    return method([s](const CallArgs& a) {
      const size_t f = s.find(str_arg(a, 0, "sub", "find"));
      return Value(f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(utf8_decode(s.substr(0, f)).size()));
    });
  if (name == "count")
    return method([s](const CallArgs& a) {
      const std::string& sub = str_arg(a, 0, "sub", "count");
      int64_t n = 0;
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_decode(s).size() + 1));
      for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
      return Value(n);
    });
  if (name == "join")
    return method([s](const CallArgs& a) {
      std::string out;
      bool first = true;
      for (const Value& v : iterate(arg(a, 0, "iterable"))) {
        if (!v.is_string()) throw EvalError("str.join() needs strings, got " + v.type_name());
        out += (first ? "" : s) + v.str();
        first = false;
      }
      return Value(out);
    });
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "items")
    return Value::callable("dict.items", [d](const CallArgs&) {
      List out;
      for (const auto& [k, v] : d.entries()) out.push_back(Value::list({Value(k), v}));
      return Value::list(std::move(out));
    });
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return Value::callable("dict." + name, [d, keys](const CallArgs&) {
      List out;
      for (const auto& [k, v] : d.entries()) out.push_back(keys ? Value(k) : v);
      return Value::list(std::move(out));
    });
  }
  if (name == "get")
    return Value::callable("dict.get", [d](const CallArgs& a) {
      const Value& key = arg(a, 0, "key");
      const Value* v = key.is_string() ? d.find(key.str()) : nullptr;
      if (v) return *v;
      const Value& def = arg(a, 1, "default");
      return def.is_undefined() ? Value::none() : def;
    });
  return Value();
}

int64_t normalize_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

}  // namespace

void fail_undefined(const Value& v) { throw EvalError(v.str().empty() ? "a value is undefined" : v.str()); }

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto cps = utf8_decode(s);
  std::vector<char32_t> set;
  const bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) {
    if (!chars.is_string()) throw EvalError("strip() chars must be a string, got " + chars.type_name());
    set = utf8_decode(chars.str());
  }
  auto strip_it = [&](char32_t c) { return ws ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode({cps.begin() + b, cps.begin() + e});
}

Value get_attribute(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::Undefined: fail_undefined(obj);
    case Value::Kind::String: return string_method(obj.str(), name);
    case Value::Kind::Dict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Kind::Namespace:
      if (const Value* v = obj.find(name)) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    default: return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if ((obj.is_dict() || obj.is_namespace()) && key.is_string()) {
    if (const Value* v = obj.find(key.str())) return *v;
    if (obj.is_dict()) {
      Value m = dict_method(obj, key.str());
      if (!m.is_undefined()) return m;
    }
    return Value::undefined("'dict object' has no attribute '" + key.str() + "'");
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind() == Value::Kind::Int || key.kind() == Value::Kind::Bool)) {
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.items().size()), i = normalize_index(key.as_int(), n);
      if (i >= 0 && i < n) return obj.items()[i];
      return Value::undefined("'list object' has no element " + std::to_string(key.as_int()));
    }
    const auto cps = utf8_decode(obj.str());
    const int64_t n = static_cast<int64_t>(cps.size()), i = normalize_index(key.as_int(), n);
    if (i >= 0 && i < n) return Value(utf8_encode({cps[i]}));
    return Value::undefined("'str object' has no element " + std::to_string(key.as_int()));
  }
  if (obj.is_string() && key.is_string()) return string_method(obj.str(), key.str());
  return Value::undefined("'" + obj.type_name() + " object' has no item " + to_repr(key));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step_v) {
  auto as_opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (v.kind() != Value::Kind::Int && v.kind() != Value::Kind::Bool)
      throw EvalError(std::string("slice ") + what + " must be an integer, got " + v.type_name());
    return v.as_int();
  };
  if (obj.is_undefined()) fail_undefined(obj);
  if (!obj.is_list() && !obj.is_string()) throw EvalError("cannot slice a " + obj.type_name());
  const int64_t step = as_opt(step_v, "step").value_or(1);
  if (step == 0) throw EvalError("slice step cannot be zero");
  std::vector<char32_t> cps;
  if (obj.is_string()) cps = utf8_decode(obj.str());
  const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.items().size()) : static_cast<int64_t>(cps.size());
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t b = adjust(as_opt(start, "start"), step < 0 ? n - 1 : 0);
  const int64_t e = adjust(as_opt(stop, "stop"), step < 0 ? -1 : n);
  List items;
  std::vector<char32_t> chars;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) {
    if (obj.is_list()) items.push_back(obj.items()[i]);
    else chars.push_back(cps[i]);
  }
  return obj.is_list() ? Value::list(std::move(items)) : Value(utf8_encode(chars));
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.items();
    case Value::Kind::Dict: {
      List keys;
      for (const auto& [k, e] : v.entries()) keys.push_back(Value(k));
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      for (char32_t c : utf8_decode(v.str())) chars.push_back(Value(utf8_encode({c})));
      return chars;
    }
    default: throw EvalError("'" + v.type_name() + "' object is not iterable");
  }
}

}  // namespace moesq::serve::jinja
