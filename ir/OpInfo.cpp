// Builds the OpInfo table from Ops.def: parses its attribute specs and
// operand lists, and attaches each combined gradient op's split to the
// combined op and its parts.
#include "ir/OpInfo.h"

#include "ir/TypeRules.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace cleave::ir {

double decimalWidened(float f) {
  if (!std::isfinite(f))
    return f;
  char text[32];
  auto [end, ec] = std::to_chars(text, text + sizeof(text) - 1, f);
  if (ec != std::errc())
    return f;
  *end = 0;
  return std::strtod(text, nullptr);
}

std::string_view attrKindName(AttrKind k) {
  switch (k) {
  case AttrKind::Int:
    return "i";
  case AttrKind::Float:
    return "f";
  case AttrKind::String:
    return "s";
  case AttrKind::Ints:
    return "ints";
  case AttrKind::Floats:
    return "floats";
  case AttrKind::Strings:
    return "strings";
  case AttrKind::Tensor:
    return "t";
  }
  return "?";
}

// Parses one `name:kind[=default]` item of an Ops.def attribute spec. The
// specs are compiled in, so a malformed one is a programming error.
static AttrSpec parseAttrSpec(llvm::StringRef item) {
  auto [name, rest] = item.split(':');
  auto [kindStr, def] = rest.split('=');
  bool hasDefault = rest.contains('=');
  AttrSpec spec{name.str(), AttrKind::Int, std::nullopt, false};
  if (kindStr.consume_back("?"))
    spec.optional = true;
  if (kindStr == "i")
    spec.kind = AttrKind::Int;
  else if (kindStr == "f")
    spec.kind = AttrKind::Float;
  else if (kindStr == "s")
    spec.kind = AttrKind::String;
  else if (kindStr == "ints")
    spec.kind = AttrKind::Ints;
  else if (kindStr == "floats")
    spec.kind = AttrKind::Floats;
  else if (kindStr == "strings")
    spec.kind = AttrKind::Strings;
  else if (kindStr == "t")
    spec.kind = AttrKind::Tensor;
  else
    assert(false && "bad attribute kind in Ops.def");
  if (!hasDefault)
    return spec;
  switch (spec.kind) {
  case AttrKind::Int:
    spec.defaultValue = Attribute(int64_t(std::strtoll(def.str().c_str(),
                                                       nullptr, 10)));
    break;
  case AttrKind::Float:
    spec.defaultValue = Attribute(std::strtof(def.str().c_str(), nullptr));
    break;
  case AttrKind::String:
    spec.defaultValue = Attribute(def.str());
    break;
  case AttrKind::Ints:
    assert(def == "[]" && "only empty list defaults are supported");
    spec.defaultValue = Attribute(std::vector<int64_t>{});
    break;
  default:
    assert(false && "unsupported default kind in Ops.def");
  }
  return spec;
}

static std::vector<AttrSpec> parseAttrSpecs(llvm::StringRef specs) {
  std::vector<AttrSpec> out;
  llvm::SmallVector<llvm::StringRef, 8> items;
  specs.split(items, ' ', -1, false);
  for (llvm::StringRef item : items)
    out.push_back(parseAttrSpec(item));
  std::sort(out.begin(), out.end(),
            [](auto &a, auto &b) { return a.name < b.name; });
  return out;
}

// "0 2" -> {0, 2}: a CLEAVE_GRAD_SPLIT operand list.
static std::vector<unsigned> parseOperandList(llvm::StringRef list) {
  std::vector<unsigned> out;
  llvm::SmallVector<llvm::StringRef, 6> items;
  list.split(items, ' ', -1, false);
  for (llvm::StringRef item : items)
    out.push_back(unsigned(std::strtoul(item.str().c_str(), nullptr, 10)));
  return out;
}

static const std::vector<OpInfo> &table() {
  static const std::vector<OpInfo> ops = [] {
    std::vector<OpInfo> v;
    using namespace optrait;
#define CLEAVE_OP(Name, MinIn, MaxIn, MinOut, MaxOut, Rule, Diff, Cost,        \
                  Traits, Attrs)                                               \
  v.push_back(OpInfo{OpKind::Name, #Name, MinIn, MaxIn, MinOut, MaxOut,        \
                     &typerules::Rule, Diff, CostClass::Cost, Traits,          \
                     parseAttrSpecs(Attrs), std::nullopt, std::nullopt});
#define CLEAVE_GRAD_SPLIT(Combined, Data, DataOps, DataShape, Weight,          \
                          WeightOps, WeightShape)                              \
  v[size_t(OpKind::Combined)].split = GradientSplit{                           \
      OpKind::Combined,                                                        \
      {OpKind::Data, parseOperandList(DataOps), DataShape},                    \
      {OpKind::Weight, parseOperandList(WeightOps), WeightShape}};             \
  v[size_t(OpKind::Data)].partOf = OpKind::Combined;                           \
  v[size_t(OpKind::Weight)].partOf = OpKind::Combined;
