// Printer and parser of the IR text form.
#include "ir/text.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

namespace tp::ir {
namespace {

std::string ValueName(const Graph& graph, ValueId v) {
  if (v < 0 || static_cast<size_t>(v) >= graph.values().size()) {
    return "%<dangling:" + std::to_string(v) + ">";
  }
  const Value& val = graph.values()[static_cast<size_t>(v)];
  return "%" + (val.name.empty() ? "v" + std::to_string(v) : val.name);
}

// The shortest text that reads back as the same double, always marked as a float ("2.0", not
// "2", which would read back as an int).
std::string DoubleText(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

void Print(std::ostringstream& os, const Graph& graph, const Arg& arg) {
  using K = Arg::Kind;
  switch (arg.kind) {
    case K::kNone:
      os << "None";
      break;
    case K::kBool:
      os << (arg.b ? "True" : "False");
      break;
    case K::kInt:
      os << arg.i;
      break;
    case K::kDouble:
      os << DoubleText(arg.d);
      break;
    case K::kString:
      os << std::quoted(arg.s);
      break;
    case K::kValue:
      os << ValueName(graph, arg.value());
      break;
    case K::kList:
    case K::kTuple: {
      os << (arg.kind == K::kList ? "[" : "(");
      for (size_t i = 0; i < arg.items.size(); ++i) {
        if (i) os << ", ";
        Print(os, graph, arg.items[i]);
      }
      if (arg.kind == K::kTuple && arg.items.size() == 1) os << ",";
      os << (arg.kind == K::kList ? "]" : ")");
      break;
    }
    case K::kDtype:
      os << "torch." << arg.s;
      break;
    case K::kDevice:
      os << "device(" << std::quoted(arg.s) << ")";
      break;
    case K::kLayout:
    case K::kMemoryFormat:
      os << "torch." << arg.s;
      break;
    case K::kOpaque:
      os << "<opaque#" << arg.i << ">";
      break;
  }
}

// ---- parser -------------------------------------------------------------------------------

const std::set<std::string>& Layouts() {
  static const std::set<std::string> names = {"strided", "sparse_coo", "sparse_csr",
                                              "sparse_csc", "sparse_bsr", "sparse_bsc",
                                              "_mkldnn", "jagged"};
  return names;
}
const std::set<std::string>& MemoryFormats() {
  static const std::set<std::string> names = {"contiguous_format", "channels_last",
                                              "channels_last_3d", "preserve_format"};
  return names;
}

class Parser {
 public:
  explicit Parser(const std::string& text) : t_(StripComments(text)) {}

  Graph Parse() {
    Expect("graph(");
    SkipSpace();
    if (!Peek(')')) {
      do {
        ParseInput();
      } while (Accept(','));
    }
    Expect(")");
    Expect(":");
    while (true) {
      SkipSpace();
      if (AcceptWord("return")) break;
      ParseNode();
    }
    b_.SetOutput(ParseArg());
    SkipSpace();
    if (pos_ != t_.size()) Fail("text after the graph's return");
    return b_.Build();
  }

 private:
  // Drops blank lines and "//" comment lines (golden files carry a header), keeping the rest
  // byte for byte so positions in errors match what PrintGraph wrote.
  static std::string StripComments(const std::string& text) {
    std::istringstream in(text);
    std::string line, out;
    while (std::getline(in, line)) {
      size_t first = line.find_first_not_of(" \t\r");
      if (first != std::string::npos && line.compare(first, 2, "//") == 0) line.clear();
      out += line + "\n";
    }
    return out;
  }

  [[noreturn]] void Fail(const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line, col = 1;
      } else {
        ++col;
      }
    }
    size_t begin = t_.rfind('\n', pos_ ? pos_ - 1 : 0);
    begin = begin == std::string::npos ? 0 : begin + 1;
    size_t end = t_.find('\n', pos_);
    throw GraphError("", "IR text line " + std::to_string(line) + ", column " +
                             std::to_string(col) + ": " + what + "\n  " +
                             t_.substr(begin, end == std::string::npos ? end : end - begin));
  }

