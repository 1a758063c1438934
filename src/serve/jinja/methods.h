// Attribute and item access with Jinja2's rules, and the Python methods templates call on strings
// (startswith, split, strip, ...) and dicts (items, keys, values, get).
// Jinja2 tries `obj.name` as a Python attribute first and then as an item (so `d.items` is the
// method even when d has a key "items"), and `obj[key]` as an item first and then as an attribute;
// a missing one is Undefined (an error only when the Undefined is used).
#pragma once
#include <string>

#include "serve/jinja/value.h"

namespace moesq::serve::jinja {

Value get_attribute(const Value& obj, const std::string& name);  // obj.name
Value get_item(const Value& obj, const Value& key);              // obj[key]
// obj[start:stop:step] on a list or string (null Values = omitted, Python's slice rules).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// What `for x in v` iterates: list items, dict keys, string code points; Undefined is empty.
// Throws EvalError for a value that is not iterable.
List iterate(const Value& v);
// Python str.strip/lstrip/rstrip (chars: Undefined or None = whitespace).
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
// Error for a misused Undefined: its reason ("'x' is undefined").
[[noreturn]] void fail_undefined(const Value& v);

}  // namespace moesq::serve::jinja
