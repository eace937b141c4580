// Recursive-descent parser for .cir text. The grammar is small and context
// dependent (a bare name may look like a number), so the parser reads tokens
// by what it expects next instead of running a separate lexer.
#include "ir/Parser.h"

#include "ir/Printer.h"
#include "ir/TypeRules.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace cleave::ir {
namespace {
// Stage tags above this are refused (more than any plan may have).
constexpr int64_t kMaxStageTag = 1 << 20;

// Input text quoted in an error, with control and non-ASCII bytes escaped so
// the message stays one readable line.
static std::string printable(llvm::StringRef s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      out += "\\x";
      out += llvm::hexdigit(c >> 4, true);
      out += llvm::hexdigit(c & 15, true);
    }
  }
  return out;
}

class Parser {
public:
  Parser(llvm::StringRef text, llvm::StringRef bufferName,
         const ParseOptions &opts)
      : text_(text), buffer_(bufferName), opts_(opts) {}

  llvm::Expected<std::unique_ptr<Graph>> run();

private:
  // --- low-level reading
  void skipSpace();
  bool atEnd() {
    skipSpace();
    return pos_ >= text_.size();
  }
  char peek() {
    skipSpace();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  bool consume(llvm::StringRef tok);
  llvm::Error expect(llvm::StringRef tok);
  llvm::StringRef readWord(); // [A-Za-z0-9_.\-/+]* (may be empty)
  llvm::Error error(const llvm::Twine &msg) const;

  llvm::Expected<std::string> parseString();
  llvm::Expected<std::string> parseName(); // bare or quoted
  llvm::Expected<std::string> parseValueName(); // after '%'
  llvm::Expected<Value *> parseValueUse();
  llvm::Expected<int64_t> parseInt();
  llvm::Expected<double> parseNumber(llvm::StringRef *textOut = nullptr);
  llvm::Expected<TensorType> parseType();
  llvm::Error checkFloatRange(double v, DType t, llvm::StringRef text);
  llvm::Expected<std::shared_ptr<TensorData>> parseData(const TensorType &t);
  llvm::Expected<Attribute> parseAttrValue(AttrKind kind);
  llvm::Error parseDeclaration(llvm::StringRef keyword);
  llvm::Error parseOp(Phase phase = Phase::Fwd, int stage = -1);
  llvm::Error parseTaggedOp(int stage);
  llvm::Error parseStash();
  llvm::Error parseUpdate();
  llvm::Error checkNewName(const std::string &name);

  llvm::StringRef text_, buffer_;
  const ParseOptions &opts_;
  size_t pos_ = 0;
  size_t tokStart_ = 0; // where the token being read starts (for errors)
  std::unique_ptr<Graph> graph_;
};

void Parser::skipSpace() {
  while (pos_ < text_.size()) {
    char c = text_[pos_];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++pos_;
    } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/') {
      while (pos_ < text_.size() && text_[pos_] != '\n')
        ++pos_;
    } else {
      break;
    }
  }
  tokStart_ = pos_;
}

