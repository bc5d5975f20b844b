// The `.cf` parser: a hand-written lexer and a recursive-descent parser that builds the Graph through the
// builder, so shape/dtype inference (and its GraphErrors) is the single source of truth.
//
//   file      := { statement? comment? NEWLINE }
//   statement := 'input' NAME ':' DTYPE '[' [INT {',' INT}] ']'
//              | NAME '=' expr
//              | 'output' NAME {',' NAME}
//   expr      := NAME | NUMBER | OP '(' [arg {',' arg}] ')'
//   arg       := expr | KEY '=' attr
//   attr      := NUMBER | "string" | true | false | DTYPE | '[' [INT {',' INT}] ']'
//
// `input` / `output` are keywords only at the start of a line and when not followed by '=', so they stay
// usable as value names. Every error is a ParseError "file:line:col: error: ..." at the offending token.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <deque>
#include <fstream>
#include <optional>
#include <set>
#include <unordered_set>
#include <sstream>
#include <string_view>

#include "comfuse/text.h"
#include "comfuse/files.h"

namespace comfuse {

ParseError::ParseError(const std::string& file_, int line_, int col_, const std::string& msg)
    : std::runtime_error(file_ + ":" + std::to_string(line_) + ":" + std::to_string(col_) + ": error: " + msg),
      file(file_),
      line(line_),
      col(col_),
      message(msg) {}

namespace {

// ---------------------------------------------------------------------------------------------------------
// Lexer

enum class Tok { Ident, Number, String, LParen, RParen, LBracket, RBracket, Comma, Colon, Equals, Question, Newline, End };

struct Token {
  Tok kind = Tok::End;
  std::string text;  // identifier / number spelling / string contents (without quotes)
  int line = 0, col = 0;
};

bool is_ident_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c) || c == '.'; }

