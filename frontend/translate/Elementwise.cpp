// Elementwise ONNX ops: unary math, binary math and comparisons with NumPy
// broadcasting, Where, Clip and the casts. Most map 1:1 to the IR op of the
// same name; Clip's bounds and Cast's target become attributes, CastLike is
// a Cast to its second input's type, and a Cast to the operand's own type
// or a Where whose constant condition picks one side is an Identity.
#include "frontend/translate/Translation.h"

#include "frontend/OnnxNode.h"
#include "frontend/OnnxTensor.h"
#include "ir/TypeRules.h"

namespace cleave::frontend {

using namespace cleave::ir;

// Clip-11 and later: `min` and `max` are optional constant scalar inputs.
static llvm::Error translateClip(ImportContext &ctx, const onnx::NodeProto &n,
                                 int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Clip);
  if (!operands)
    return operands.takeError();
  AttrMap attrs;
  for (int k : {1, 2}) {
    auto bound = ctx.staticScalar(n, index, k, k == 1 ? "min" : "max");
    if (!bound)
      return bound.takeError();
    if (*bound)
      attrs.emplace(k == 1 ? "min" : "max",
                    Attribute(float((*bound)->getDouble(0))));
  }
  return ctx.emit(n, index, OpKind::Clip, std::move(*operands),
                  std::move(attrs));
}

// A Cast to uint8 that did not fold would compute on uint8 at run time
// (ImportContext refuses uint8 in the graph; the IR text has no u8).
static llvm::Error castToUint8(const onnx::NodeProto &n, int index,
                               const Shape &shape) {
  return importError("{0}: computes on uint8 data ({1}) at run time; cleave "
                     "takes uint8 only in shape arithmetic it folds at import",
                     describeNode(n, index), TensorType(DType::U8, shape).str());
}

static llvm::Error translateCast(ImportContext &ctx, const onnx::NodeProto &n,
                                 int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Cast);
  if (!operands)
    return operands.takeError();
  auto dt = dtypeFromOnnx(attrInt(n, "to", 0));
  if (!dt)
    return importError("{0}: {1}", describeNode(n, index),
                       llvm::toString(dt.takeError()));
  if (*dt == DType::U8)
    return castToUint8(n, index, (*operands)[0]->type().shape);
  if (*dt == (*operands)[0]->type().dtype) // as function bodies write them
    return ctx.emit(n, index, OpKind::Identity, std::move(*operands), {},
                    false);
  return ctx.emit(n, index, OpKind::Cast, std::move(*operands),
                  {{"to", Attribute(std::string(dtypeName(*dt)))}});
}

// Cast to the element type of the second input.
static llvm::Error translateCastLike(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index) {
  ImportContext::Entry *like = ctx.input(n, 1);
  if (!like)
    return importError("{0}: input 1 is missing", describeNode(n, index));
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  if (like->type.dtype == DType::U8)
    return castToUint8(n, index, (*x)->type().shape);
  return ctx.emit(n, index, OpKind::Cast, {*x},
                  {{"to", Attribute(std::string(dtypeName(like->type.dtype)))}},
                  false);
}

static llvm::Error translateWhere(ImportContext &ctx, const onnx::NodeProto &n,
                                  int index) {
  auto operands = ctx.tensorOperands(n, index, OpKind::Where);
  if (!operands)
    return operands.takeError();
  std::vector<Value *> &ops = *operands;
  if (ops.size() == 3 && ctx.input(n, 0)->foldable) {
    // A constant condition that picks one side everywhere is that side
    // (Attention's function body zeroes the rows whose bias is all -inf;
    // usually there are none).
    const TensorData &cond = *ctx.input(n, 0)->data;
    int64_t count = cond.type().numElements(), set = 0;
    for (int64_t i = 0; i < count; ++i)
      set += cond.getInt(i) != 0;
    int pick = count > 0 && set == count ? 1 : set == 0 ? 2 : 0;
    auto types = inferResultTypes(
        OpKind::Where, {ops[0]->type(), ops[1]->type(), ops[2]->type()}, {}, 1);
    if (!types)
      return importError("{0}: {1}", describeNode(n, index),
                         llvm::toString(types.takeError()));
    if (pick && (*types)[0] == ops[pick]->type())
      return ctx.emit(n, index, OpKind::Identity, {ops[pick]}, {}, false);
  }
  return ctx.emit(n, index, OpKind::Where, std::move(ops), {});
}

// Identity renames a value, except where the dynamo exporter wrote
// PyTorch's detach() (aten.detach) as one: its node metadata says so
// (`namespace` ends with the aten op, and `pkg.torch.onnx.fx_node` names
// it), and the gradient stops there (StopGradient). The legacy exporter
// drops detach() altogether; check_export (examples/pytorch) finds that
// by comparing gradients with PyTorch's.
static bool isDetach(const onnx::NodeProto &n) {
  for (const auto &p : n.metadata_props()) {
    llvm::StringRef v(p.value());
    if ((p.key() == "namespace" && v.endswith("aten.detach.default")) ||
        (p.key() == "pkg.torch.onnx.fx_node" &&
         v.contains("target=torch.ops.aten.detach.default")))
      return true;
  }
  return false;
}

static llvm::Error translateIdentity(ImportContext &ctx,
                                     const onnx::NodeProto &n, int index) {
  OpKind kind = isDetach(n) ? OpKind::StopGradient : OpKind::Identity;
  auto operands = ctx.tensorOperands(n, index, kind);
  if (!operands)
    return operands.takeError();
  return ctx.emit(n, index, kind, std::move(*operands), {});
}

// BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot (opset 18; integers): the
// IR's And, Or, Xor and Not, bitwise on integer operands.
static llvm::Error translateBitwise(ImportContext &ctx,
                                    const onnx::NodeProto &n, int index) {
  llvm::StringRef op(n.op_type());
  OpKind kind = op == "BitwiseAnd"  ? OpKind::And
                : op == "BitwiseOr" ? OpKind::Or
                : op == "BitwiseXor" ? OpKind::Xor
                                     : OpKind::Not;
  auto operands = ctx.tensorOperands(n, index, kind);
  if (!operands)
    return operands.takeError();
  return ctx.emit(n, index, kind, std::move(*operands), {});
}

std::vector<OpTranslation> elementwiseTranslations() {
  std::vector<OpTranslation> t;
  // Unary.
  for (const char *op :
       {"Abs", "Ceil", "Cos", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid",
        "HardSwish", "IsInf", "IsNaN", "LeakyRelu", "Log", "Neg",
        "Not", "Reciprocal", "Relu", "Round", "Sigmoid", "Sign", "Sin",
        "Sqrt", "Tanh", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
        "Acosh", "Atanh"})
    t.push_back(sameNamedOp(op));
  // Binary and variadic, NumPy broadcasting.
  for (const char *op :
       {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Greater",
        "GreaterOrEqual", "Less", "LessOrEqual", "Mod", "And", "Or", "Xor"})
    t.push_back(sameNamedOp(op));
  for (const char *op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"})
    t.push_back({op, 18, kOpsetLast, translateBitwise});
  t.push_back({"Identity", kOpsetFirst, kOpsetLast, translateIdentity});
  t.push_back({"Where", kOpsetFirst, kOpsetLast, translateWhere});
  t.push_back({"Clip", kOpsetFirst, kOpsetLast, translateClip});
  t.push_back({"Cast",
               kOpsetFirst,
               kOpsetLast,
               translateCast,
               TranslationKind::Op,
               {"to"}});
  t.push_back({"CastLike", kOpsetFirst, kOpsetLast, translateCastLike});
  return t;
}

} // namespace cleave::frontend