llvm::Error Parser::error(const llvm::Twine &msg) const {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < tokStart_ && i < text_.size(); ++i) {
    if (text_[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      llvm::formatv("{0}:{1}:{2}: {3}", buffer_, line, col, msg.str()).str());
}

bool Parser::consume(llvm::StringRef tok) {
  skipSpace();
  if (!text_.substr(pos_).startswith(tok))
    return false;
  pos_ += tok.size();
  return true;
}

llvm::Error Parser::expect(llvm::StringRef tok) {
  if (consume(tok))
    return llvm::Error::success();
  std::string got = printable(text_.substr(pos_, 12).split('\n').first);
  return error("expected '" + tok + "'" +
               (got.empty() ? llvm::Twine(" at end of input")
                            : " but found '" + got + "'"));
}

static bool isWordChar(char c) {
  return llvm::isAlnum(c) || c == '_' || c == '.' || c == '-' || c == '/' ||
         c == '+';
}

llvm::StringRef Parser::readWord() {
  skipSpace();
  size_t start = pos_;
  while (pos_ < text_.size() && isWordChar(text_[pos_]))
    ++pos_;
  return text_.slice(start, pos_);
}

llvm::Expected<std::string> Parser::parseString() {
  skipSpace();
  if (pos_ >= text_.size() || text_[pos_] != '"')
    return error("expected a quoted string");
  ++pos_;
  std::string out;
  while (true) {
    if (pos_ >= text_.size())
      return error("unterminated string");
    char c = text_[pos_++];
    if (c == '"')
      return out;
    if (c == '\n')
      return error("newline inside a string");
    if (c != '\\') {
      out += c;
      continue;
    }
    if (pos_ >= text_.size())
      return error("unterminated string");
    char e = text_[pos_];
    if (e == '"' || e == '\\') {
      out += e;
      ++pos_;
      continue;
    }
    if (pos_ + 1 < text_.size() && llvm::isHexDigit(e) &&
        llvm::isHexDigit(text_[pos_ + 1])) {
      out += char(llvm::hexFromNibbles(e, text_[pos_ + 1]));
      pos_ += 2;
      continue;
    }
    return error("bad escape in string");
  }
}

llvm::Expected<std::string> Parser::parseName() {
  if (peek() == '"')
    return parseString();
  llvm::StringRef w = readWord();
  if (w.empty())
    return error("expected a name");
  return w.str();
}

llvm::Expected<std::string> Parser::parseValueName() {
  if (auto e = expect("%"))
    return std::move(e);
  if (pos_ < text_.size() && text_[pos_] == '"') {
    auto s = parseString();
    if (s && s->empty())
      return error("value names must not be empty");
    return s;
  }
  size_t start = pos_;
  while (pos_ < text_.size() && isWordChar(text_[pos_]) && text_[pos_] != '+')
    ++pos_;
  if (start == pos_)
    return error("expected a value name after '%'");
  return text_.slice(start, pos_).str();
}

llvm::Expected<Value *> Parser::parseValueUse() {
  auto name = parseValueName();
  if (!name)
    return name.takeError();
  Value *v = graph_->lookup(*name);
  if (!v)
    return error("use of undefined value " + valueRef(*name));
  return v;
}

llvm::Expected<int64_t> Parser::parseInt() {
  llvm::StringRef w = readWord();
  int64_t v;
  if (w.empty() || w.getAsInteger(10, v))
    return error("expected an integer, found '" + printable(w) + "'");
  return v;
}

llvm::Expected<double> Parser::parseNumber(llvm::StringRef *textOut) {
  llvm::StringRef w = readWord();
  if (textOut)
    *textOut = w;
  if (w == "inf" || w == "+inf")
    return HUGE_VAL;
  if (w == "-inf")
    return -HUGE_VAL;
  if (w == "nan" || w == "-nan")
    return std::nan("");
  std::string s = w.str();
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || llvm::isAlpha(s[0]))
    return error("expected a number, found '" + printable(w) + "'");
  return v;
}

static bool fitsInteger(DType t, int64_t v) {
  switch (t) {
  case DType::I8:
    return v >= -128 && v <= 127;
  case DType::I32:
    return v >= INT32_MIN && v <= INT32_MAX;
  default:
    return true;
  }
}

// A finite literal that rounds to infinity in the element type is an
// error, not inf.
llvm::Error Parser::checkFloatRange(double v, DType t, llvm::StringRef text) {
  if (!std::isfinite(v) || t == DType::F64)
    return llvm::Error::success();
  float f = float(v);
  bool overflow = std::isinf(f);
  if (t == DType::F16)
    overflow |= (floatToHalf(f) & 0x7fff) == 0x7c00;
  if (t == DType::BF16)
    overflow |= (floatToBf16(f) & 0x7fff) == 0x7f80;
  if (overflow)
    return error("'" + text + "' is out of range for " +
                 std::string(dtypeName(t)));
  return llvm::Error::success();
}