// [+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?  -- decimal only: no hex, nan or inf.
bool is_decimal(std::string_view s) {
  size_t i = 0, n = s.size();
  if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
  size_t int_digits = 0, frac_digits = 0;
  while (i < n && is_digit(s[i])) ++i, ++int_digits;
  if (i < n && s[i] == '.') {
    ++i;
    while (i < n && is_digit(s[i])) ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < n && is_digit(s[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  return i == n;
}

bool is_integer(std::string_view s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (!is_digit(s[i])) return false;
  return true;
}

std::string bad_literal(const std::string& text) {
  return "bad literal '" + text + "': expected a decimal number like 0.5 or 1e-5";
}

std::string char_desc(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  static const char* hex = "0123456789abcdef";
  return std::string("'\\x") + hex[u >> 4] + hex[u & 15] + "'";
}

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& file) : s_(src), file_(file) {}

  Token next() {
    for (;;) {  // skip blanks and comments (a comment runs to the end of the line)
      if (i_ >= s_.size()) return tok(Tok::End, "", col_of(i_));
      char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
    size_t start = i_;
    int col = col_of(start);
    char c = s_[i_];
    if (c == '\n') {
      Token t = tok(Tok::Newline, "", col);
      ++i_;
      ++line_;
      line_start_ = i_;
      return t;
    }
    if (is_ident_start(c)) {
      while (i_ < s_.size() && is_ident_char(s_[i_])) ++i_;
      return tok(Tok::Ident, std::string(s_.substr(start, i_ - start)), col);
    }
    char c1 = i_ + 1 < s_.size() ? s_[i_ + 1] : '\0';
    bool sign = c == '-' || c == '+';
    if (is_digit(c) || (c == '.' && is_digit(c1)) || (sign && (is_digit(c1) || c1 == '.' || is_ident_start(c1))))
      return number(start, col);
    if (c == '"') {
      size_t j = i_ + 1;
      while (j < s_.size() && s_[j] != '"' && s_[j] != '\n') ++j;
      if (j >= s_.size() || s_[j] != '"')
        fail(col, "unterminated string: expected a closing '\"' before the end of the line");
      i_ = j + 1;
      return tok(Tok::String, std::string(s_.substr(start + 1, j - start - 1)), col);
    }
    ++i_;
    switch (c) {
      case '(': return tok(Tok::LParen, "(", col);
      case ')': return tok(Tok::RParen, ")", col);
      case '[': return tok(Tok::LBracket, "[", col);
      case ']': return tok(Tok::RBracket, "]", col);
      case ',': return tok(Tok::Comma, ",", col);
      case ':': return tok(Tok::Colon, ":", col);
      case '=': return tok(Tok::Equals, "=", col);
      case '?': return tok(Tok::Question, "?", col);  // the symbolic leading dim: bf16[?, 1024]
      default: break;
    }
    std::string msg = "unexpected character " + char_desc(c);
    if (c == '+' || c == '-' || c == '*' || c == '/')
      msg += ": arithmetic is written as calls, e.g. add(a, b), sub(a, b), mul(a, b), div(a, b)";
    fail(col, msg);
  }

 private:
  // A number runs over every identifier character (so `1.2.3`, `0x10` and `1e` come out whole and are
  // rejected whole), plus a sign right after the exponent's e.
  Token number(size_t start, int col) {
    ++i_;
    while (i_ < s_.size()) {
      char c = s_[i_];
      bool exp_sign = (c == '+' || c == '-') && (s_[i_ - 1] == 'e' || s_[i_ - 1] == 'E') && i_ >= start + 2 &&
                      (is_digit(s_[i_ - 2]) || s_[i_ - 2] == '.');
      if (!is_ident_char(c) && !exp_sign) break;
      ++i_;
    }
    std::string text(s_.substr(start, i_ - start));
    if (!is_decimal(text)) {
      std::string msg = bad_literal(text);
      std::string body = text.substr(1);
      bool negated_name = text[0] == '-' && !body.empty() && is_ident_start(body[0]);
      std::string low = body;
      for (auto& ch : low) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (negated_name && low != "inf" && low != "infinity" && low != "nan") msg += " (to negate a value write neg(" + body + "))";
      fail(col, msg);
    }
    return tok(Tok::Number, text, col);
  }

  Token tok(Tok k, std::string text, int col) const { return Token{k, std::move(text), line_, col}; }
  int col_of(size_t pos) const { return static_cast<int>(pos - line_start_) + 1; }
  [[noreturn]] void fail(int col, const std::string& msg) const { throw ParseError(file_, line_, col, msg); }

  std::string_view s_;
  const std::string& file_;
  size_t i_ = 0, line_start_ = 0;
  int line_ = 1;
};

// ---------------------------------------------------------------------------------------------------------
// The op vocabulary of the text format: arity, keyword attributes and a usage line for messages.

struct OpSpec {
  std::string_view name;
  int min_args, max_args;
  std::vector<std::string_view> attrs;
  std::string_view usage;
};

const std::vector<OpSpec>& op_table() {
  static const std::vector<OpSpec> t = [] {
    std::vector<OpSpec> v;
    for (auto u : {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "silu", "square",
                   "reciprocal"})
      v.push_back({u, 1, 1, {}, ""});
    v.push_back({"gelu", 1, 1, {"approximate"}, "gelu(x) or gelu(x, approximate=\"tanh\")"});
    v.push_back({"cast", 1, 1, {"dtype"}, "cast(x, dtype=bf16)"});
    v.push_back({"relabel", 1, 1, {"dtype"}, "relabel(x, dtype=bf16)"});
    for (auto b : {"add", "sub", "mul", "div"}) v.push_back({b, 2, 2, {}, ""});
    v.push_back({"max", 1, 2, {"dim", "keepdim"}, "max(a, b) elementwise or max(x, dim=-1, keepdim=true)"});
    v.push_back({"min", 1, 2, {"dim", "keepdim"}, "min(a, b) elementwise or min(x, dim=-1, keepdim=true)"});
    v.push_back({"pow", 1, 2, {"exponent"}, "pow(x, 2.0)"});
    v.push_back({"sum", 1, 1, {"dim", "keepdim"}, "sum(x, dim=-1, keepdim=true)"});
    v.push_back({"mean", 1, 1, {"dim", "keepdim"}, "mean(x, dim=-1, keepdim=true)"});
    v.push_back({"matmul", 2, 2, {"transpose_a", "transpose_b"}, "matmul(a, b, transpose_b=true)"});
    v.push_back({"transpose", 1, 1, {"perm"}, "transpose(x) or transpose(x, perm=[0, 2, 1])"});
    v.push_back({"reshape", 1, 1, {"shape"}, "reshape(x, shape=[8, -1])"});
    v.push_back({"rotate_half", 1, 1, {}, "rotate_half(x): cat(-x[..., D/2:], x[..., :D/2]) over the last dim D"});
    v.push_back({"layer_norm", 1, 3, {"eps"}, "layer_norm(x, weight, bias, eps=1e-5)"});
    v.push_back({"rms_norm", 1, 2, {"eps"}, "rms_norm(x, weight, eps=1e-6)"});
    v.push_back({"softmax", 1, 1, {"dim"}, "softmax(x, dim=-1)"});
    v.push_back({"log_softmax", 1, 1, {"dim"}, "log_softmax(x, dim=-1)"});
    v.push_back({"var", 1, 1, {"dim", "correction", "keepdim"}, "var(x, dim=-1, correction=0, keepdim=true)"});
    return v;
  }();
  return t;
}

const OpSpec* find_op(std::string_view name) {
  for (const auto& s : op_table())
    if (s.name == name) return &s;
  return nullptr;
}

// Optimal string alignment distance (a transposition costs 1), for "did you mean" hints.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The closest candidate if it is close enough to be a likely typo, else "".
std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.size() < 2 || word.size() > 64) return "";  // one letter is close to everything; 64+ is garbage
  size_t limit = word.size() <= 4 ? 1 : 2, best = limit + 1;
  std::string pick;
  for (const auto& c : candidates) {
    if (c.size() > 64) continue;
    size_t d = edit_distance(word, c);
    if (d < best) best = d, pick = c;
  }
  return pick;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  std::string c = closest(word, candidates);
  return c.empty() ? "" : "; did you mean '" + c + "'?";
}

