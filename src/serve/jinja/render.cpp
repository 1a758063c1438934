// The tree-walking renderer: eval() for expressions, exec() for statements. An EvalError from deep
// inside an expression is turned into a moesq::Error at the innermost expression that has a line,
// so every message says where in the template it happened.
#include "serve/jinja/render.h"

#include <cmath>
#include <unordered_map>

#include "serve/jinja/methods.h"

namespace moesq::serve::jinja {
namespace {

constexpr int kMaxMacroDepth = 256;  // a runaway recursive macro is an error, not a stack overflow

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { Normal, Break, Continue };


std::string op_types(const char* op, const Value& l, const Value& r) {
  return std::string("unsupported operand type(s) for ") + op + ": '" + l.type_name() + "' and '" + r.type_name() + "'";
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value arithmetic(const std::string& op, const Value& l, const Value& r) {
  if (l.is_undefined()) fail_undefined(l);
  if (r.is_undefined()) fail_undefined(r);
  if (op == "+") {
    if (l.is_string() && r.is_string()) return Value(l.str() + r.str());
    if (l.is_list() && r.is_list()) {
      List out = l.items();
      out.insert(out.end(), r.items().begin(), r.items().end());
      return Value::list(std::move(out));
    }
  }
  if (op == "*") {
    const Value* seq = l.is_string() || l.is_list() ? &l : r.is_string() || r.is_list() ? &r : nullptr;
    const Value* times = seq == &l ? &r : &l;
    if (seq && (times->kind() == Value::Kind::Int || times->kind() == Value::Kind::Bool)) {
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < times->as_int(); ++i) out += seq->str();
        return Value(out);
      }
      List out;
      for (int64_t i = 0; i < times->as_int(); ++i) out.insert(out.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(out));
    }
  }
  if (!l.is_number() || !r.is_number()) throw EvalError(op_types(op.c_str(), l, r));
  const bool ints = l.kind() != Value::Kind::Float && r.kind() != Value::Kind::Float;
  const double a = l.as_double(), b = r.as_double();
  if ((op == "/" || op == "//" || op == "%") && b == 0) throw EvalError("division by zero");
  if (op == "+") return ints ? Value(l.as_int() + r.as_int()) : Value(a + b);
  if (op == "-") return ints ? Value(l.as_int() - r.as_int()) : Value(a - b);
  if (op == "*") return ints ? Value(l.as_int() * r.as_int()) : Value(a * b);
  if (op == "/") return Value(a / b);
  if (op == "//") return ints ? Value(floor_div(l.as_int(), r.as_int())) : Value(std::floor(a / b));
  if (op == "%") {
    if (ints) return Value(l.as_int() - floor_div(l.as_int(), r.as_int()) * r.as_int());
    return Value(a - std::floor(a / b) * b);
  }
  if (op == "**") {
    if (ints && r.as_int() >= 0) {
      int64_t out = 1;
      for (int64_t i = 0; i < r.as_int(); ++i) out *= l.as_int();
      return Value(out);
    }
    return Value(std::pow(a, b));
  }
  throw EvalError("unknown operator " + op);
}

bool less(const Value& l, const Value& r, const std::string& op) {
  if (l.is_number() && r.is_number()) return l.as_double() < r.as_double();
  if (l.is_string() && r.is_string()) return l.str() < r.str();
  if (l.is_undefined()) fail_undefined(l);
  if (r.is_undefined()) fail_undefined(r);
  throw EvalError("'" + op + "' not supported between instances of '" + l.type_name() + "' and '" + r.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!item.is_string()) throw EvalError("'in <string>' requires string as left operand, not " + item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::Dict:
    case Value::Kind::Namespace: return item.is_string() && container.find(item.str()) != nullptr;
    case Value::Kind::List:
      for (const Value& x : container.items())
        if (equals(x, item)) return true;
      return false;
    default: throw EvalError("argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool compare(const std::string& op, const Value& l, const Value& r) {
  if (op == "==") return equals(l, r);
  if (op == "!=") return !equals(l, r);
  if (op == "<") return less(l, r, op);
  if (op == ">") return less(r, l, op);
  if (op == "<=") return !less(r, l, op);
  if (op == ">=") return !less(l, r, op);
  if (op == "in") return contains(r, l);
  return !contains(r, l);  // "not in"
}

class Renderer {
 public:
  explicit Renderer(const Template& t) : t_(t) {}

  std::string run(const Dict& variables) {
    globals_ = std::make_shared<Scope>();
    add_builtins();
    for (const auto& [k, v] : variables) globals_->vars[k] = v;
    auto top = std::make_shared<Scope>();
    top->parent = globals_;
    std::string out;
    exec(t_.body, top, out);
    return out;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    MOESQ_FAIL("chat template ", t_.name, " line ", line, ": ", what);
  }

  void add_builtins() {
    const std::string name = t_.name;
    globals_->vars["raise_exception"] = Value::callable("raise_exception", [name](const CallArgs& a) -> Value {
      throw TemplateError(name, a.args.empty() ? std::string() : to_output(a.args[0]));
    });
    globals_->vars["namespace"] = Value::callable("namespace", [](const CallArgs& a) {
      Dict attrs;
      for (const Value& v : a.args) {
        if (!v.is_dict()) throw EvalError("namespace() positional arguments must be mappings");
        attrs.insert(attrs.end(), v.entries().begin(), v.entries().end());
      }
      for (const auto& kv : a.kwargs) attrs.push_back(kv);
      return Value::namespace_(std::move(attrs));
    });
    globals_->vars["dict"] = Value::callable("dict", [](const CallArgs& a) {
      Dict d;
      for (const auto& kv : a.kwargs) d.push_back(kv);
      return Value::dict(std::move(d));
    });
    globals_->vars["range"] = Value::callable("range", [](const CallArgs& a) {
      for (const Value& v : a.args)
        if (v.kind() != Value::Kind::Int) throw EvalError("range() arguments must be integers");
      if (a.args.empty() || a.args.size() > 3) throw EvalError("range() takes 1 to 3 arguments");
      const int64_t start = a.args.size() > 1 ? a.args[0].as_int() : 0;
      const int64_t stop = a.args.size() > 1 ? a.args[1].as_int() : a.args[0].as_int();
      const int64_t step = a.args.size() > 2 ? a.args[2].as_int() : 1;
      if (step == 0) throw EvalError("range() step must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value(i));
        if (out.size() > 1000000) throw EvalError("range() longer than 1,000,000 items");
      }
      return Value::list(std::move(out));
    });
  }

  // ---- expressions ----
  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      return eval_inner(e, scope);
    } catch (const EvalError& err) {
      fail(e.line, err.what());
    }
  }
  Value eval_opt(const ExprPtr& e, const ScopePtr& scope) { return e ? eval(*e, scope) : Value(); }

  CallArgs eval_args(const Expr& e, const ScopePtr& scope, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.args.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v, scope));
    return a;
  }

  Value eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: {
        if (const Value* v = scope->lookup(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: return Value::list(eval_args(e, scope, 0).args);
      case Expr::Kind::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i], scope);
          if (!k.is_string()) throw EvalError("dict literal keys must be strings, got " + k.type_name());
          d.emplace_back(k.str(), eval(*e.args[i + 1], scope));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::Attr: return get_attribute(eval(*e.args[0], scope), e.name);
      case Expr::Kind::Item: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::Slice:
        return get_slice(eval(*e.args[0], scope), eval_opt(e.args[1], scope), eval_opt(e.args[2], scope),
                         eval_opt(e.args[3], scope));
      case Expr::Kind::Call: {
        const Value callee = eval(*e.args[0], scope);
        if (callee.is_undefined()) fail_undefined(callee);
        if (!callee.is_callable()) throw EvalError("'" + callee.type_name() + "' object is not callable");
        return callee.function()(eval_args(e, scope, 1));
      }
      case Expr::Kind::Filter: return e.filter(eval(*e.args[0], scope), eval_args(e, scope, 1));
      case Expr::Kind::Test: return Value(e.test(eval(*e.args[0], scope), eval_args(e, scope, 1)) != e.negated);
      case Expr::Kind::Neg: {
        const Value v = eval(*e.args[0], scope);
        if (v.kind() == Value::Kind::Float) return Value(-v.as_double());
        if (v.is_number()) return Value(-v.as_int());
        if (v.is_undefined()) fail_undefined(v);
        throw EvalError("bad operand type for unary -: '" + v.type_name() + "'");
      }
      case Expr::Kind::Not: return Value(!eval(*e.args[0], scope).truthy());
      case Expr::Kind::And: {
        Value l = eval(*e.args[0], scope);
        return l.truthy() ? eval(*e.args[1], scope) : l;
      }
      case Expr::Kind::Or: {
        Value l = eval(*e.args[0], scope);
        return l.truthy() ? l : eval(*e.args[1], scope);
      }
      case Expr::Kind::Binary: {
        const Value l = eval(*e.args[0], scope), r = eval(*e.args[1], scope);
        if (e.name == "~") return Value(to_output(l) + to_output(r));
        return arithmetic(e.name, l, r);
      }
      case Expr::Kind::Compare: {
        Value l = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = eval(*e.args[i + 1], scope);
          if (!compare(e.ops[i], l, r)) return Value(false);
          l = std::move(r);
        }
        return Value(true);
      }
      case Expr::Kind::Cond:
        if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value::undefined("the 'if' expression has no 'else'");
    }
    throw EvalError("unknown expression");
  }

  // ---- statements ----
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const NodePtr& n : body) {
      const Flow f = exec_node(*n, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_node(const Node& n, const ScopePtr& scope, std::string& out) {
    switch (n.kind) {
      case Node::Kind::Text: out += n.text; return Flow::Normal;
      case Node::Kind::Output: out += to_output(eval(*n.expr, scope)); return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond, scope).truthy()) return exec(body, scope, out);
        return exec(n.else_body, scope, out);
      case Node::Kind::For: return exec_for(n, scope, out);
      case Node::Kind::Set: assign(n, scope, eval(*n.expr, scope)); return Flow::Normal;
      case Node::Kind::SetBlock: {
        std::string text;
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        exec(n.body, inner, text);
        assign(n, scope, Value(text));
        return Flow::Normal;
      }
      case Node::Kind::Macro: scope->vars[n.targets[0]] = make_macro(n, scope); return Flow::Normal;
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  void assign(const Node& n, const ScopePtr& scope, Value v) {
    if (n.targets.size() == 1) {
      scope->vars[n.targets[0]] = std::move(v);
      return;
    }
    const Value* ns = scope->lookup(n.targets[0]);
    if (!ns || !ns->is_namespace())
      fail(n.line, "cannot assign attribute '" + n.targets[1] + "' on '" + n.targets[0] + "', which is " +
                       (ns ? "a " + ns->type_name() : std::string("undefined")) + ", not a namespace()");
    for (auto& [k, old] : ns->mutable_entries())
      if (k == n.targets[1]) {
        old = std::move(v);
        return;
      }
    ns->mutable_entries().emplace_back(n.targets[1], std::move(v));
  }

  void bind_targets(const Node& n, const ScopePtr& s, const Value& item) {
    if (n.targets.size() == 1) {
      s->vars[n.targets[0]] = item;
      return;
    }
    if (!item.is_list() || item.items().size() != n.targets.size())
      fail(n.line, "cannot unpack a " + item.type_name() + " into " + std::to_string(n.targets.size()) + " loop variables");
    for (size_t i = 0; i < n.targets.size(); ++i) s->vars[n.targets[i]] = item.items()[i];
  }

  Flow exec_for(const Node& n, const ScopePtr& scope, std::string& out) {
    List items;
    try {
      items = iterate(eval(*n.expr, scope));
    } catch (const EvalError& err) {
      fail(n.line, err.what());
    }
    if (n.cond) {  // `for x in xs if cond`: loop.* count the items that pass
      List kept;
      for (const Value& item : items) {
        auto s = std::make_shared<Scope>();
        s->parent = scope;
        bind_targets(n, s, item);
        if (eval(*n.cond, s).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      auto s = std::make_shared<Scope>();
      s->parent = scope;
      bind_targets(n, s, items[i]);
      Dict loop = {{"index0", Value(i)},
                   {"index", Value(i + 1)},
                   {"revindex0", Value(len - i - 1)},
                   {"revindex", Value(len - i)},
                   {"first", Value(i == 0)},
                   {"last", Value(i == len - 1)},
                   {"length", Value(len)},
                   {"depth0", Value(int64_t{0})},
                   {"depth", Value(int64_t{1})},
                   {"previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
                   {"nextitem", i + 1 < len ? items[i + 1] : Value::undefined("there is no next item")}};
      loop.emplace_back("cycle", Value::callable("loop.cycle", [i](const CallArgs& a) {
                          if (a.args.empty()) throw EvalError("loop.cycle() needs at least one value");
                          return a.args[static_cast<size_t>(i) % a.args.size()];
                        }));
      s->vars["loop"] = Value::dict(std::move(loop));
      if (exec(n.body, s, out) == Flow::Break) break;
    }
    if (len == 0) exec(n.else_body, scope, out);
    return Flow::Normal;
  }

  Value make_macro(const Node& n, const ScopePtr& def_scope) {
    const Node* node = &n;
    // The defining scope holds this macro, so the macro may only refer to it weakly (a strong reference
    // is a cycle that outlives the render); macro_scopes_ keeps it alive until the render ends.
    macro_scopes_.push_back(def_scope);
    std::weak_ptr<Scope> weak_scope = def_scope;
    return Value::callable(n.targets[0], [this, node, weak_scope](const CallArgs& a) {
      const std::string& name = node->targets[0];
      if (a.args.size() > node->params.size())
        throw EvalError("macro '" + name + "' takes not more than " + std::to_string(node->params.size()) +
                        " argument(s)");
      if (depth_ >= kMaxMacroDepth)
        throw EvalError("macro '" + name + "' recursed deeper than " + std::to_string(kMaxMacroDepth) + " calls");
      auto s = std::make_shared<Scope>();
      s->parent = weak_scope.lock();
      if (!s->parent) throw EvalError("macro '" + name + "' called after its template finished rendering");
      for (const auto& [k, v] : a.kwargs) {
        bool known = false;
        for (const auto& p : node->params) known = known || p.first == k;
        if (!known) throw EvalError("macro '" + name + "' takes no keyword argument '" + k + "'");
      }
      for (size_t i = 0; i < node->params.size(); ++i) {
        const auto& [pname, def] = node->params[i];
        Value v = arg_at(a, i, pname.c_str());
        if (v.is_undefined() && i >= a.args.size() && def) v = eval(*def, s);
        else if (v.is_undefined() && i >= a.args.size())
          v = Value::undefined("parameter '" + pname + "' of macro '" + name + "' was not given");
        s->vars[pname] = std::move(v);
      }
      std::string text;
      ++depth_;
      try {
        exec(node->body, s, text);
      } catch (...) {
        --depth_;
        throw;
      }
      --depth_;
      return Value(text);
    });
  }

  const Template& t_;
  ScopePtr globals_;
  std::vector<ScopePtr> macro_scopes_;
  int depth_ = 0;
};

}  // namespace

std::string render(const Template& t, const Dict& variables) { return Renderer(t).run(variables); }

}  // namespace moesq::serve::jinja