llvm::Expected<TensorType> Parser::parseType() {
  llvm::StringRef w = readWord();
  auto dt = parseDType(std::string_view(w.data(), w.size()));
  if (!dt)
    return error("expected an element type (f32, f16, bf16, f64, i64, i32, "
                 "i8, bool), found '" +
                 printable(w) + "'");
  if (auto e = expect("["))
    return std::move(e);
  Shape shape;
  if (!consume("]")) {
    while (true) {
      auto d = parseInt();
      if (!d)
        return d.takeError();
      shape.push_back(*d);
      if (consume("]"))
        break;
      if (auto e = expect(","))
        return std::move(e);
    }
  }
  if (auto e = checkShape(shape))
    return error("bad shape: " + llvm::toString(std::move(e)));
  return TensorType(*dt, shape);
}

llvm::Expected<std::shared_ptr<TensorData>>
Parser::parseData(const TensorType &t) {
  llvm::StringRef kind = readWord();
  if (auto e = expect("<"))
    return std::move(e);
  std::shared_ptr<TensorData> data;
  if (kind == "onnx" || kind == "file") {
    DataOrigin o;
    auto path = parseString();
    if (!path)
      return path.takeError();
    o.path = *path;
    if (opts_.confine) {
      auto resolved = support::resolveConfined(*path, opts_.baseDir,
                                               opts_.trusted,
                                               kind.str() + "<> data file");
      if (!resolved)
        return error(llvm::toString(resolved.takeError()));
      o.path = *resolved;
    }
    if (auto e = expect(","))
      return std::move(e);
    if (kind == "onnx") {
      o.kind = DataOrigin::Kind::OnnxInitializer;
      auto key = parseString();
      if (!key)
        return key.takeError();
      o.key = *key;
    } else {
      o.kind = DataOrigin::Kind::RawFile;
      auto off = parseInt();
      if (!off)
        return off.takeError();
      if (auto e = expect(","))
        return std::move(e);
      auto len = parseInt();
      if (!len)
        return len.takeError();
      if (*off < 0 || *len != t.byteSize())
        return error(llvm::formatv("file<> range of {0} bytes at offset {1} "
                                   "does not hold {2} ({3} bytes)",
                                   *len, *off, t.str(), t.byteSize())
                         .str());
      o.offset = *off;
      o.length = *len;
      uint64_t size = 0;
      if (llvm::sys::fs::file_size(o.path, size) ||
          uint64_t(*off) + uint64_t(*len) > size)
        return error("file<> data '" + o.path +
                     "' is missing or shorter than offset + length");
    }
    if (o.kind == DataOrigin::Kind::OnnxInitializer &&
        !llvm::sys::fs::exists(o.path))
      return error("onnx<> data file '" + o.path + "' does not exist");
    data = std::make_shared<TensorData>(t, o);
  } else if (kind == "hex") {
    auto hex = parseString();
    if (!hex)
      return hex.takeError();
    std::string bytes;
    // An odd digit count would read as a leading 0 nibble: refused.
    if (hex->size() % 2 != 0 || !llvm::tryGetFromHex(*hex, bytes))
      return error("hex<> data is not valid hexadecimal (two digits a byte)");
    if (int64_t(bytes.size()) != t.byteSize())
      return error(llvm::formatv("hex<> data has {0} bytes, {1} needs {2}",
                                 bytes.size(), t.str(), t.byteSize())
                       .str());
    data = std::make_shared<TensorData>(
        t, std::vector<uint8_t>(bytes.begin(), bytes.end()));
  } else if (kind == "dense" || kind == "splat") {
    bool list = kind == "dense" && consume("[");
    std::vector<double> vals;
    std::vector<int64_t> ints;
    bool isF = isFloat(t.dtype);
    while (true) {
      if (list && vals.empty() && ints.empty() && consume("]"))
        break;
      if (t.dtype == DType::Bool) {
        llvm::StringRef w = readWord();
        if (w != "true" && w != "false")
          return error("expected true or false, found '" + w + "'");
        ints.push_back(w == "true");
      } else if (isF) {
        llvm::StringRef text;
        auto v = parseNumber(&text);
        if (!v)
          return v.takeError();
        if (auto e = checkFloatRange(*v, t.dtype, text))
          return std::move(e);
        vals.push_back(*v);
      } else {
        auto v = parseInt();
        if (!v)
          return v.takeError();
        if (!fitsInteger(t.dtype, *v))
          return error(llvm::formatv("{0} does not fit in {1}", *v,
                                     dtypeName(t.dtype))
                           .str());
        ints.push_back(*v);
      }
      if (!list || consume("]"))
        break;
      if (auto e = expect(","))
        return std::move(e);
    }
    int64_t n = isF ? vals.size() : ints.size();
    int64_t want = t.numElements();
    if (kind == "splat" && n != 1) {
      return error(llvm::formatv("splat<> takes one value, not {0}", n).str());
    } else if (kind == "splat") {
      // One element, held once until something spells it out (load()),
      // bounded like every tensor of the text form.
      if (t.byteSize() > (int64_t(1) << 28))
        return error("splat<> tensor " + t.str() +
                     " is larger than the 256 MiB the text form holds");
      uint8_t element[8] = {};
      if (isF)
        storeElement(t.dtype, element, 0, vals[0]);
      else
        storeElementInt(t.dtype, element, 0, ints[0]);
      data = TensorData::splat(
          t, llvm::ArrayRef<uint8_t>(element, dtypeSize(t.dtype)));
    } else if (n != want) {
      return error(llvm::formatv("dense<> has {0} values but {1} has {2}", n,
                                 t.str(), want)
                       .str());
    }
    if (!data)
      data = isF ? TensorData::fromDoubles(t.dtype, t.shape, vals)
                 : TensorData::fromInts(t.dtype, t.shape, ints);
  } else {
    return error("expected tensor data (dense<...>, splat<...>, hex<...>, "
                 "onnx<...> or file<...>), found '" +
                 printable(kind) + "'");
  }
  if (auto e = expect(">"))
    return std::move(e);
  return data;
}