  // Spaces, tabs and newlines; a "#" starts a scope comment, read by ParseNode only.
  void SkipSpace() {
    while (pos_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
  }
  void SkipInlineSpace() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\r')) ++pos_;
  }
  bool Peek(char c) {
    SkipSpace();
    return pos_ < t_.size() && t_[pos_] == c;
  }
  bool Accept(char c) {
    if (!Peek(c)) return false;
    ++pos_;
    return true;
  }
  bool AcceptWord(const std::string& w) {
    SkipSpace();
    if (t_.compare(pos_, w.size(), w) != 0) return false;
    const size_t after = pos_ + w.size();
    if (after < t_.size() && IsNameChar(t_[after]) && IsNameChar(w.back())) return false;
    pos_ = after;
    return true;
  }
  void Expect(const std::string& s) {
    SkipSpace();
    if (t_.compare(pos_, s.size(), s) != 0) Fail("expected '" + s + "'");
    pos_ += s.size();
  }
  static bool IsNameChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  }
  std::string Name() {
    SkipSpace();
    const size_t start = pos_;
    while (pos_ < t_.size() && IsNameChar(t_[pos_])) ++pos_;
    if (start == pos_) Fail("expected a name");
    return t_.substr(start, pos_ - start);
  }
  // "%name" -> name.
  std::string ValueRef() {
    Expect("%");
    return Name();
  }
  // A string as std::quoted writes it: '"', with '\\' escaping '"' and '\\'.
  std::string QuotedString() {
    if (!Peek('"')) Fail("expected a quoted string");
    std::string s;
    for (++pos_; pos_ < t_.size() && t_[pos_] != '"'; ++pos_) {
      if (t_[pos_] == '\\' && pos_ + 1 < t_.size()) ++pos_;
      s += t_[pos_];
    }
    if (pos_ >= t_.size()) Fail("unterminated string");
    ++pos_;
    return s;
  }
  // Text up to (not including) one of `stops` at bracket depth 0.
  std::string Until(const std::string& stops) {
    SkipSpace();
    const size_t start = pos_;
    int depth = 0;
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (depth == 0 && stops.find(c) != std::string::npos) break;
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']') --depth;
      if (c == '\n') Fail("unterminated expression");
      ++pos_;
    }
    std::string s = t_.substr(start, pos_ - start);
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  }

  SymDim Dim() {
    std::string s = Until(",]}");
    if (s.empty()) Fail("expected a dimension");
    const size_t eq = s.rfind('=');
    int64_t hint = -1;
    if (eq != std::string::npos && eq + 1 < s.size() && eq > 0 && s[eq - 1] != '=' &&
        s.find_first_not_of("0123456789", eq + 1) == std::string::npos) {
      hint = std::stoll(s.substr(eq + 1));
      s = s.substr(0, eq);
    }
    const bool digits =
        s.find_first_not_of("0123456789", s[0] == '-' ? 1 : 0) == std::string::npos;
    if (digits && hint < 0) return SymDim::Concrete(std::stoll(s));
    return SymDim::Symbolic(s, hint);
  }
  std::vector<SymDim> Dims(char close) {
    std::vector<SymDim> dims;
    if (Accept(close)) return dims;
    do {
      dims.push_back(Dim());
    } while (Accept(','));
    Expect(std::string(1, close));
    return dims;
  }

  ValueType Type() {
    SkipSpace();
    for (ValueKind k : {ValueKind::kSymInt, ValueKind::kSymFloat, ValueKind::kSymBool}) {
      const std::string word = std::string(ValueKindName(k)) + "(";
      if (t_.compare(pos_, word.size(), word) == 0) {
        pos_ += word.size();
        std::string expr = Until(")");
        Expect(")");
        return ValueType::Scalar(k, expr);
      }
    }
    if (AcceptWord("none")) return ValueType::None();
    if (AcceptWord("opaque")) {
      std::string note;
      if (pos_ < t_.size() && t_[pos_] == '<') {
        const size_t close = t_.find('>', pos_);
        if (close == std::string::npos) Fail("unterminated opaque note");
        note = t_.substr(pos_ + 1, close - pos_ - 1);
        pos_ = close + 1;
      }
      return ValueType::Opaque(note);
    }
    const size_t start = pos_;
    while (pos_ < t_.size() && t_[pos_] != '[' && !std::isspace(static_cast<unsigned char>(t_[pos_])))
      ++pos_;
    const std::string dtype = t_.substr(start, pos_ - start);
    TensorType tt;
    tt.dtype = DTypeFromShortName(dtype);
    if (tt.dtype == DType::kUnknown && dtype != "?") {
      pos_ = start;
      Fail("unknown type '" + dtype + "' (a dtype such as f32, bf16, i64; symint(...), none, "
           "opaque)");
    }
    Expect("[");
    tt.shape = Dims(']');
    if (pos_ < t_.size() && t_[pos_] == '{') {
      ++pos_;
      tt.stride = Dims('}');
      if (tt.stride.size() != tt.shape.size()) Fail("strides and shape differ in rank");
    }
    if (pos_ < t_.size() && t_[pos_] == '@') {
      ++pos_;
      const size_t d = pos_;
      while (pos_ < t_.size() && (IsNameChar(t_[pos_]) || t_[pos_] == ':')) ++pos_;
      tt.device = t_.substr(d, pos_ - d);
    }
    const size_t before = pos_;
    if (AcceptWord("grad")) {
      tt.requires_grad = true;
    } else {
      pos_ = before;
    }
    return ValueType::Tensor(std::move(tt));
  }

  ValueId Lookup(const std::string& name) {
    auto it = values_.find(name);
    if (it == values_.end()) Fail("'%" + name + "' is not defined before this use");
    return it->second;
  }
  void Define(const std::string& name, ValueId v) {
    if (name.empty()) return;
    if (!values_.emplace(name, v).second) Fail("'%" + name + "' is defined twice");
  }

  void ParseInput() {
    const std::string name = ValueRef();
    Expect(":");
    ValueType type = Type();
    const std::string kind_name = Name();
    InputKind kind;
    try {
      kind = InputKindFromName(kind_name);
    } catch (const GraphError& e) {
      Fail(e.what());
    }
    std::string source;
    if (Peek('"')) source = QuotedString();
    Define(name, b_.AddInput(name, std::move(type), kind, source));
  }

  Arg ParseArg() {
    SkipSpace();
    if (pos_ >= t_.size()) Fail("expected an argument");
    const char c = t_[pos_];
    if (c == '%') return Arg::Value(Lookup(ValueRef()));
    if (c == '"') return Arg::String(QuotedString());
    if (c == '[' || c == '(') {
      ++pos_;
      const char close = c == '[' ? ']' : ')';
      std::vector<Arg> items;
      bool trailing_comma = false;
      while (!Accept(close)) {
        items.push_back(ParseArg());
        trailing_comma = Accept(',');
        if (!trailing_comma && !Peek(close)) Fail(std::string("expected ',' or '") + close + "'");
      }
      (void)trailing_comma;
      return Arg::List(std::move(items), c == '(');
    }
    if (t_.compare(pos_, 8, "<opaque#") == 0) {
      pos_ += 8;
      const std::string n = Until(">");
      Expect(">");
      return Arg::Opaque(std::stoll(n));
    }
    if (AcceptWord("None")) return Arg::None();
    if (AcceptWord("True")) return Arg::Bool(true);
    if (AcceptWord("False")) return Arg::Bool(false);
    if (t_.compare(pos_, 7, "device(") == 0) {
      pos_ += 7;
      Arg a = Arg::Tagged(Arg::Kind::kDevice, QuotedString());
      Expect(")");
      return a;
    }
    if (t_.compare(pos_, 6, "torch.") == 0) {
      pos_ += 6;
      const std::string n = Name();
      if (Layouts().count(n)) return Arg::Tagged(Arg::Kind::kLayout, n);
      if (MemoryFormats().count(n)) return Arg::Tagged(Arg::Kind::kMemoryFormat, n);
      return Arg::Tagged(Arg::Kind::kDtype, n);
    }
    // A number: int unless it has '.', 'e', or is inf/nan.
    const size_t start = pos_;
    if (t_[pos_] == '-' || t_[pos_] == '+') ++pos_;
    while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) ||
                                t_[pos_] == '.' ||
                                ((t_[pos_] == '-' || t_[pos_] == '+') &&
                                 (t_[pos_ - 1] == 'e' || t_[pos_ - 1] == 'E'))))
      ++pos_;
    const std::string num = t_.substr(start, pos_ - start);
    if (num.empty()) Fail("expected an argument");
    char* end = nullptr;
    if (num.find_first_of(".eEni") == std::string::npos) {
      const long long v = std::strtoll(num.c_str(), &end, 10);
      if (*end == '\0') return Arg::Int(v);
    } else {
      const double v = std::strtod(num.c_str(), &end);
      if (*end == '\0') return Arg::Double(v);
    }
    pos_ = start;
    Fail("cannot read argument '" + num + "'");
  }

  void ParseNode() {
    NodeSpec spec;
    if (Accept('(')) {
      spec.tuple_output = true;
      while (!Accept(')')) {
        std::string name;
        if (!Accept('_')) name = ValueRef();
        Expect(":");
        spec.output_names.push_back(name);
        spec.output_types.push_back(Type());
        if (!Accept(',') && !Peek(')')) Fail("expected ',' or ')' in the output tuple");
      }
      spec.name = ValueRef();
    } else {
      const std::string name = ValueRef();
      Expect(":");
      spec.output_names.push_back(name);
      spec.output_types.push_back(Type());
      spec.name = Peek('%') ? ValueRef() : name;
    }
    Expect("=");
    SkipSpace();
    const size_t op_start = pos_;
    while (pos_ < t_.size() && t_[pos_] != '(' && !std::isspace(static_cast<unsigned char>(t_[pos_])))
      ++pos_;
    spec.op = t_.substr(op_start, pos_ - op_start);
    if (spec.op.empty()) Fail("expected an op name");
    Expect("(");
    while (!Accept(')')) {
      // name=value is a keyword argument; anything else positional.
      SkipSpace();
      size_t p = pos_;
      while (p < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p])) || t_[p] == '_'))
        ++p;
      if (p > pos_ && p < t_.size() && t_[p] == '=') {
        std::string key = t_.substr(pos_, p - pos_);
        pos_ = p + 1;
        spec.kwargs.push_back({key, ParseArg()});
      } else {
        if (!spec.kwargs.empty()) Fail("a positional argument after keyword arguments");
        spec.args.push_back(ParseArg());
      }
      if (!Accept(',') && !Peek(')')) Fail("expected ',' or ')' in the arguments");
    }
    SkipInlineSpace();
    if (pos_ < t_.size() && t_[pos_] == '{') {
      ++pos_;
      while (!Accept('}')) {
        const std::string key = Until("=");
        Expect("=");
        spec.attrs[key] = QuotedString();
        if (!Accept(',') && !Peek('}')) Fail("expected ',' or '}' in the attributes");
      }
      SkipInlineSpace();
    }
    if (pos_ < t_.size() && t_[pos_] == '#') {
      ++pos_;
      SkipInlineSpace();
      const size_t end = t_.find('\n', pos_);
      spec.scope = t_.substr(pos_, end == std::string::npos ? std::string::npos : end - pos_);
      while (!spec.scope.empty() && (spec.scope.back() == ' ' || spec.scope.back() == '\r'))
        spec.scope.pop_back();
      pos_ = end == std::string::npos ? t_.size() : end;
    }
    const std::vector<std::string> names = spec.output_names;
    ValueId next = static_cast<ValueId>(b_.num_values());
    try {
      b_.AddNode(std::move(spec));
    } catch (const GraphError& e) {
      Fail(e.what());
    }
    for (const auto& n : names) Define(n, next++);
  }

  std::string t_;
  size_t pos_ = 0;
  GraphBuilder b_;
  std::map<std::string, ValueId> values_;
};

}  // namespace