// ---------------------------------------------------------------------------------------------------------
// Parser

struct Operand {  // a positional argument: a value, or a number literal not yet made into a constant node
  Token tok;
  bool literal = false;
  double number = 0.0;
  Value value;
};

struct Attr {  // a keyword argument, checked against what its op expects when the op is built
  Token key, val;
  enum Kind { Number, String, Word, List } kind = Number;
  std::vector<int64_t> list;
};

constexpr int kMaxDepth = 200;                        // nested calls; deeper input is rejected, not overflowed

class Parser {
 public:
  Parser(const std::string& text, const std::string& file) : file_(file), lex_(text, file_) {
    // Generated names must not collide with a name the file defines later, so collect every word first.
    for (size_t i = 0; i < text.size();) {
      if (is_ident_start(text[i])) {
        size_t j = i;
        while (j < text.size() && is_ident_char(text[j])) ++j;
        words_.insert(text.substr(i, j - i));
        i = j;
      } else {
        ++i;
      }
    }
    last_line_ = 1 + static_cast<int>(std::count(text.begin(), text.end(), '\n'));
    if (!text.empty() && text.back() == '\n') --last_line_;
    last_line_ = std::max(last_line_, 1);
  }

  Graph run() {
    for (;;) {
      const Token& t = peek();
      if (t.kind == Tok::End) break;
      if (t.kind == Tok::Newline) {
        take();
        continue;
      }
      statement();
    }
    if (!saw_output_) fail(last_line_, 1, "no output statement: name at least one output, e.g. `output y`");
    return std::move(g_);
  }