llvm::Expected<Attribute> Parser::parseAttrValue(AttrKind kind) {
  auto parseList = [&](auto parseOne, auto &out) -> llvm::Error {
    if (auto e = expect("["))
      return e;
    if (consume("]"))
      return llvm::Error::success();
    while (true) {
      auto v = parseOne();
      if (!v)
        return v.takeError();
      out.push_back(*v);
      if (consume("]"))
        return llvm::Error::success();
      if (auto e = expect(","))
        return e;
    }
  };
  auto parseF = [&]() -> llvm::Expected<float> {
    llvm::StringRef text;
    auto v = parseNumber(&text);
    if (!v)
      return v.takeError();
    if (auto e = checkFloatRange(*v, DType::F32, text))
      return std::move(e);
    return float(*v);
  };
  switch (kind) {
  case AttrKind::Int: {
    auto v = parseInt();
    if (!v)
      return v.takeError();
    return Attribute(*v);
  }
  case AttrKind::Float: {
    auto v = parseF();
    if (!v)
      return v.takeError();
    return Attribute(*v);
  }
  case AttrKind::String: {
    auto v = parseString();
    if (!v)
      return v.takeError();
    return Attribute(*v);
  }
  case AttrKind::Ints: {
    std::vector<int64_t> v;
    if (auto e = parseList([&] { return parseInt(); }, v))
      return std::move(e);
    return Attribute(std::move(v));
  }
  case AttrKind::Floats: {
    std::vector<float> v;
    if (auto e = parseList(parseF, v))
      return std::move(e);
    return Attribute(std::move(v));
  }
  case AttrKind::Strings: {
    std::vector<std::string> v;
    if (auto e = parseList([&] { return parseString(); }, v))
      return std::move(e);
    return Attribute(std::move(v));
  }
  case AttrKind::Tensor: {
    auto t = parseType();
    if (!t)
      return t.takeError();
    auto d = parseData(*t);
    if (!d)
      return d.takeError();
    return Attribute(*d);
  }
  }
  return error("unknown attribute kind");
}

