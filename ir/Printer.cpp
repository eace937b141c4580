#include "ir/Printer.h"

#include "llvm/Support/Format.h"

#include "llvm/ADT/StringExtras.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace cleave::ir {

static bool isBareNameChar(char c) {
  return llvm::isAlnum(c) || c == '_' || c == '.' || c == '-' || c == '/';
}

static std::string nameText(llvm::StringRef name) {
  bool bare = !name.empty() && llvm::all_of(name, isBareNameChar);
  return bare ? name.str() : quoteString(name);
}

std::string valueRef(llvm::StringRef name) { return "%" + nameText(name); }

static std::string elementText(const TensorData &d, int64_t i) {
  switch (d.type().dtype) {
  case DType::F64:
    return formatDouble(d.getDouble(i));
  case DType::F32:
  case DType::F16:
  case DType::BF16:
    return formatFloat(float(d.getDouble(i)));
  case DType::Bool:
    return d.getInt(i) ? "true" : "false";
  default:
    return std::to_string(d.getInt(i));
  }
}

// The `= ...` part of a declaration, or a tensor attribute's payload.
static std::string dataText(const TensorData &d, const PrintOptions &opts) {
  const DataOrigin &o = d.origin();
  int64_t n = d.type().numElements();
  // Data known only by reference prints as that reference whatever its
  // size: printing never loads files.
  if (llvm::ArrayRef<uint8_t> e = d.splatElement(); !e.empty()) {
    // Spelled out like any small tensor; one element when large.
    TensorData one(TensorType(d.type().dtype, {}), e.vec());
    if (n > opts.inlineLimit)
      return "splat<" + elementText(one, 0) + ">";
    std::string s = "dense<[";
    for (int64_t i = 0; i < n; ++i)
      s += (i ? ", " : "") + elementText(one, 0);
    return s + "]>";
  }
  bool small = n <= opts.inlineLimit && d.isLoaded();
  if (!small && o.kind == DataOrigin::Kind::OnnxInitializer)
    return "onnx<" + quoteString(o.path) + ", " + quoteString(o.key) + ">";
  if (!small && o.kind == DataOrigin::Kind::RawFile)
    return "file<" + quoteString(o.path) + ", " + std::to_string(o.offset) +
           ", " + std::to_string(o.length) + ">";
  if (d.type().rank() == 0)
    return "dense<" + elementText(d, 0) + ">";
  if (small) {
    std::string s = "dense<[";
    for (int64_t i = 0; i < n; ++i) {
      if (i)
        s += ", ";
      s += elementText(d, i);
    }
    return s + "]>";
  }
  if (d.isSplat())
    return "splat<" + elementText(d, 0) + ">";
  return "hex<\"" + llvm::toHex(llvm::ArrayRef(d.bytes()), true) + "\">";
}

static std::string attrText(const Attribute &a, const PrintOptions &opts) {
  auto list = [](const auto &vals, auto fmt) {
    std::string s = "[";
    for (size_t i = 0; i < vals.size(); ++i) {
      if (i)
        s += ", ";
      s += fmt(vals[i]);
    }
    return s + "]";
  };
  switch (a.kind()) {
  case AttrKind::Int:
    return std::to_string(a.getInt());
  case AttrKind::Float:
    return formatFloat(a.getFloat());
  case AttrKind::String:
    return quoteString(a.getString());
  case AttrKind::Ints:
    return list(a.getInts(), [](int64_t v) { return std::to_string(v); });
  case AttrKind::Floats:
    return list(a.getFloats(), formatFloat);
  case AttrKind::Strings:
    return list(a.getStrings(),
                [](const std::string &v) { return quoteString(v); });
  case AttrKind::Tensor:
    return a.getTensor()->type().str() + " " + dataText(*a.getTensor(), opts);
  }
  return "?";
}

void printGraph(const Graph &g, llvm::raw_ostream &os,
                const PrintOptions &opts) {
  os << "graph @" << nameText(g.name()) << " {\n";
  for (const Value *v : g.inputs())
    os << "  input " << valueRef(v->name()) << " : " << v->type().str()
       << "\n";
  for (const Value *v : g.declared())
    os << "  " << valueKindName(v->kind()) << " " << valueRef(v->name())
       << " : " << v->type().str() << " = " << dataText(*v->data(), opts)
       << "\n";
  bool tagged = g.isTraining();
  // Stage tags (the partition pass's), padded to the widest.
  int maxStage = -1;
  for (const auto &op : g.ops())
    maxStage = std::max(maxStage, op->stage());
  size_t stageWidth =
      maxStage < 0 ? 0 : std::to_string(maxStage).size() + 3;
  for (const auto &op : g.ops()) {
    os << "  ";
    if (maxStage >= 0)
      os << llvm::left_justify(
          op->stage() < 0 ? std::string()
                          : "[" + std::to_string(op->stage()) + "]",
          stageWidth);
    if (tagged)
      os << llvm::left_justify(llvm::StringRef(phaseName(op->phase()).data(),
                                              phaseName(op->phase()).size()),
                              4);
    for (unsigned i = 0; i < op->numResults(); ++i)
      os << (i ? ", " : "") << valueRef(op->result(i)->name());
    os << (op->numResults() ? " = " : "") << op->name() << "(";
    for (unsigned i = 0; i < op->numOperands(); ++i)
      os << (i ? ", " : "") << valueRef(op->operand(i)->name());
    os << ")";
    if (!op->attrs().empty()) {
      os << " {";
      bool first = true;
      for (const auto &[name, attr] : op->attrs()) {
        os << (first ? "" : ", ") << name << " = " << attrText(attr, opts);
        first = false;
      }
      os << "}";
    }
    if (op->numResults())
      os << " : ";
    for (unsigned i = 0; i < op->numResults(); ++i)
      os << (i ? ", " : "") << op->result(i)->type().str();
    if (!op->loc().empty())
      os << " @" << quoteString(op->loc());
    os << "\n";
  }
  if (!g.stash().empty()) {
    os << "  stash ";
    for (size_t i = 0; i < g.stash().size(); ++i)
      os << (i ? ", " : "") << valueRef(g.stash()[i]->name());
    os << "\n";
  }
  for (const StateUpdate &u : g.updates())
    os << "  update " << valueRef(u.state->name()) << " = "
       << valueRef(u.value->name()) << "\n";
  for (const Value *v : g.outputs())
    os << "  output " << valueRef(v->name()) << "\n";
  os << "}\n";
}

std::string printGraph(const Graph &g, const PrintOptions &opts) {
  std::string s;
  llvm::raw_string_ostream os(s);
  printGraph(g, os, opts);
  return os.str();
}

} // namespace cleave::ir
