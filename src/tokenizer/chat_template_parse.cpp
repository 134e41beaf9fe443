// Parsing chat templates: the template is split into text and tags, and the
// tags are parsed by recursive descent into the AST of chat_template_ast.h.
#include "tokenizer/chat_template_ast.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace kvserve::chat_template_detail {

void fail(const std::string& message) { throw Error("chat template: " + message); }

namespace {

// ---- lexing the template into text and tags --------------------------------

enum class SegmentKind { kText, kOutput, kStatement };

struct Segment {
  SegmentKind kind;
  std::string text;
};

void strip_right(std::string& s, bool only_line) {
  size_t end = s.size();
  while (end > 0 && (s[end - 1] == ' ' || s[end - 1] == '\t' || (!only_line && (s[end - 1] == '\n' || s[end - 1] == '\r'))))
    --end;
  // lstrip_blocks removes the indentation only when the tag starts its line.
  if (only_line && end > 0 && s[end - 1] != '\n') return;
  s.resize(end);
}

size_t skip_left(std::string_view s, size_t pos) {
  while (pos < s.size() && std::isspace(static_cast<unsigned char>(s[pos]))) ++pos;
  return pos;
}

// Where a tag's close mark is. As Jinja's lexer, "}}" and "%}" inside a
// string literal or inside brackets ({'a': {}}, Qwen's "{{\"name\": ...}}")
// do not close the tag.
size_t find_tag_close(std::string_view src, size_t from, char kind) {
  if (kind == '#') return src.find("#}", from);
  const char mark = kind == '{' ? '}' : '%';
  int depth = 0;
  for (size_t i = from; i < src.size(); ++i) {
    const char c = src[i];
    if (c == '\'' || c == '"') {
      for (++i; i < src.size() && src[i] != c; ++i)
        if (src[i] == '\\') ++i;
      if (i >= src.size()) return std::string_view::npos;
    } else if (depth == 0 && c == mark && i + 1 < src.size() && src[i + 1] == '}') {
      return i;
    } else if (c == '{' || c == '[' || c == '(') {
      ++depth;
    } else if ((c == '}' || c == ']' || c == ')') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

std::vector<Segment> split_segments(std::string_view src) {
  std::vector<Segment> out;
  size_t pos = 0;
  bool trim_next_newline = false;
  bool strip_next = false;
  while (pos < src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    if (strip_next) text.erase(0, skip_left(text, 0));
    if (trim_next_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (open == std::string_view::npos) {
      out.push_back({SegmentKind::kText, std::move(text)});
      break;
    }
    const char kind = src[open + 1];
    const size_t close = find_tag_close(src, open + 2, kind);
    if (close == std::string_view::npos) fail("unclosed tag at offset " + std::to_string(open));
    size_t body_begin = open + 2, body_end = close;
    const bool strip_before = body_begin < close && src[body_begin] == '-';
    if (strip_before || src[body_begin] == '+') ++body_begin;
    strip_next = body_end > body_begin && src[body_end - 1] == '-';
    if (strip_next) --body_end;
    if (strip_before) strip_right(text, false);
    else if (kind != '{' && src[open + 2] != '+') strip_right(text, true);
    out.push_back({SegmentKind::kText, std::move(text)});
    if (kind != '#')
      out.push_back({kind == '{' ? SegmentKind::kOutput : SegmentKind::kStatement,
                     std::string(src.substr(body_begin, body_end - body_begin))});
    trim_next_newline = kind != '{';
    pos = close + 2;
  }
  return out;
}

// ---- expression tokens ------------------------------------------------------

enum class TokenKind { kName, kString, kNumber, kOp, kEnd };

struct Token {
  TokenKind kind;
  std::string text;
};

char unescape(char c) {
  switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    default: return c;
  }
}

size_t lex_string(std::string_view s, size_t i, std::vector<Token>& out) {
  const char quote = s[i++];
  std::string value;
  while (i < s.size() && s[i] != quote) {
    if (s[i] == '\\' && i + 1 < s.size()) ++i, value += unescape(s[i++]);
    else value += s[i++];
  }
  if (i >= s.size()) fail("unterminated string literal");
  out.push_back({TokenKind::kString, std::move(value)});
  return i + 1;
}

std::vector<Token> lex_expression(std::string_view s) {
  static const char* const kTwoCharOps[] = {"==", "!=", "<=", ">=", "//", "**"};
  std::vector<Token> out;
  size_t i = 0;
  while ((i = skip_left(s, i)) < s.size()) {
    const char c = s[i];
    if (c == '\'' || c == '"') {
      i = lex_string(s, i, out);
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({TokenKind::kName, std::string(s.substr(i, j - i))});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '.')) ++j;
      out.push_back({TokenKind::kNumber, std::string(s.substr(i, j - i))});
      i = j;
    } else {
      const std::string two(s.substr(i, 2));
      const bool is_two = std::find(std::begin(kTwoCharOps), std::end(kTwoCharOps), two) != std::end(kTwoCharOps);
      if (!is_two && std::string_view("+-*/%~|.,:()[]{}<>=").find(c) == std::string_view::npos)
        fail(std::string("unexpected character '") + c + "'");
      out.push_back({TokenKind::kOp, is_two ? two : std::string(1, c)});
      i += is_two ? 2 : 1;
    }
  }
  out.push_back({TokenKind::kEnd, ""});
  return out;
}

ExprPtr make_expr(Expr::Kind kind, std::string name = {}) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->name = std::move(name);
  return e;
}

// Sets e's depth once its arguments are in place. Evaluating (and freeing) an
// expression recurses as deep as its tree, and chains such as a + b + c grow
// the tree without nesting in the source, so the tree itself is bounded.
ExprPtr finished(ExprPtr e) {
  for (const ExprPtr& arg : e->args)
    if (arg) e->depth = std::max(e->depth, arg->depth + 1);
  if (e->depth > kMaxExpressionDepth)
    fail("an expression nests more than " + std::to_string(kMaxExpressionDepth) +
         " operations deep; split it with {% set %}");
  return e;
}

json number_literal(const std::string& text) {
  if (std::count(text.begin(), text.end(), '.') > 1) fail("malformed number '" + text + "'");
  if (text.find('.') != std::string::npos) {
    errno = 0;
    const double value = std::strtod(text.c_str(), nullptr);
    if (errno == ERANGE || !std::isfinite(value)) fail("number " + text + " is out of range");
    return value;
  }
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size())
    fail("integer " + text + " is out of range (at most " + std::to_string(INT64_MAX) + ")");
  return value;
}