 private:
  // ---- token stream ----
  const Token& peek(size_t k = 0) {
    while (buf_.size() <= k) buf_.push_back(lex_.next());
    return buf_[k];
  }
  Token take() {
    Token t = peek();
    buf_.pop_front();
    return t;
  }
  Token expect(Tok kind, const std::string& what) {
    if (peek().kind != kind) fail(peek(), "expected " + what + ", got " + describe(peek()));
    return take();
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::Newline: return "end of line";
      case Tok::End: return "end of file";
      case Tok::String: return "string \"" + t.text + "\"";
      default: return "'" + t.text + "'";
    }
  }

  [[noreturn]] void fail(int line, int col, const std::string& msg) const { throw ParseError(file_, line, col, msg); }
  [[noreturn]] void fail(const Token& t, const std::string& msg) const { fail(t.line, t.col, msg); }

  // ---- statements ----
  void statement() {
    const Token& first = peek();
    if (first.kind != Tok::Ident)
      fail(first, "expected a statement (`input NAME : DTYPE[dims]`, `NAME = EXPR` or `output NAME`), got " +
                      describe(first));
    bool keyword = peek(1).kind != Tok::Equals;
    if (keyword && first.text == "input") {
      input_decl();
    } else if (keyword && first.text == "output") {
      output_stmt();
    } else {
      assignment();
    }
    end_of_statement();
  }

  void end_of_statement() {
    const Token& t = peek();
    if (t.kind == Tok::Newline || t.kind == Tok::End) return;
    fail(t, "unexpected " + describe(t) + " after the end of the statement: expected end of line");
  }

  void check_new_name(const Token& name) {
    if (auto id = g_.find(name.text)) {
      const Node& n = g_.node(*id);
      fail(name, "duplicate name '" + name.text + "': already defined" +
                     (n.loc.line > 0 ? " at line " + std::to_string(n.loc.line) : ""));
    }
  }

  void input_decl() {
    take();  // 'input'
    Token name = expect(Tok::Ident, "an input name after 'input'");
    check_new_name(name);
    expect(Tok::Colon, "':' after the input name (`input " + name.text + " : bf16[M, K]`)");
    Token dt = expect(Tok::Ident, "a dtype (bf16, f16 or f32)");
    auto dtype = parse_dtype(dt.text);
    if (!dtype) fail(dt, "unknown dtype '" + dt.text + "': expected bf16, f16 or f32");
    expect(Tok::LBracket, "'[' and the shape after the dtype (`[]` for a scalar)");
    Shape shape = int_list(/*positive_dims=*/true);
    bool constant = false;   // `input W : bf16[K, N] const`: the same values on every run
    if (peek().kind == Tok::Ident && peek().text == "const") {
      take();
      constant = true;
    }
    build(name, [&] { return g_.input(name.text, *dtype, shape, constant); });
  }

  void output_stmt() {
    take();  // 'output'
    for (;;) {
      Token name = expect(Tok::Ident, "a name to output");
      auto id = g_.find(name.text);
      if (!id) undefined(name);
      build(name, [&] {
        g_.output(Value{*id});
        return Value{*id};
      });
      saw_output_ = true;
      if (peek().kind != Tok::Comma) break;
      take();
    }
    const Token& t = peek();
    if (t.kind == Tok::Ident) fail(t, "expected ',' between output names, got " + describe(t));
  }

  void assignment() {
    Token name = take();
    check_new_name(name);
    if (peek().kind != Tok::Equals)
      fail(peek(), "expected '=' after '" + name.text + "' (statements are `NAME = EXPR`), got " + describe(peek()) +
                       did_you_mean(name.text, {"input", "output"}));
    take();
    const Token& t = peek();
    if (t.kind == Tok::Number) {  // a named constant
      Token num = take();
      double v = to_double(num);
      build(num, [&] { return g_.constant(v, name.text); });
    } else if (t.kind == Tok::Ident && peek(1).kind == Tok::LParen) {
      call(name.text);
    } else if (t.kind == Tok::Ident) {
      Token ref = take();
      if (!g_.find(ref.text)) undefined(ref);
      fail(ref, "'" + name.text + " = " + ref.text +
                    "' only renames a value: a statement must compute something (there is no identity op)");
    } else {
      fail(t, "expected an expression after '=' (a name, a number or op(...)), got " + describe(t));
    }
  }

  // ---- expressions ----
  [[noreturn]] void undefined(const Token& name) {
    std::string low = name.text;
    for (auto& ch : low) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (low == "nan" || low == "inf" || low == "infinity") fail(name, bad_literal(name.text));
    if (find_op(name.text))
      fail(name, "undefined name '" + name.text + "' ('" + name.text + "' is an op: call it, e.g. " + name.text + "(x))");
    std::vector<std::string> names;
    for (const auto& n : g_.nodes)
      if (n.op != OpKind::Constant || n.name.empty() || n.name[0] != '_') names.push_back(n.name);
    fail(name, "undefined name '" + name.text + "'" + did_you_mean(name.text, names));
  }

  Operand operand() {
    const Token& t = peek();
    Operand o;
    o.tok = t;
    if (t.kind == Tok::Number) {
      o.literal = true;
      o.number = to_double(take());
    } else if (t.kind == Tok::Ident && peek(1).kind == Tok::LParen) {
      o.value = call("");  // the name is generated once the node is built
    } else if (t.kind == Tok::Ident) {
      Token name = take();
      auto id = g_.find(name.text);
      if (!id) undefined(name);
      o.value = Value{*id};
    } else {
      fail(t, "expected an operand (a name, a number or op(...)), got " + describe(t));
    }
    return o;
  }

  Attr attr_value(const Token& key) {
    Attr a;
    a.key = key;
    a.val = peek();
    switch (a.val.kind) {
      case Tok::Number: a.kind = Attr::Number; take(); break;
      case Tok::String: a.kind = Attr::String; take(); break;
      case Tok::Ident: a.kind = Attr::Word; take(); break;
      case Tok::LBracket:
        a.kind = Attr::List;
        take();
        a.list = int_list(/*positive_dims=*/false);
        break;
      default:
        fail(a.val, "expected a value for '" + key.text + "' (a number, a \"string\", true, false, a dtype or [ints]), got " +
                        describe(a.val));
    }
    return a;
  }

  // After '[': integers separated by ',' up to ']'. Input dims must be positive; perm and reshape lists are
  // checked by the builder (perm holds 0, reshape may hold one -1).
  std::vector<int64_t> int_list(bool positive_dims) {
    std::vector<int64_t> v;
    if (peek().kind == Tok::RBracket) {
      take();
      return v;
    }
    int64_t prod = 1;
    for (;;) {
      Token t = peek();
      if (t.kind == Tok::Question) {  // '?': the symbolic leading dim; the builder says where it may stand
        take();
        v.push_back(kDynamic);
        Token sep = take();
        if (sep.kind == Tok::RBracket) break;
        if (sep.kind != Tok::Comma) fail(sep, "expected ',' or ']' in the list, got " + describe(sep));
        continue;
      }
      if (t.kind != Tok::Number) fail(t, "expected an integer or '?', got " + describe(t));
      take();
      int64_t x = to_int(t);
      if (positive_dims && x <= 0) fail(t, "dims must be positive, got " + t.text);
      if (x > 0) {
        if (prod > kMaxElements / x) fail(t, "shape too large: more than 2^60 elements");
        prod *= x;
      }
      v.push_back(x);
      Token sep = take();
      if (sep.kind == Tok::RBracket) break;
      if (sep.kind != Tok::Comma) fail(sep, "expected ',' or ']' in the list, got " + describe(sep));
    }
    return v;
  }

  double to_double(const Token& t) const {
    std::string_view s = t.text;
    if (!s.empty() && s[0] == '+') s.remove_prefix(1);  // from_chars takes no '+'
    double v = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(v))
      fail(t, "bad literal '" + t.text + "': out of the range of a double");
    return v;
  }

  int64_t to_int(const Token& t) const {
    if (!is_integer(t.text)) fail(t, "expected an integer, got '" + t.text + "'");
    std::string_view s = t.text;
    if (s[0] == '+') s.remove_prefix(1);
    int64_t v = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) fail(t, "integer '" + t.text + "' is out of range");
    return v;
  }

  // `_1`, `_2`, ... for nested calls and `_c1`, ... for literals, skipping every word the file uses.
  std::string fresh_name(const char* prefix, int& counter) {
    for (;;) {
      std::string n = prefix;  // (not prefix + to_string: GCC 12 warns falsely about that)
      n += std::to_string(++counter);
      if (!words_.count(n) && !g_.find(n)) return n;
    }
  }

  // Runs one builder call with the location of `at` stamped on the new nodes; a GraphError becomes a
  // ParseError at `at`.
  template <class F>
  Value build(const Token& at, F&& f) {
    g_.set_loc(SourceLoc{at.line, at.col});
    try {
      return f();
    } catch (const GraphError& e) {
      fail(at, e.what());
    }
  }

  // OP '(' args ')' -- the op token is current. Builds the node named `name`.
  Value call(const std::string& name) {
    Token op = take();
    const OpSpec* spec = find_op(op.text);
    if (!spec) {
      std::vector<std::string> ops;
      for (const auto& s : op_table()) ops.emplace_back(s.name);
      std::string msg = "unknown op '" + op.text + "'" + did_you_mean(op.text, ops);
      if (g_.find(op.text)) msg += " ('" + op.text + "' is a value, not an op)";
      fail(op, msg);
    }
    if (++depth_ > kMaxDepth) fail(op, "expression nested too deeply (more than " + std::to_string(kMaxDepth) + " calls)");
    take();  // '('
    std::vector<Operand> args;
    std::vector<Attr> attrs;
    if (peek().kind == Tok::RParen) {
      take();
    } else {
      for (;;) {
        if (peek().kind == Tok::Ident && peek(1).kind == Tok::Equals) {
          Token key = take();
          take();  // '='
          if (std::find(spec->attrs.begin(), spec->attrs.end(), key.text) == spec->attrs.end()) {
            std::string msg = "unknown attribute '" + key.text + "' for " + op.text;
            if (spec->attrs.empty()) {
              msg += ": it takes none";
            } else {
              std::vector<std::string> known(spec->attrs.begin(), spec->attrs.end());
              msg += ": expected ";
              for (size_t i = 0; i < known.size(); ++i) msg += (i ? ", " : "") + known[i];
              msg += did_you_mean(key.text, known);
            }
            fail(key, msg);
          }
          for (const auto& a : attrs)
            if (a.key.text == key.text) fail(key, "attribute '" + key.text + "' given twice");
          attrs.push_back(attr_value(key));
        } else {
          if (!attrs.empty()) fail(peek(), "positional operand after a keyword attribute: put operands first");
          args.push_back(operand());
        }
        Token sep = take();
        if (sep.kind == Tok::RParen) break;
        if (sep.kind != Tok::Comma)
          fail(sep, "expected ',' or ')' after an argument of " + op.text + ", got " + describe(sep));
      }
    }
    --depth_;
    return build_op(*spec, op, args, attrs, name);
  }

  // ---- attribute accessors: each checks the kind of value its attribute needs ----
  const Attr* find_attr(const std::vector<Attr>& attrs, std::string_view key) {
    for (const auto& a : attrs)
      if (a.key.text == key) return &a;
    return nullptr;
  }
  [[noreturn]] void bad_attr(const Attr& a, const std::string& want) {
    std::string got = a.kind == Attr::List ? "a list" : describe(a.val);
    fail(a.val, "'" + a.key.text + "' must be " + want + ", got " + got);
  }
  int64_t attr_int(const Attr& a) {
    if (a.kind != Attr::Number || !is_integer(a.val.text)) bad_attr(a, "an integer");
    return to_int(a.val);
  }
  int attr_dim(const Attr* a, int dflt) {
    if (!a) return dflt;
    int64_t v = attr_int(*a);
    if (v < -1024 || v > 1024) fail(a->val, "dim=" + a->val.text + " is out of range");
    return static_cast<int>(v);
  }
  bool attr_bool(const Attr* a, bool dflt) {
    if (!a) return dflt;
    if (a->kind == Attr::Word && a->val.text == "true") return true;
    if (a->kind == Attr::Word && a->val.text == "false") return false;
    bad_attr(*a, "true or false");
  }
  double attr_double(const Attr* a, double dflt) {
    if (!a) return dflt;
    if (a->kind == Attr::Word) {
      std::string low = a->val.text;
      for (auto& ch : low) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (low == "nan" || low == "inf" || low == "infinity") fail(a->val, bad_literal(a->val.text));
    }
    if (a->kind != Attr::Number) bad_attr(*a, "a number");
    return to_double(a->val);
  }

  Value materialize(const Operand& o, const Token& op) {
    if (!o.literal) return o.value;
    return build(op, [&] { return g_.constant(o.number, fresh_name("_c", fresh_const_)); });
  }

  Value build_op(const OpSpec& spec, const Token& op, const std::vector<Operand>& args, const std::vector<Attr>& attrs,
                 const std::string& given_name) {
    int n = static_cast<int>(args.size());
    if (n < spec.min_args || n > spec.max_args) {
      std::string want = spec.min_args == spec.max_args
                             ? std::to_string(spec.min_args)
                             : std::to_string(spec.min_args) + " to " + std::to_string(spec.max_args);
      std::string usage = spec.usage.empty() ? std::string(spec.name) + (spec.min_args == 1 ? "(x)" : "(a, b)")
                                             : std::string(spec.usage);
      fail(op, "wrong number of operands: " + op.text + " takes " + want + ", got " + std::to_string(n) + " (" + usage + ")");
    }
    const std::string& o = op.text;
    // Literal operands become constant nodes first, then the node gets its name, so generated names count
    // up in creation order (_1 = matmul, _2 = add(_1, ...)). pow's exponent is an attribute, not a node.
    std::vector<Value> vals;
    for (int i = 0; i < n; ++i)
      if (!(o == "pow" && i == 1)) vals.push_back(materialize(args[i], op));
    const Call call{op, args, attrs, vals, given_name.empty() ? fresh_name("_", fresh_) : given_name, o, n};
    if (auto v = build_elementwise(call)) return *v;
    if (auto v = build_reduction(call)) return *v;
    if (auto v = build_layout(call)) return *v;
    if (auto v = build_normalization(call)) return *v;
    fail(op, "internal: op '" + op.text + "' has no builder");  // the table and these functions disagree
  }

  // One op's call as build_op has checked it: its token, operands (literals made constant nodes in vals, but pow's
  // exponent), attributes, the new node's name, the op's name and its operand count. Each build_* takes it apart
  // with one structured binding and returns nullopt for an op not its own.
  struct Call {
    const Token& op;
    const std::vector<Operand>& args;
    const std::vector<Attr>& attrs;
    const std::vector<Value>& vals;
    std::string name;
    const std::string& o;
    int n;
  };

  // neg ... reciprocal, add / sub / mul / div, gelu, cast, pow, and max / min of two operands.
  std::optional<Value> build_elementwise(const Call& c) {
    const auto& [op, args, attrs, vals, name, o, n] = c;
    auto operand_value = [&c](int i) { return c.vals.at(i); };
    static const std::pair<const char*, OpKind> unary[] = {
        {"neg", OpKind::Neg},   {"abs", OpKind::Abs},         {"exp", OpKind::Exp},         {"log", OpKind::Log},
        {"sqrt", OpKind::Sqrt}, {"rsqrt", OpKind::Rsqrt},     {"tanh", OpKind::Tanh},       {"sigmoid", OpKind::Sigmoid},
        {"relu", OpKind::Relu}, {"silu", OpKind::Silu},       {"square", OpKind::Square},   {"reciprocal", OpKind::Reciprocal}};
    for (const auto& [nm, kind] : unary)
      if (o == nm) {
        Value x = operand_value(0);
        return build(op, [&] { return g_.unary(kind, x, name); });
      }
    static const std::pair<const char*, OpKind> binary[] = {
        {"add", OpKind::Add}, {"sub", OpKind::Sub}, {"mul", OpKind::Mul}, {"div", OpKind::Div}};
    for (const auto& [nm, kind] : binary)
      if (o == nm) {
        Value a = operand_value(0), b = operand_value(1);
        return build(op, [&] { return g_.binary(kind, a, b, name); });
      }

    if (o == "gelu") {
      OpKind kind = OpKind::Gelu;
      if (const Attr* a = find_attr(attrs, "approximate")) {
        if (a->kind != Attr::String) bad_attr(*a, "\"none\" or \"tanh\"");
        if (a->val.text == "tanh") kind = OpKind::GeluTanh;
        else if (a->val.text != "none") fail(a->val, "approximate must be \"none\" or \"tanh\", got \"" + a->val.text + "\"");
      }
      Value x = operand_value(0);
      return build(op, [&] { return g_.unary(kind, x, name); });
    }
    if (o == "cast" || o == "relabel") {
      const Attr* a = find_attr(attrs, "dtype");
      if (!a) fail(op, o + " needs a target dtype: " + o + "(x, dtype=bf16)");
      auto dt = a->kind == Attr::Word ? parse_dtype(a->val.text) : std::nullopt;
      if (!dt) bad_attr(*a, "a dtype (bf16, f16 or f32)");
      Value x = operand_value(0);
      if (o == "relabel") return build(op, [&] { return g_.relabel(x, *dt, name); });
      return build(op, [&] { return g_.cast(x, *dt, name); });
    }
    if (o == "pow") {
      const Attr* a = find_attr(attrs, "exponent");
      double e = 0;
      if (n == 2) {
        if (a) fail(a->key, "pow: the exponent is given twice (positionally and as exponent=)");
        if (!args[1].literal) fail(args[1].tok, "pow: the exponent must be a number literal, e.g. pow(x, 2.0)");
        e = args[1].number;
      } else {
        if (!a) fail(op, "pow needs an exponent: pow(x, 2.0)");
        e = attr_double(a, 0);
      }
      Value x = operand_value(0);
      return build(op, [&] { return g_.pow(x, e, name); });
    }
    if ((o == "max" || o == "min") && n == 2) {
      for (const auto& a : attrs)
        fail(a.key, o + "(a, b) is elementwise: '" + a.key.text + "' applies only to the reduction " + o + "(x)");
      Value a = operand_value(0), b = operand_value(1);
      return build(op, [&] { return g_.binary(o == "max" ? OpKind::Max : OpKind::Min, a, b, name); });
    }
    return std::nullopt;
  }

  // The reductions along a dim: max / min of one operand, sum, mean, var.
  std::optional<Value> build_reduction(const Call& c) {
    const auto& [op, args, attrs, vals, name, o, n] = c;
    auto operand_value = [&c](int i) { return c.vals.at(i); };
    if (o == "max" || o == "min") {
      int dim = attr_dim(find_attr(attrs, "dim"), -1);
      bool keep = attr_bool(find_attr(attrs, "keepdim"), true);
      Value x = operand_value(0);
      return build(op, [&] { return g_.reduce(o == "max" ? OpKind::ReduceMax : OpKind::ReduceMin, x, dim, keep, name); });
    }
    if (o == "sum" || o == "mean") {
      int dim = attr_dim(find_attr(attrs, "dim"), -1);
      bool keep = attr_bool(find_attr(attrs, "keepdim"), true);
      Value x = operand_value(0);
      return build(op, [&] { return g_.reduce(o == "sum" ? OpKind::Sum : OpKind::Mean, x, dim, keep, name); });
    }
    if (o == "var") {
      int dim = attr_dim(find_attr(attrs, "dim"), -1);
      const Attr* c = find_attr(attrs, "correction");
      int64_t corr = c ? attr_int(*c) : 0;
      bool keep = attr_bool(find_attr(attrs, "keepdim"), true);
      Value x = operand_value(0);
      return build(op, [&] { return g_.var(x, dim, corr, keep, name); });
    }
    return std::nullopt;
  }

  // matmul, transpose, reshape, rotate_half.
  std::optional<Value> build_layout(const Call& c) {
    const auto& [op, args, attrs, vals, name, o, n] = c;
    auto operand_value = [&c](int i) { return c.vals.at(i); };
    if (o == "matmul") {
      bool ta = attr_bool(find_attr(attrs, "transpose_a"), false);
      bool tb = attr_bool(find_attr(attrs, "transpose_b"), false);
      Value a = operand_value(0), b = operand_value(1);
      return build(op, [&] { return g_.matmul(a, b, ta, tb, name); });
    }
    if (o == "transpose") {
      std::vector<int64_t> perm;
      if (const Attr* a = find_attr(attrs, "perm")) {
        if (a->kind != Attr::List) bad_attr(*a, "a list of dims like [0, 2, 1]");
        perm = a->list;
        if (perm.empty()) fail(a->val, "perm must not be empty: leave it out to swap the last two dims");
      }
      Value x = operand_value(0);
      return build(op, [&] { return g_.transpose(x, perm, name); });
    }
    if (o == "reshape") {
      const Attr* a = find_attr(attrs, "shape");
      if (!a) fail(op, "reshape needs the new shape: reshape(x, shape=[8, -1])");
      if (a->kind != Attr::List) bad_attr(*a, "a list of dims like [8, -1]");
      for (int64_t d : a->list)   // (-2 is the graph's own marker for a `?` dim: never user syntax)
        if (d < -1 || d == 0)
          fail(a->val, "reshape: 'shape' holds " + std::to_string(d) +
                           ": each dim is a size, or -1 for the one dim inferred from the others");
      Value x = operand_value(0);
      return build(op, [&] { return g_.reshape(x, a->list, name); });
    }
    if (o == "rotate_half") {
      Value x = operand_value(0);
      return build(op, [&] { return g_.rotate_half(x, name); });
    }
    return std::nullopt;
  }

  // layer_norm, rms_norm, softmax, log_softmax.
  std::optional<Value> build_normalization(const Call& c) {
    const auto& [op, args, attrs, vals, name, o, n] = c;
    auto operand_value = [&c](int i) { return c.vals.at(i); };
    if (o == "layer_norm") {
      double eps = attr_double(find_attr(attrs, "eps"), 1e-5);
      Value x = operand_value(0);
      Value w = n > 1 ? operand_value(1) : Value{};
      Value b = n > 2 ? operand_value(2) : Value{};
      return build(op, [&] { return g_.layer_norm(x, w, b, eps, name); });
    }
    if (o == "rms_norm") {
      double eps = attr_double(find_attr(attrs, "eps"), 1e-6);
      Value x = operand_value(0);
      Value w = n > 1 ? operand_value(1) : Value{};
      return build(op, [&] { return g_.rms_norm(x, w, eps, name); });
    }
    if (o == "softmax" || o == "log_softmax") {
      int dim = attr_dim(find_attr(attrs, "dim"), -1);
      Value x = operand_value(0);
      return build(op, [&] { return o == "softmax" ? g_.softmax(x, dim, name) : g_.log_softmax(x, dim, name); });
    }
    return std::nullopt;
  }

  std::string file_;
  Lexer lex_;
  std::deque<Token> buf_;
  Graph g_;
  std::unordered_set<std::string> words_;
  int fresh_ = 0, fresh_const_ = 0, depth_ = 0, last_line_ = 1;
  bool saw_output_ = false;
};

}  // namespace

Graph parse_cf(const std::string& text, const std::string& filename) { return Parser(text, filename).run(); }

Graph parse_cf_file(const std::string& path) {
  std::string text;
  try {   // a regular file of at most 64 MB: a FIFO, a directory or /dev/zero is refused at once
    text = files::read_regular_file(path, files::kMaxProgramBytes, "a .cf program");
  } catch (const files::FileError& e) {
    throw ParseError(path, 0, 0, e.reason());
  }
  return parse_cf(text, path);
}

}  // namespace comfuse