llvm::Error Parser::checkNewName(const std::string &name) {
  if (graph_->lookup(name))
    return error("value " + valueRef(name) + " is defined twice");
  return llvm::Error::success();
}

llvm::Error Parser::parseDeclaration(llvm::StringRef keyword) {
  auto name = parseValueName();
  if (!name)
    return name.takeError();
  if (auto e = checkNewName(*name))
    return e;
  if (auto e = expect(":"))
    return e;
  auto type = parseType();
  if (!type)
    return type.takeError();
  if (keyword == "input") {
    graph_->addInput(*name, *type);
    return llvm::Error::success();
  }
  if (auto e = expect("="))
    return e;
  auto data = parseData(*type);
  if (!data)
    return data.takeError();
  ValueKind kind = keyword == "param"    ? ValueKind::Param
                   : keyword == "buffer" ? ValueKind::Buffer
                                         : ValueKind::Const;
  graph_->addDeclared(kind, *name, *data);
  return llvm::Error::success();
}

llvm::Error Parser::parseOp(Phase phase, int stage) {
  std::vector<std::string> names;
  // An op without results (Send) starts with its name.
  while (peek() == '%') {
    auto n = parseValueName();
    if (!n)
      return n.takeError();
    if (auto e = checkNewName(*n))
      return e;
    for (const std::string &prev : names)
      if (prev == *n)
        return error("value " + valueRef(*n) + " is defined twice");
    names.push_back(*n);
    if (!consume(","))
      break;
  }
  if (!names.empty())
    if (auto e = expect("="))
      return e;
  llvm::StringRef opName = readWord();
  auto kind = lookupOp(std::string_view(opName.data(), opName.size()));
  if (!kind)
    return error("unknown op '" + opName + "'");
  const OpInfo &info = opInfo(*kind);
  if (names.empty() && info.minResults != 0)
    return error("op " + opName + " needs a result name before it");
  if (auto e = expect("("))
    return e;
  std::vector<Value *> operands;
  if (!consume(")")) {
    while (true) {
      auto v = parseValueUse();
      if (!v)
        return v.takeError();
      operands.push_back(*v);
      if (consume(")"))
        break;
      if (auto e = expect(","))
        return e;
    }
  }
  AttrMap attrs;
  if (consume("{")) {
    while (true) {
      auto attrName = parseName();
      if (!attrName)
        return attrName.takeError();
      const AttrSpec *spec = info.findAttr(*attrName);
      // Every op may carry recompute_of (ir/OpInfo.h).
      bool recomputeOf = *attrName == kRecomputeOfAttr;
      if (!spec && !recomputeOf)
        return error("op " + opName + " has no attribute '" + *attrName + "'");
      if (attrs.count(*attrName))
        return error("attribute '" + *attrName + "' is given twice");
      if (auto e = expect("="))
        return e;
      auto value = parseAttrValue(spec ? spec->kind : AttrKind::String);
      if (!value)
        return value.takeError();
      attrs.emplace(*attrName, std::move(*value));
      if (consume("}"))
        break;
      if (auto e = expect(","))
        return e;
    }
  }
  if (!names.empty())
    if (auto e = expect(":"))
      return e;
  std::vector<TensorType> types;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i)
      if (auto e = expect(","))
        return e;
    auto t = parseType();
    if (!t)
      return t.takeError();
    types.push_back(*t);
  }
  std::string loc;
  if (consume("@")) {
    auto l = parseString();
    if (!l)
      return l.takeError();
    loc = *l;
  }
  Op *op = graph_->appendOp(*kind, operands, types, names, std::move(attrs),
                            loc);
  op->setPhase(phase);
  op->setStage(stage);
  return llvm::Error::success();
}

// After `[s]`, the stage tag: an op with or without its phase.
llvm::Error Parser::parseTaggedOp(int stage) {
  if (peek() == '%')
    return parseOp(Phase::Fwd, stage);
  size_t at = pos_;
  llvm::StringRef kw = readWord();
  if (auto phase = parsePhase(std::string_view(kw.data(), kw.size())))
    return parseOp(*phase, stage);
  if (lookupOp(std::string_view(kw.data(), kw.size()))) {
    pos_ = at; // an untagged op, no results
    return parseOp(Phase::Fwd, stage);
  }
  return error("expected an op after the stage tag [" +
               llvm::Twine(stage) + "]");
}