// Counts the parser's recursion while it lives: nested brackets and prefix
// operators recurse without growing the tree (a parenthesis adds no node).
class DepthGuard {
 public:
  DepthGuard(int& depth, int limit, const char* what) : depth_(depth) {
    if (++depth_ > limit) fail(std::string(what) + " nest more than " + std::to_string(limit) + " levels deep");
  }
  ~DepthGuard() { --depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int& depth_;
};

// ---- parsing expressions ----------------------------------------------------

class ExprParser {
 public:
  explicit ExprParser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  ExprPtr parse_expression() {
    const DepthGuard guard(depth_, kMaxExpressionDepth, "expressions");
    ExprPtr value = parse_or();
    if (!peek_name("if")) return value;
    ++pos_;
    auto e = make_expr(Expr::Kind::kIf);
    e->args.push_back(parse_or());
    e->args.push_back(std::move(value));
    if (peek_name("else")) ++pos_, e->args.push_back(parse_expression());
    else e->args.push_back(nullptr);
    return finished(std::move(e));
  }
  ExprPtr parse_or_expression() { return parse_or(); }  // for `for x in xs if cond`, where `if` is not a ternary

  bool peek_name(std::string_view name) const { return tok().kind == TokenKind::kName && tok().text == name; }
  bool peek_op(std::string_view op) const { return tok().kind == TokenKind::kOp && tok().text == op; }
  bool at_end() const { return tok().kind == TokenKind::kEnd; }
  std::string take_name() {
    if (tok().kind != TokenKind::kName) fail("expected a name, found '" + tok().text + "'");
    return tokens_[pos_++].text;
  }
  void expect_op(std::string_view op) {
    if (!peek_op(op)) fail("expected '" + std::string(op) + "', found '" + tok().text + "'");
    ++pos_;
  }
  void expect_name(std::string_view name) {
    if (!peek_name(name)) fail("expected '" + std::string(name) + "', found '" + tok().text + "'");
    ++pos_;
  }
  void expect_end() {
    if (!at_end()) fail("unexpected '" + tok().text + "'");
  }