#define CLEAVE_GRAD_KEEP_WHOLE(Combined)                                       \
  v[size_t(OpKind::Combined)].split->keptWhole = true;
#include "ir/Ops.def"
#undef CLEAVE_OP
    return v;
  }();
  return ops;
}

bool isTrainingOp(OpKind kind) {
  return opInfo(kind).traits & (optrait::Gradient | optrait::Optimizer);
}

const GradientSplit *gradientSplit(OpKind kind) {
  const auto &s = opInfo(kind).split;
  return s ? &*s : nullptr;
}

const OpInfo &opInfo(OpKind kind) { return table()[size_t(kind)]; }

llvm::ArrayRef<OpInfo> allOps() { return table(); }

std::optional<OpKind> lookupOp(std::string_view name) {
  static const llvm::StringMap<OpKind> byName = [] {
    llvm::StringMap<OpKind> m;
    for (const OpInfo &i : table())
      m[llvm::StringRef(i.name.data(), i.name.size())] = i.kind;
    return m;
  }();
  auto it = byName.find(llvm::StringRef(name.data(), name.size()));
  if (it == byName.end())
    return std::nullopt;
  return it->second;
}

const AttrSpec *OpInfo::findAttr(std::string_view n) const {
  for (const AttrSpec &a : attrs)
    if (a.name == n)
      return &a;
  return nullptr;
}

bool OpInfo::isDifferentiableOperand(unsigned i) const {
  if (diff.empty())
    return false;
  char c = i < diff.size() ? diff[i] : diff.back();
  return c == 'd';
}

const Attribute &attrOrDefault(const OpInfo &info, const AttrMap &attrs,
                               std::string_view name) {
  auto it = attrs.find(name);
  if (it != attrs.end())
    return it->second;
  const AttrSpec *spec = info.findAttr(name);
  assert(spec && spec->defaultValue && "attribute has no default");
  return *spec->defaultValue;
}

const Attribute &TypeQuery::get(std::string_view n) const {
  return attrOrDefault(info, attrs, n);
}
int64_t TypeQuery::getInt(std::string_view n) const { return get(n).getInt(); }
float TypeQuery::getFloat(std::string_view n) const {
  return get(n).getFloat();
}
const std::string &TypeQuery::getString(std::string_view n) const {
  return get(n).getString();
}
const std::vector<int64_t> &TypeQuery::getInts(std::string_view n) const {
  return get(n).getInts();
}

llvm::Error checkAttributes(const OpInfo &info, const AttrMap &attrs) {
  for (const auto &[name, value] : attrs) {
    const AttrSpec *spec = info.findAttr(name);
    if (name == kRecomputeOfAttr && value.kind() == AttrKind::String)
      continue;
    if (!spec)
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          llvm::formatv("unknown attribute '{0}'", name).str());
    if (spec->kind != value.kind())
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          llvm::formatv("attribute '{0}' must be of kind {1}, not {2}", name,
                        attrKindName(spec->kind), attrKindName(value.kind()))
              .str());
  }
  for (const AttrSpec &spec : info.attrs)
    if (spec.required() && !attrs.count(spec.name))
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          llvm::formatv("missing required attribute '{0}'", spec.name).str());
  return llvm::Error::success();
}

llvm::Expected<std::vector<TensorType>>
inferResultTypes(OpKind kind, llvm::ArrayRef<TensorType> operands,
                 const AttrMap &attrs, unsigned numResults) {
  const OpInfo &info = opInfo(kind);
  auto countErr = [](const char *what, size_t n, int lo, int hi) {
    std::string range = hi < 0    ? "at least " + std::to_string(lo)
                        : lo == hi ? std::to_string(lo)
                                   : std::to_string(lo) + " to " +
                                         std::to_string(hi);
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        llvm::formatv("has {0} {1}, expected {2}", n, what, range).str());
  };
  if (int(operands.size()) < info.minOperands ||
      (info.maxOperands >= 0 && int(operands.size()) > info.maxOperands))
    return countErr("operands", operands.size(), info.minOperands,
                    info.maxOperands);
  if (int(numResults) < info.minResults ||
      (info.maxResults >= 0 && int(numResults) > info.maxResults))
    return countErr("results", numResults, info.minResults, info.maxResults);
  if (llvm::Error e = checkAttributes(info, attrs))
    return std::move(e);
  TypeQuery q{info, operands, attrs, numResults};
  return info.typeRule(q);
}

} // namespace cleave::ir
