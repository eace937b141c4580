// OpInfo: what the IR knows about each op kind, generated from Ops.def.
//
// Everything that depends on the op list (the OpKind enum, names, operand and
// result counts, attribute specs with defaults, differentiable operands, the
// result type rule) is expanded from the single declaration in Ops.def.
#pragma once

#include "ir/Attribute.h"
#include "ir/Type.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string_view>
#include <vector>

namespace cleave::ir {

enum class OpKind : uint16_t {
#define CLEAVE_OP(Name, ...) Name,
#include "ir/Ops.def"
#undef CLEAVE_OP
};

struct AttrSpec {
  std::string name;
  AttrKind kind;
  std::optional<Attribute> defaultValue;
  // Optional with no default (spec `name:kind?`): absence has a meaning of
  // its own, so readers test hasAttr() first.
  bool optional = false;
  bool required() const { return !optional && !defaultValue.has_value(); }
};

struct OpInfo;

// What a type rule sees: operand types, attributes, and how many results the
// op has (for ops with optional results).
struct TypeQuery {
  const OpInfo &info;
  llvm::ArrayRef<TensorType> operands;
  const AttrMap &attrs;
  unsigned numResults;

  // Attribute value or the declared default (which must exist).
  int64_t getInt(std::string_view name) const;
  float getFloat(std::string_view name) const;
  const std::string &getString(std::string_view name) const;
  const std::vector<int64_t> &getInts(std::string_view name) const;
  const Attribute &get(std::string_view name) const;
};

using TypeRule =
    llvm::Expected<std::vector<TensorType>> (*)(const TypeQuery &q);

struct OpInfo {
  OpKind kind;
  std::string_view name;
  int minOperands, maxOperands; // maxOperands -1: unbounded
  int minResults, maxResults;
  TypeRule typeRule;
  std::string_view diff;
  std::vector<AttrSpec> attrs; // sorted by name

  const AttrSpec *findAttr(std::string_view name) const;
  bool isDifferentiableOperand(unsigned i) const;
};

const OpInfo &opInfo(OpKind kind);
// True for the ops passes make (gradients, optimizer updates), which are not
// ONNX ops and never come from an imported model.
bool isTrainingOp(OpKind kind);
std::optional<OpKind> lookupOp(std::string_view name);
llvm::ArrayRef<OpInfo> allOps();

// `attrs[name]`, or the op's declared default when the attribute is not set
// (which must exist). Shared by Op, TypeQuery and the kernels' KernelCall.
const Attribute &attrOrDefault(const OpInfo &info, const AttrMap &attrs,
                               std::string_view name);

// Computes result types for an op of `kind` with the given operand types and
// attributes, checking operand counts, attributes and shape constraints on
// the way. Errors say what is wrong without naming the op instance; callers
// add that.
llvm::Expected<std::vector<TensorType>>
inferResultTypes(OpKind kind, llvm::ArrayRef<TensorType> operands,
                 const AttrMap &attrs, unsigned numResults);

// Checks an AttrMap against the op's spec: no unknown names, required ones
// present, kinds right.
llvm::Error checkAttributes(const OpInfo &info, const AttrMap &attrs);

} // namespace cleave::ir