 private:
  const Token& tok() const { return tokens_[pos_]; }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right) {
    auto e = make_expr(Expr::Kind::kBinary, std::move(op));
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return finished(std::move(e));
  }
  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (peek_name("or")) ++pos_, left = binary("or", std::move(left), parse_and());
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (peek_name("and")) ++pos_, left = binary("and", std::move(left), parse_not());
    return left;
  }
  ExprPtr parse_not() {
    if (!peek_name("not")) return parse_compare();
    ++pos_;
    const DepthGuard guard(depth_, kMaxExpressionDepth, "expressions");
    auto e = make_expr(Expr::Kind::kNot);
    e->args.push_back(parse_not());
    return finished(std::move(e));
  }
  ExprPtr parse_compare() {
    static const char* const kOps[] = {"==", "!=", "<", ">", "<=", ">="};
    ExprPtr left = parse_sum();
    for (;;) {
      if (tok().kind == TokenKind::kOp && std::find(std::begin(kOps), std::end(kOps), tok().text) != std::end(kOps)) {
        std::string op = tokens_[pos_++].text;
        left = binary(std::move(op), std::move(left), parse_sum());
      } else if (peek_name("in")) {
        ++pos_;
        left = binary("in", std::move(left), parse_sum());
      } else if (peek_name("not") && tokens_[pos_ + 1].text == "in") {
        pos_ += 2;
        auto e = make_expr(Expr::Kind::kNot);
        e->args.push_back(binary("in", std::move(left), parse_sum()));
        left = finished(std::move(e));
      } else {
        return left;
      }
    }
  }
  ExprPtr parse_sum() {
    ExprPtr left = parse_concat();
    while (peek_op("+") || peek_op("-")) {
      std::string op = tokens_[pos_++].text;
      left = binary(std::move(op), std::move(left), parse_concat());
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_product();
    while (peek_op("~")) ++pos_, left = binary("~", std::move(left), parse_product());
    return left;
  }
  ExprPtr parse_product() {
    ExprPtr left = parse_unary();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      std::string op = tokens_[pos_++].text;
      left = binary(std::move(op), std::move(left), parse_unary());
    }
    return left;
  }
  ExprPtr parse_unary() {
    if (peek_op("-")) {
      ++pos_;
      const DepthGuard guard(depth_, kMaxExpressionDepth, "expressions");
      auto e = make_expr(Expr::Kind::kNeg);
      e->args.push_back(parse_unary());
      return finished(std::move(e));
    }
    return parse_filters(parse_postfix(parse_primary()));
  }
  ExprPtr parse_filters(ExprPtr subject) {
    for (;;) {
      if (peek_op("|")) {
        ++pos_;
        auto e = make_expr(Expr::Kind::kFilter, take_name());
        e->args.push_back(std::move(subject));
        if (peek_op("(")) parse_call_args(*e);
        subject = finished(std::move(e));
      } else if (peek_name("is")) {
        ++pos_;
        const bool negated = peek_name("not");
        if (negated) ++pos_;
        auto e = make_expr(Expr::Kind::kTest, take_name());
        e->args.push_back(std::move(subject));
        if (peek_op("(")) parse_call_args(*e);
        subject = finished(std::move(e));
        if (negated) {
          auto n = make_expr(Expr::Kind::kNot);
          n->args.push_back(std::move(subject));
          subject = finished(std::move(n));
        }
      } else {
        return subject;
      }
    }
  }
  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!peek_op(")")) {
      std::string keyword;
      if (tok().kind == TokenKind::kName && tokens_[pos_ + 1].text == "=") keyword = take_name(), ++pos_;
      call.keywords.push_back(std::move(keyword));
      call.args.push_back(parse_expression());
      if (!peek_op(")")) expect_op(",");
    }
    ++pos_;
  }
  ExprPtr parse_postfix(ExprPtr subject) {
    for (;;) {
      if (peek_op(".")) {
        ++pos_;
        auto e = make_expr(Expr::Kind::kAttr, take_name());
        e->args.push_back(std::move(subject));
        subject = finished(std::move(e));
      } else if (peek_op("[")) {
        ++pos_;
        subject = parse_subscript(std::move(subject));
      } else if (peek_op("(")) {
        auto e = make_expr(Expr::Kind::kCall);
        e->args.push_back(std::move(subject));
        parse_call_args(*e);
        subject = finished(std::move(e));
      } else {
        return subject;
      }
    }
  }
  ExprPtr parse_subscript(ExprPtr subject) {
    ExprPtr first = peek_op(":") ? nullptr : parse_expression();
    if (peek_op("]")) {
      ++pos_;
      auto e = make_expr(Expr::Kind::kIndex);
      e->args.push_back(std::move(subject));
      e->args.push_back(std::move(first));
      return finished(std::move(e));
    }
    auto e = make_expr(Expr::Kind::kSlice);
    e->args.push_back(std::move(subject));
    e->args.push_back(std::move(first));
    for (int part = 0; part < 2; ++part) {  // stop, then step
      if (peek_op(":")) {
        ++pos_;
        e->args.push_back(peek_op(":") || peek_op("]") ? nullptr : parse_expression());
      } else {
        e->args.push_back(nullptr);
      }
    }
    expect_op("]");
    return finished(std::move(e));
  }
  ExprPtr parse_sequence(Expr::Kind kind, std::string_view close) {
    auto e = make_expr(kind);
    while (!peek_op(close)) {
      e->args.push_back(parse_expression());
      if (kind == Expr::Kind::kDict) expect_op(":"), e->args.push_back(parse_expression());
      if (!peek_op(close)) expect_op(",");
    }
    ++pos_;
    return finished(std::move(e));
  }
  ExprPtr literal(json value) {
    auto e = make_expr(Expr::Kind::kLiteral);
    e->value = std::move(value);
    return e;
  }
  ExprPtr parse_primary() {
    const Token t = tok();
    ++pos_;
    switch (t.kind) {
      case TokenKind::kString: return literal(t.text);
      case TokenKind::kNumber: return literal(number_literal(t.text));
      case TokenKind::kName:
        if (t.text == "true" || t.text == "True") return literal(true);
        if (t.text == "false" || t.text == "False") return literal(false);
        if (t.text == "none" || t.text == "None") return literal(nullptr);
        return make_expr(Expr::Kind::kName, t.text);
      case TokenKind::kOp:
        if (t.text == "(") {
          ExprPtr inner = parse_expression();
          expect_op(")");
          return inner;
        }
        if (t.text == "[") return parse_sequence(Expr::Kind::kList, "]");
        if (t.text == "{") return parse_sequence(Expr::Kind::kDict, "}");
        break;
      case TokenKind::kEnd: fail("unexpected end of expression");
    }
    fail("unexpected '" + t.text + "'");
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;  // parse_expression / prefix operators now active
};

