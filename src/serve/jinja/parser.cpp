// Recursive-descent parser. One method per grammar level, named as in jinja2/parser.py so the two
// can be read side by side. Block bodies are parsed by `subparse` until one of the closing tags of
// the block that opened them; an unclosed block is reported at the line of its opening tag.
#include "serve/jinja/parser.h"

#include <set>

#include "core/error.h"
#include "serve/jinja/filters.h"
#include "serve/jinja/lexer.h"

namespace moesq::serve::jinja {
namespace {

using K = Token::Kind;

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name) : toks_(std::move(tokens)), name_(name) {}

  Body parse_all() {
    Body body = subparse({}, "", 0);
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  Token next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(const char* op) const { return cur().kind == K::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().kind == K::Name && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++pos_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case K::Text: return "template text";
      case K::VarBegin: return "'{{'";
      case K::VarEnd: return "'}}'";
      case K::BlockBegin: return "'{%'";
      case K::BlockEnd: return "'%}'";
      case K::Name: return "'" + t.value + "'";
      case K::String: return "a string literal";
      case K::Int:
      case K::Float: return "the number " + t.value;
      case K::Op: return "'" + t.value + "'";
      case K::End: return "the end of the template";
    }
    return "?";
  }
  [[noreturn]] void fail(int line, const std::string& what) const {
    MOESQ_FAIL("chat template ", name_, " line ", line, ": ", what);
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail(cur().line, "expected " + expected + ", got " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) unexpected(std::string("'") + op + "'");
  }
  void expect(K kind, const char* what) {
    if (cur().kind != kind) unexpected(what);
    ++pos_;
  }
  std::string expect_name(const char* what) {
    if (cur().kind != K::Name) unexpected(what);
    return next().value;
  }
  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- statements ----
  // Parses nodes until a block tag whose name is in `ends` (left as the current token, after its
  // '{%'). `opener`/`open_line` name the block for the error when the template ends first.
  Body subparse(const std::set<std::string>& ends, const std::string& opener, int open_line) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == K::End) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "'" : " or '") + e + "'";
          fail(open_line, "'" + opener + "' block opened here is never closed (expected " + list + ")");
        }
        return body;
      }
      if (t.kind == K::Text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Text;
        n->line = t.line;
        n->text = t.value;
        body.push_back(std::move(n));
        ++pos_;
      } else if (t.kind == K::VarBegin) {
        ++pos_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Output;
        n->line = t.line;
        n->expr = parse_tuple(true);
        expect(K::VarEnd, "'}}'");
        body.push_back(std::move(n));
      } else if (t.kind == K::BlockBegin) {
        ++pos_;
        if (cur().kind != K::Name) unexpected("a tag name after '{%'");
        if (ends.count(cur().value)) return body;
        body.push_back(statement());
      } else {
        unexpected("template text or a tag");
      }
    }
  }

  NodePtr statement() {
    const Token tag = next();
    const std::string& n = tag.value;
    if (n == "if") return parse_if(tag.line);
    if (n == "for") return parse_for(tag.line);
    if (n == "set") return parse_set(tag.line);
    if (n == "macro") return parse_macro(tag.line);
    if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) fail(tag.line, "'" + n + "' outside of a 'for' loop");
      auto node = std::make_unique<Node>();
      node->kind = n == "break" ? Node::Kind::Break : Node::Kind::Continue;
      node->line = tag.line;
      expect(K::BlockEnd, "'%}'");
      return node;
    }
    static const std::set<std::string> kUnsupported = {"call", "filter", "raw", "include", "extends", "block",
                                                       "import", "from", "with", "autoescape", "do", "generation",
                                                       "trans"};
    if (kUnsupported.count(n)) fail(tag.line, "the '" + n + "' tag is not supported by this chat-template renderer");
    static const std::set<std::string> kEnds = {"endif", "endfor", "endset", "endmacro", "elif", "else"};
    if (kEnds.count(n)) fail(tag.line, "unexpected '" + n + "' (no open block it closes)");
    fail(tag.line, "unknown tag '" + n + "'");
  }

  NodePtr parse_if(int line) {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::If;
    node->line = line;
    while (true) {
      ExprPtr cond = parse_tuple(false);
      expect(K::BlockEnd, "'%}'");
      Body body = subparse({"elif", "else", "endif"}, "if", line);
      node->branches.emplace_back(std::move(cond), std::move(body));
      const std::string end = next().value;
      if (end == "elif") continue;
      if (end == "else") {
        expect(K::BlockEnd, "'%}'");
        node->else_body = subparse({"endif"}, "if", line);
        next();
      }
      expect(K::BlockEnd, "'%}'");
      return node;
    }
  }

  NodePtr parse_for(int line) {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::For;
    node->line = line;
    do {
      node->targets.push_back(expect_name("a loop variable name"));
    } while (skip_op(","));
    if (!skip_name("in")) unexpected("'in'");
    node->expr = parse_tuple(false, /*with_condexpr=*/false);
    if (skip_name("if")) node->cond = parse_tuple(false);
    if (is_name("recursive")) fail(cur().line, "recursive 'for' loops are not supported by this chat-template renderer");
    expect(K::BlockEnd, "'%}'");
    ++loop_depth_;
    node->body = subparse({"endfor", "else"}, "for", line);
    --loop_depth_;
    if (next().value == "else") {
      expect(K::BlockEnd, "'%}'");
      node->else_body = subparse({"endfor"}, "for", line);
      next();
    }
    expect(K::BlockEnd, "'%}'");
    return node;
  }

  NodePtr parse_set(int line) {
    auto node = std::make_unique<Node>();
    node->line = line;
    node->targets.push_back(expect_name("a variable name after 'set'"));
    if (skip_op(".")) node->targets.push_back(expect_name("an attribute name"));
    if (is_op(",")) fail(cur().line, "'set' with several targets is not supported by this chat-template renderer");
    if (skip_op("=")) {
      node->kind = Node::Kind::Set;
      node->expr = parse_tuple(true);
      expect(K::BlockEnd, "'%}'");
      return node;
    }
    if (is_op("|")) fail(cur().line, "filtered block 'set' is not supported by this chat-template renderer");
    if (node->targets.size() != 1) unexpected("'='");
    expect(K::BlockEnd, "'=' or '%}'");
    node->kind = Node::Kind::SetBlock;
    node->body = subparse({"endset"}, "set", line);
    next();
    expect(K::BlockEnd, "'%}'");
    return node;
  }

  NodePtr parse_macro(int line) {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::Macro;
    node->line = line;
    node->targets.push_back(expect_name("a macro name"));
    expect_op("(");
    while (!skip_op(")")) {
      if (!node->params.empty()) expect_op(",");
      if (skip_op(")")) break;
      std::string p = expect_name("a parameter name");
      ExprPtr def;
      if (skip_op("=")) def = parse_expression();
      node->params.emplace_back(std::move(p), std::move(def));
    }
    expect(K::BlockEnd, "'%}'");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    node->body = subparse({"endmacro"}, "macro", line);
    loop_depth_ = saved;
    next();
    if (cur().kind == K::Name) next();  // {% endmacro name %}
    expect(K::BlockEnd, "'%}'");
    return node;
  }

  // ---- expressions ----
  // A comma-separated list becomes a tuple when `allow_tuple`; without `with_condexpr` it stops below `a if b`.
  ExprPtr parse_tuple(bool allow_tuple, bool with_condexpr = true) {
    const int line = cur().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!allow_tuple || !is_op(",")) return first;
    auto t = make(Expr::Kind::Tuple, line);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().kind == K::VarEnd || cur().kind == K::BlockEnd || is_op(")")) break;
      t->args.push_back(parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() { return parse_condexpr(); }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto c = make(Expr::Kind::Cond, line);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      c->args.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, ExprPtr l, ExprPtr r, int line, std::string op = "") {
    auto e = make(k, line);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      l = binary(Expr::Kind::Or, std::move(l), parse_and(), line);
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      l = binary(Expr::Kind::And, std::move(l), parse_not(), line);
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      auto e = make(Expr::Kind::Not, line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == K::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                  cur().value == ">" || cur().value == "<=" || cur().value == ">=")) {
        op = next().value;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().kind == K::Name && peek().value == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token op = next();
      l = binary(Expr::Kind::Binary, std::move(l), parse_concat(), op.line, op.value);
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      const Token op = next();
      l = binary(Expr::Kind::Binary, std::move(l), parse_math2(), op.line, "~");
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = next();
      l = binary(Expr::Kind::Binary, std::move(l), parse_pow(), op.line, op.value);
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      const Token op = next();
      l = binary(Expr::Kind::Binary, std::move(l), parse_unary(true), op.line, "**");
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-")) {
      const int line = next().line;
      node = make(Expr::Kind::Neg, line);
      node->args.push_back(parse_unary(false));
    } else if (is_op("+")) {
      next();
      node = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    if (t.kind == K::Name) {
      next();
      auto e = make(Expr::Kind::Literal, t.line);
      if (t.value == "true" || t.value == "True") e->literal = Value(true);
      else if (t.value == "false" || t.value == "False") e->literal = Value(false);
      else if (t.value == "none" || t.value == "None") e->literal = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = t.value;
      }
      return e;
    }
    if (t.kind == K::String) {
      std::string s;
      while (cur().kind == K::String) s += next().value;
      auto e = make(Expr::Kind::Literal, t.line);
      e->literal = Value(s);
      return e;
    }
    if (t.kind == K::Int || t.kind == K::Float) {
      next();
      auto e = make(Expr::Kind::Literal, t.line);
      try {
        e->literal = t.kind == K::Int ? Value(static_cast<int64_t>(std::stoll(t.value))) : Value(std::stod(t.value));
      } catch (const std::exception&) {
        fail(t.line, "number " + t.value + " is out of range");
      }
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::Kind::Tuple, t.line);
      ExprPtr e = parse_tuple(true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make(Expr::Kind::List, t.line);
      while (!skip_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("]")) break;
        e->args.push_back(parse_expression());
      }
      return e;
    }
    if (skip_op("{")) {
      auto e = make(Expr::Kind::Dict, t.line);
      while (!skip_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("}")) break;
        e->args.push_back(parse_expression());
        expect_op(":");
        e->args.push_back(parse_expression());
      }
      return e;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) node = parse_subscript(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) node = parse_filter(std::move(node));
      else if (is_name("is")) node = parse_test(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token t = next();
    if (t.value == ".") {
      if (cur().kind == K::Int) {
        auto e = make(Expr::Kind::Item, t.line);
        auto idx = make(Expr::Kind::Literal, t.line);
        idx->literal = Value(static_cast<int64_t>(std::stoll(next().value)));
        e->args.push_back(std::move(node));
        e->args.push_back(std::move(idx));
        return e;
      }
      auto e = make(Expr::Kind::Attr, t.line);
      e->name = expect_name("an attribute name after '.'");
      e->args.push_back(std::move(node));
      return e;
    }
    // '[': an index or a slice start:stop:step (each part optional)
    ExprPtr parts[3];
    int n_colons = 0;
    if (!is_op(":")) parts[0] = parse_expression();
    while (n_colons < 2 && skip_op(":")) {
      ++n_colons;
      if (!is_op(":") && !is_op("]")) parts[n_colons] = parse_expression();
    }
    if (is_op(",")) fail(cur().line, "tuple subscripts (a[x, y]) are not supported by this chat-template renderer");
    expect_op("]");
    auto e = make(n_colons ? Expr::Kind::Slice : Expr::Kind::Item, t.line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(parts[0]));
    if (n_colons) {
      e->args.push_back(std::move(parts[1]));
      e->args.push_back(std::move(parts[2]));
    }
    return e;
  }

  // '(' args ')' into e->args (after the callee/input slot) and e->kwargs.
  void parse_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (is_op("*") || is_op("**"))
        fail(cur().line, "*args / **kwargs in calls are not supported by this chat-template renderer");
      if (cur().kind == K::Name && peek().kind == K::Op && peek().value == "=") {
        std::string key = next().value;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) fail(cur().line, "a positional argument follows a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::Call, cur().line);
    e->args.push_back(std::move(node));
    parse_args(*e);
    return e;
  }

  std::string dotted_name(const char* what) {
    std::string n = expect_name(what);
    while (is_op(".") && peek().kind == K::Name) {
      next();
      n += "." + next().value;
    }
    return n;
  }

  ExprPtr parse_filter(ExprPtr node) {
    const int line = next().line;  // '|'
    auto e = make(Expr::Kind::Filter, line);
    e->name = dotted_name("a filter name after '|'");
    e->filter = find_filter(e->name);
    if (!e->filter) fail(line, "unknown filter '" + e->name + "' (supported: " + filter_names() + ")");
    e->args.push_back(std::move(node));
    if (is_op("(")) parse_args(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;  // 'is'
    auto e = make(Expr::Kind::Test, line);
    e->negated = skip_name("not");
    e->name = dotted_name("a test name after 'is'");
    e->test = find_test(e->name);
    if (!e->test) fail(line, "unknown test '" + e->name + "' (supported: " + test_names() + ")");
    e->args.push_back(std::move(node));
    if (is_op("(")) {
      parse_args(*e);
    } else if ((cur().kind == K::Name || cur().kind == K::String || cur().kind == K::Int || cur().kind == K::Float ||
                is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  std::vector<Token> toks_;
  const std::string& name_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Template parse(const std::string& source, const std::string& name) {
  Template t;
  t.name = name;
  t.body = Parser(tokenize(source, name), name).parse_all();
  return t;
}

}  // namespace moesq::serve::jinja