std::string PrintArg(const Graph& graph, const Arg& arg) {
  std::ostringstream os;
  Print(os, graph, arg);
  return os.str();
}

std::string PrintGraph(const Graph& graph) {
  // An unnamed tuple element prints as "_" unless something reads it: then it is %v<id> where
  // it is defined too, so the text reads back.
  std::set<ValueId> used;
  for (const Node& node : graph.nodes()) node.ForEachInput([&](ValueId v) { used.insert(v); });
  graph.output().ForEachValue([&](ValueId v) { used.insert(v); });
  std::ostringstream os;
  os << "graph(";
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    const GraphInput& in = graph.inputs()[i];
    if (i) os << ",\n      ";
    os << ValueName(graph, in.value) << ": " << graph.type(in.value).ToString() << " "
       << InputKindName(in.kind);
    if (!in.source.empty()) os << " " << std::quoted(in.source);
  }
  os << "):\n";
  for (const Node& node : graph.nodes()) {
    os << "  ";
    if (node.tuple_output) {
      os << "(";
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        if (i) os << ", ";
        const Value& v = graph.value(node.outputs[i]);
        const bool blank = v.name.empty() && !used.count(v.id);
        os << (blank ? "_" : ValueName(graph, v.id)) << ": " << v.type.ToString();
      }
      os << ") %" << node.name;
    } else {
      const Value& v = graph.value(node.outputs.front());
      os << ValueName(graph, v.id) << ": " << v.type.ToString();
      if (v.name != node.name) os << " %" << node.name;
    }
    os << " = " << node.op << "(";
    bool first = true;
    for (const Arg& a : node.args) {
      if (!first) os << ", ";
      first = false;
      Print(os, graph, a);
    }
    for (const NamedArg& kw : node.kwargs) {
      if (!first) os << ", ";
      first = false;
      os << kw.name << "=";
      Print(os, graph, kw.value);
    }
    os << ")";
    if (!node.attrs.empty()) {
      os << " {";
      bool first_attr = true;
      for (const auto& [k, v] : node.attrs) {
        os << (first_attr ? "" : ", ") << k << "=" << std::quoted(v);
        first_attr = false;
      }
      os << "}";
    }
    if (!node.scope.empty()) os << "  # " << node.scope;
    os << "\n";
  }
  os << "  return ";
  Print(os, graph, graph.output());
  os << "\n";
  return os.str();
}

Graph ParseGraph(const std::string& text) { return Parser(text).Parse(); }

}  // namespace tp::ir
