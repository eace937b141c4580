// OpInfo: what the IR knows about each op kind, generated from Ops.def.
//
// Everything that depends on the op list (the OpKind enum, names, operand and
// result counts, attribute specs with defaults, differentiable operands, the
// result type rule, the cost class, the traits and the split of a combined
// gradient op into its B and W parts) is expanded from the single
// declaration in Ops.def. The passes (autodiff's gradient rules,
// split-backward, the cost model) and both backends (the CPU kernels'
// combined gradients, the CUDA lowering) read these records instead of
// keeping tables of their own.
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

// What an op costs, in the cost model's terms (passes/Cost.cpp gives each
// class its FLOPs per element; Product ops have per-op formulas there).
enum class CostClass : uint8_t {
  Free,           // moves or reinterprets data, no arithmetic
  Elementwise,    // a few operations per result element
  Transcendental, // exp, erf, tanh, ... per element
  Normalization,  // row statistics and a pass applying them
  Reduction,      // sums or maxima over axes
  Pooling,        // windows of an NCHW image
  Scatter,        // zeros and adds into a result (gradients of gathers)
  Product,        // matrix products and convolutions
  SgdUpdate,      // one SGD step per parameter element
  AdamUpdate,     // one AdamW step per parameter element
  Comm,           // a pipeline message
  HostCopy,       // a copy between device and host memory (offload)
};

// Op traits, or-ed together in Ops.def's Traits column.
namespace optrait {
enum : unsigned {
  None = 0,
  // The result is the operand's elements in the same row-major order.
  LayoutOnly = 1u << 0,
  // Results after the first are statistics, masks or indices: no gradient
  // flows back through them.
  AuxResults = 1u << 1,
  // Made by autodiff / by the optimizer pass (training ops: never imported).
  Gradient = 1u << 2,
  Optimizer = 1u << 3,
};
} // namespace optrait

// One part of a combined gradient op (Ops.def's CLEAVE_GRAD_SPLIT): its
// kind, which of the combined op's operands it takes (in its own order),
// and the operand whose shape its `shape` attribute records (-1: none).
struct GradientPart {
  OpKind kind;
  std::vector<unsigned> operands;
  int shapeOf;
};

// A combined gradient op (operands dY, X, W, ...; results dX, dW) split in
// two: part(0), the data part, makes result 0 and differentiates operand 1
// (X; an input gradient, phase B); part(1), the weight part, makes result 1
// and differentiates operand 2 (W, phase W when nothing else needs it).
struct GradientSplit {
  OpKind combined;
  GradientPart data, weight;
  // Split-backward leaves the op whole, in B (Ops.def's
  // CLEAVE_GRAD_KEEP_WHOLE).
  bool keptWhole = false;

  const GradientPart &part(unsigned result) const {
    return result == 0 ? data : weight;
  }
  // The combined op's operand that part `result` differentiates.
  static unsigned differentiates(unsigned result) { return 1 + result; }
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
  CostClass cost;
  unsigned traits; // optrait flags
  std::vector<AttrSpec> attrs; // sorted by name
  // Set for combined gradient ops (MatMulGrad, ...).
  std::optional<GradientSplit> split;
  // Set for the parts of a combined gradient op: the combined op.
  std::optional<OpKind> partOf;

  const AttrSpec *findAttr(std::string_view name) const;
  bool isDifferentiableOperand(unsigned i) const;
  bool has(unsigned trait) const { return (traits & trait) == trait; }
};

const OpInfo &opInfo(OpKind kind);
// The split of a combined gradient op, or null for any other op.
const GradientSplit *gradientSplit(OpKind kind);
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

// Every op may carry `recompute_of = "<value>"`: it is a clone, in the
// backward, of the forward op that made <value> (passes/Recompute.h).
inline constexpr std::string_view kRecomputeOfAttr = "recompute_of";

// Checks an AttrMap against the op's spec: no unknown names, required ones
// present, kinds right.
llvm::Error checkAttributes(const OpInfo &info, const AttrMap &attrs);

} // namespace cleave::ir