// ---- parsing statements -----------------------------------------------------

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  std::vector<Node> parse_all() {
    std::vector<Node> nodes;
    const std::string end = parse_block(nodes, {});
    if (!end.empty()) fail("unexpected {% " + end + " %}");
    return nodes;
  }

 private:
  // Appends nodes until a statement whose keyword is in `ends` (returned, with
  // its parser positioned after the keyword), or the end of the template ("").
  std::string parse_block(std::vector<Node>& nodes, std::initializer_list<std::string_view> ends) {
    while (pos_ < segments_.size()) {
      const Segment& s = segments_[pos_++];
      if (s.kind == SegmentKind::kText) {
        if (!s.text.empty()) nodes.push_back(Node{Node::Kind::kText, s.text, {}, nullptr, {}, {}});
        continue;
      }
      ExprParser p(lex_expression(s.text));
      if (s.kind == SegmentKind::kOutput) {
        Node n{Node::Kind::kOutput, {}, {}, p.parse_expression(), {}, {}};
        p.expect_end();
        nodes.push_back(std::move(n));
        continue;
      }
      std::string keyword = p.take_name();
      if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
        current_ = std::make_unique<ExprParser>(std::move(p));
        return keyword;
      }
      nodes.push_back(parse_statement(keyword, p));
    }
    if (ends.size() != 0) fail("missing {% " + std::string(*ends.begin()) + " %}");
    return {};
  }

  Node parse_statement(const std::string& keyword, ExprParser& p) {
    const DepthGuard guard(depth_, kMaxBlockDepth, "{% if %} and {% for %} blocks");
    if (keyword == "if") return parse_if(p);
    if (keyword == "for") return parse_for(p);
    if (keyword == "set") return parse_set(p);
    fail("unsupported statement '" + keyword + "'");
  }

  Node parse_if(ExprParser& p) {
    Node n{Node::Kind::kIf, {}, {}, nullptr, {}, {}};
    n.conditions.push_back(p.parse_expression());
    p.expect_end();
    for (;;) {
      n.bodies.emplace_back();
      const std::string end = parse_block(n.bodies.back(), {"endif", "elif", "else"});
      if (end == "endif") break;
      if (end == "elif") n.conditions.push_back(current_->parse_expression());
      current_->expect_end();
      if (end == "else") {
        n.bodies.emplace_back();
        parse_block(n.bodies.back(), {"endif"});
        break;
      }
    }
    current_->expect_end();
    return n;
  }

  Node parse_for(ExprParser& p) {
    Node n{Node::Kind::kFor, {}, {p.take_name()}, nullptr, {}, {}};
    while (p.peek_op(",")) p.expect_op(","), n.names.push_back(p.take_name());
    p.expect_name("in");
    n.expr = p.parse_or_expression();
    n.conditions.push_back(nullptr);
    if (p.peek_name("if")) p.expect_name("if"), n.conditions[0] = p.parse_expression();
    p.expect_end();
    n.bodies.resize(2);
    if (parse_block(n.bodies[0], {"endfor", "else"}) == "else") {
      current_->expect_end();
      parse_block(n.bodies[1], {"endfor"});
    }
    current_->expect_end();
    return n;
  }

  Node parse_set(ExprParser& p) {
    Node n{Node::Kind::kSet, {}, {p.take_name()}, nullptr, {}, {}};
    if (p.peek_op(".")) p.expect_op("."), n.names.push_back(p.take_name());
    p.expect_op("=");
    n.expr = p.parse_expression();
    p.expect_end();
    return n;
  }

  std::vector<Segment> segments_;
  size_t pos_ = 0;
  std::unique_ptr<ExprParser> current_;  // the statement that ended the last block
  int depth_ = 0;                        // blocks now open
};

}  // namespace

std::vector<Node> parse_template(std::string_view source) { return TemplateParser(split_segments(source)).parse_all(); }

}  // namespace kvserve::chat_template_detail
