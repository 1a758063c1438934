// Template values: construction, truthiness, equality and the three ways a value becomes text
// (Python str(), repr() and json.dumps). Strings are escaped for JSON by nlohmann-json, whose escape
// set (", \, \b \f \n \r \t, other controls as \u00xx, nothing above 0x7f) is Python's with
// ensure_ascii=False; only the separators and float digits are formatted here.
#include "serve/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace moesq::serve::jinja {

Value Value::undefined(std::string why) {
  Value v;
  v.s_ = std::move(why);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value::Value(bool b) : kind_(Kind::Bool), b_(b), i_(b ? 1 : 0) {}
Value::Value(int64_t i) : kind_(Kind::Int), i_(i) {}
Value::Value(double d) : kind_(Kind::Float), d_(d) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}
Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::List;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::dict(Dict items) {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::namespace_(Dict items) {
  Value v = dict(std::move(items));
  v.kind_ = Kind::Namespace;
  return v;
}
Value Value::callable(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::Callable;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), from_json(it.value()));
      return dict(std::move(items));
    }
    default: MOESQ_FAIL("chat template: a JSON value of type ", j.type_name(), " cannot be a template variable");
  }
}

const Value& arg_at(const CallArgs& a, size_t i, const char* kw) {
  static const Value kUndef;
  if (i < a.args.size()) return a.args[i];
  for (const auto& [k, v] : a.kwargs)
    if (k == kw) return v;
  return kUndef;
}

double Value::as_double() const { return kind_ == Kind::Float ? d_ : static_cast<double>(i_); }

const Value* Value::find(const std::string& key) const {
  if (!dict_) return nullptr;
  for (const auto& [k, v] : *dict_)
    if (k == key) return &v;
  return nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return d_ != 0.0;
    case Kind::String: return !s_.empty();
    case Kind::List: return !list_->empty();
    case Kind::Dict: return !dict_->empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "?";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits in scientific form, e.g. "1.2345e+05", then Python's layout rule:
  // fixed notation when -4 <= exponent < 16, else d.ddde±XX.
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  const int exp = std::stoi(sci.substr(e_pos + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return neg ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  return out + q;
}

std::string json_string(const std::string& s) {
  try {
    return nlohmann::ordered_json(s).dump(-1, ' ', false);
  } catch (const nlohmann::json::exception& e) {
    throw EvalError(std::string("tojson: a string is not valid UTF-8 (") + e.what() + ")");
  }
}

void json_append(std::string& out, const Value& v, int indent, int depth, const std::string& item_sep,
                 const std::string& key_sep, bool sort_keys) {
  const auto newline = [&](int d) {
    if (indent >= 0) out += "\n" + std::string(static_cast<size_t>(indent) * d, ' ');
  };
  // With an indent Python ends items with "," (the item separator's trailing space is dropped only
  // when separators is not given; json.dumps then uses (",", ": ")).
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return;
    }
    case Value::Kind::String: out += json_string(v.str()); return;
    case Value::Kind::List: {
      if (v.items().empty()) { out += "[]"; return; }
      out += "[";
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_append(out, v.items()[i], indent, depth + 1, item_sep, key_sep, sort_keys);
      }
      newline(depth);
      out += "]";
      return;
    }
    case Value::Kind::Dict: {
      if (v.entries().empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& e : v.entries()) order.push_back(&e);
      if (sort_keys)
        std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        out += json_string(order[i]->first) + key_sep;
        json_append(out, order[i]->second, indent, depth + 1, item_sep, key_sep, sort_keys);
      }
      newline(depth);
      out += "}";
      return;
    }
    default:
      throw EvalError("tojson: Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json_text(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                         bool sort_keys) {
  std::string out;
  json_append(out, v, indent, 0, item_sep, key_sep, sort_keys);
  return out;
}

std::string to_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: return repr_string(v.str());
    case Value::Kind::List: {
      std::string out = "[";
      for (size_t i = 0; i < v.items().size(); ++i) out += (i ? ", " : "") + to_repr(v.items()[i]);
      return out + "]";
    }
    case Value::Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.entries()) {
        out += (first ? "" : ", ") + repr_string(k) + ": " + to_repr(e);
        first = false;
      }
      return out + "}";
    }
    case Value::Kind::Namespace: return "<Namespace>";
    case Value::Kind::Callable: return "<function " + v.str() + ">";
    default: return to_output(v);
  }
}

std::string to_output(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.as_bool() ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.as_int());
    case Value::Kind::Float: return float_repr(v.as_double());
    case Value::Kind::String: return v.str();
    default: return to_repr(v);
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.str() == b.str();
    case Value::Kind::List:
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equals(a.items()[i], b.items()[i])) return false;
      return true;
    case Value::Kind::Dict:
      if (a.entries().size() != b.entries().size()) return false;
      for (const auto& [k, v] : a.entries()) {
        const Value* o = b.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    default: return &a.entries() == &b.entries();  // namespaces: identity
  }
}

std::vector<char32_t> utf8_decode(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string utf8_encode(const std::vector<char32_t>& cps) {
  std::string out;
  for (char32_t cp : cps) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

}  // namespace moesq::serve::jinja