llvm::Error Parser::parseStash() {
  std::vector<Value *> stash;
  do {
    auto v = parseValueUse();
    if (!v)
      return v.takeError();
    stash.push_back(*v);
  } while (consume(","));
  graph_->setStash(std::move(stash));
  return llvm::Error::success();
}

llvm::Error Parser::parseUpdate() {
  auto state = parseValueUse();
  if (!state)
    return state.takeError();
  if ((*state)->kind() != ValueKind::Param &&
      (*state)->kind() != ValueKind::Buffer)
    return error("update target " + valueRef((*state)->name()) +
                 " must be a param or buffer");
  if (auto e = expect("="))
    return e;
  auto value = parseValueUse();
  if (!value)
    return value.takeError();
  graph_->addUpdate(*state, *value);
  return llvm::Error::success();
}

llvm::Expected<std::unique_ptr<Graph>> Parser::run() {
  graph_ = std::make_unique<Graph>();
  if (auto e = expect("graph"))
    return std::move(e);
  if (auto e = expect("@"))
    return std::move(e);
  auto gname = parseName();
  if (!gname)
    return gname.takeError();
  graph_->setName(*gname);
  if (auto e = expect("{"))
    return std::move(e);
  while (!consume("}")) {
    if (atEnd())
      return error("expected '}' to close the graph");
    if (peek() == '%') {
      if (auto e = parseOp())
        return std::move(e);
      continue;
    }
    if (consume("[")) { // a pipeline stage tag: `[s] fwd %x = ...`
      auto stage = parseInt();
      if (!stage)
        return stage.takeError();
      if (*stage < 0 || *stage > kMaxStageTag)
        return error("stage tag " + llvm::Twine(*stage) +
                     " is out of range (0.." + llvm::Twine(kMaxStageTag) +
                     ")");
      if (auto e = expect("]"))
        return std::move(e);
      if (auto e = parseTaggedOp(int(*stage)))
        return std::move(e);
      continue;
    }
    llvm::StringRef kw = readWord();
    if (kw == "input" || kw == "param" || kw == "buffer" || kw == "const") {
      if (auto e = parseDeclaration(kw))
        return std::move(e);
    } else if (auto phase = parsePhase(std::string_view(kw.data(), kw.size()));
               phase && (peek() == '%' ||
                         std::isupper((unsigned char)peek()))) {
      if (auto e = parseOp(*phase))
        return std::move(e);
    } else if (lookupOp(std::string_view(kw.data(), kw.size())) &&
               peek() == '(') {
      pos_ = size_t(kw.data() - text_.data()); // an untagged op, no results
      if (auto e = parseOp())
        return std::move(e);
    } else if (kw == "stash" && graph_->stash().empty()) {
      if (auto e = parseStash())
        return std::move(e);
    } else if (kw == "update") {
      if (auto e = parseUpdate())
        return std::move(e);
    } else if (kw == "output") {
      auto v = parseValueUse();
      if (!v)
        return v.takeError();
      if (graph_->isOutput(*v))
        return error("value " + valueRef((*v)->name()) +
                     " is listed as an output twice");
      graph_->addOutput(*v);
    } else {
      return error("expected 'input', 'param', 'buffer', 'const', 'stash', "
                   "'update', 'output' or an op, found '" +
                   printable(kw.empty() ? text_.substr(pos_, 1) : kw) + "'");
    }
  }
  if (!atEnd())
    return error("unexpected text after the graph");
  return std::move(graph_);
}

} // namespace

llvm::Expected<std::unique_ptr<Graph>>
parseGraph(llvm::StringRef text, llvm::StringRef bufferName,
           const ParseOptions &opts) {
  return Parser(text, bufferName, opts).run();
}

} // namespace cleave::ir
