// The gradient rule of every differentiable op (docs/design/training.md
// lists them by family), and the builder they emit through.
#include "passes/GradientBuilder.h"

#include "ir/PadIndex.h"
#include "ir/TypeRules.h"

#include "llvm/Support/ErrorHandling.h"

#include <cassert>
#include <numeric>

namespace cleave::passes::grad {

using ir::AttrMap;
using ir::OpKind;
using ir::Value;

// --- Builder ---------------------------------------------------------------

void Builder::setSource(const ir::Op *fwd) {
  loc_ = fwd->loc();
  base_ = "grad." + fwd->result(0)->name() + ".t";
}

std::vector<Value *> Builder::emitN(OpKind kind,
                                    llvm::ArrayRef<Value *> operands,
                                    AttrMap attrs, unsigned numResults) {
  std::vector<ir::TensorType> in;
  for (Value *v : operands)
    in.push_back(v->type());
  auto types = ir::inferResultTypes(kind, in, attrs, numResults);
  if (!types)
    llvm::report_fatal_error(
        llvm::Twine("internal error: gradient op ") +
        std::string(ir::opInfo(kind).name) + " for " + loc_ + ": " +
        llvm::toString(types.takeError()));
  std::vector<std::string> names(numResults, base_);
  ir::Op *op = g_.appendOp(kind, operands, *types, names, std::move(attrs),
                           loc_);
  return std::vector<Value *>(op->results().begin(), op->results().end());
}

Value *Builder::emit(OpKind kind, llvm::ArrayRef<Value *> operands,
                     AttrMap attrs) {
  return emitN(kind, operands, std::move(attrs), 1)[0];
}

Value *Builder::scalar(double v, ir::DType dtype) {
  Value *&c = scalars_[{int(dtype), v}];
  if (!c)
    c = g_.addConst(g_.uniqueName("grad.const"),
                    ir::TensorData::fromDoubles(dtype, {}, {v}));
  return c;
}

Value *Builder::zeros(const ir::TensorType &type) {
  return g_.addConst(
      g_.uniqueName("grad.zeros"),
      std::make_shared<ir::TensorData>(type,
                                       std::string(type.byteSize(), '\0')));
}

Value *Builder::sumTo(Value *v, llvm::ArrayRef<int64_t> shape) {
  if (llvm::ArrayRef<int64_t>(v->type().shape) == shape)
    return v;
  return emit(OpKind::SumTo, {v},
              {{"shape", std::vector<int64_t>(shape.begin(), shape.end())}});
}

Value *Builder::reshape(Value *v, llvm::ArrayRef<int64_t> shape) {
  if (llvm::ArrayRef<int64_t>(v->type().shape) == shape)
    return v;
  return emit(OpKind::Reshape, {v},
              {{"shape", std::vector<int64_t>(shape.begin(), shape.end())}});
}

// --- helpers ---------------------------------------------------------------

static std::vector<int64_t> shapeOf(const Value *v) {
  return std::vector<int64_t>(v->type().shape.begin(), v->type().shape.end());
}

static llvm::Error noRule(const ir::Op &op, const llvm::Twine &why) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "no gradient rule for " + op.describe() +
                                     ": " + why);
}

// Copies the named attributes of the forward op (with defaults filled in).
static AttrMap copyAttrs(const ir::Op &op,
                         std::initializer_list<const char *> names) {
  AttrMap a;
  for (const char *n : names)
    if (op.hasAttr(n) || op.info().findAttr(n)->defaultValue)
      a.emplace(n, op.attr(n));
  return a;
}

static AttrMap with(AttrMap a, const char *name, ir::Attribute v) {
  a.insert_or_assign(name, std::move(v));
  return a;
}

// The shape `x` has after reducing `axes` with keepdims.
static std::vector<int64_t> keptShape(const Value *x,
                                      const std::vector<int64_t> &axes) {
  std::vector<int64_t> s = shapeOf(x);
  int64_t r = s.size();
  if (axes.empty())
    std::fill(s.begin(), s.end(), 1);
  for (int64_t a : axes)
    s[a < 0 ? a + r : a] = 1;
  return s;
}

// Spatial axes of an [N, C, ...] tensor plus the batch axis: what a
// per-channel bias or scale gradient sums over.
static std::vector<int64_t> nonChannelAxes(const Value *x) {
  std::vector<int64_t> axes{0};
  for (size_t i = 2; i < x->type().rank(); ++i)
    axes.push_back(i);
  return axes;
}

// --- rules -----------------------------------------------------------------

static llvm::Error unaryRule(RuleContext &c, const char *fn, AttrMap extra) {
  c.dX[0] = c.b.emit(OpKind::UnaryGrad, {c.dY[0], c.in(0)},
                     with(std::move(extra), "fn", fn));
  return llvm::Error::success();
}

#define UNARY(Name, fn)                                                        \
  static llvm::Error rule##Name(RuleContext &c) {                             \
    return unaryRule(c, fn, {});                                               \
  }
UNARY(Abs, "abs")
UNARY(Cos, "cos")
UNARY(Sin, "sin")
UNARY(Erf, "erf")
UNARY(Exp, "exp")
UNARY(Log, "log")
UNARY(Reciprocal, "reciprocal")
UNARY(Relu, "relu")
UNARY(Sigmoid, "sigmoid")
UNARY(Sqrt, "sqrt")
UNARY(Tanh, "tanh")
UNARY(Tan, "tan")
UNARY(Asin, "asin")
UNARY(Acos, "acos")
UNARY(Atan, "atan")
UNARY(Sinh, "sinh")
UNARY(Cosh, "cosh")
UNARY(Asinh, "asinh")
UNARY(Acosh, "acosh")
UNARY(Atanh, "atanh")
#undef UNARY

static llvm::Error ruleLeakyRelu(RuleContext &c) {
  return unaryRule(c, "leaky_relu", copyAttrs(c.op, {"alpha"}));
}

static llvm::Error ruleGelu(RuleContext &c) {
  bool tanhForm = c.op.getString("approximate") == "tanh";
  return unaryRule(c, tanhForm ? "gelu_tanh" : "gelu", {});
}

static llvm::Error ruleSilu(RuleContext &c) {
  return unaryRule(c, "silu", {});
}

static llvm::Error ruleHardSigmoid(RuleContext &c) {
  return unaryRule(c, "hard_sigmoid", copyAttrs(c.op, {"alpha", "beta"}));
}

static llvm::Error ruleHardSwish(RuleContext &c) {
  return unaryRule(c, "hard_swish", {});
}

static llvm::Error ruleClip(RuleContext &c) {
  return unaryRule(c, "clip", copyAttrs(c.op, {"min", "max"}));
}

static llvm::Error ruleIdentity(RuleContext &c) {
  c.dX[0] = c.dY[0];
  return llvm::Error::success();
}

static llvm::Error ruleNeg(RuleContext &c) {
  c.dX[0] = c.b.emit(OpKind::Neg, {c.dY[0]});
  return llvm::Error::success();
}

static llvm::Error ruleCast(RuleContext &c) {
  c.dX[0] = c.b.emit(OpKind::Cast, {c.dY[0]},
                     {{"to", std::string(ir::dtypeName(c.in(0)->type().dtype))}});
  return llvm::Error::success();
}

static llvm::Error ruleAdd(RuleContext &c) {
  for (unsigned i = 0; i < 2; ++i)
    if (c.needs[i])
      c.dX[i] = c.b.sumTo(c.dY[0], shapeOf(c.in(i)));
  return llvm::Error::success();
}

static llvm::Error ruleSub(RuleContext &c) {
  if (c.needs[0])
    c.dX[0] = c.b.sumTo(c.dY[0], shapeOf(c.in(0)));
  if (c.needs[1])
    c.dX[1] = c.b.emit(OpKind::Neg, {c.b.sumTo(c.dY[0], shapeOf(c.in(1)))});
  return llvm::Error::success();
}

static llvm::Error ruleMul(RuleContext &c) {
  for (unsigned i = 0; i < 2; ++i)
    if (c.needs[i])
      c.dX[i] = c.b.sumTo(c.b.mul(c.dY[0], c.in(1 - i)), shapeOf(c.in(i)));
  return llvm::Error::success();
}

static llvm::Error ruleDiv(RuleContext &c) {
  Value *q = c.b.emit(OpKind::Div, {c.dY[0], c.in(1)}); // dY / B
  if (c.needs[0])
    c.dX[0] = c.b.sumTo(q, shapeOf(c.in(0)));
  if (c.needs[1]) // -dY * A / B^2 = -(dY / B) * Y
    c.dX[1] = c.b.sumTo(c.b.emit(OpKind::Neg, {c.b.mul(q, c.out())}),
                        shapeOf(c.in(1)));
  return llvm::Error::success();
}

static llvm::Error rulePow(RuleContext &c) {
  ir::DType t = c.in(0)->type().dtype;
  Value *b = c.in(1);
  if (b->type().dtype != t)
    b = c.b.emit(OpKind::Cast, {b}, {{"to", std::string(ir::dtypeName(t))}});
  if (c.needs[0]) { // dY * B * A^(B-1)
    Value *bm1 = c.b.emit(OpKind::Sub, {b, c.b.scalar(1.0, t)});
    Value *d = c.b.mul(c.dY[0], c.b.mul(b, c.b.emit(OpKind::Pow,
                                                     {c.in(0), bm1})));
    c.dX[0] = c.b.sumTo(d, shapeOf(c.in(0)));
  }
  if (c.needs[1]) { // dY * Y * log(A)
    Value *d = c.b.mul(c.b.mul(c.dY[0], c.out()),
                       c.b.emit(OpKind::Log, {c.in(0)}));
    c.dX[1] = c.b.sumTo(d, shapeOf(c.in(1)));
  }
  return llvm::Error::success();
}

// Max / Min: the gradient goes to every operand equal to the result.
static llvm::Error ruleMaxMin(RuleContext &c) {
  Value *zero = c.b.scalar(0.0, c.dY[0]->type().dtype);
  for (unsigned i = 0; i < c.op.numOperands(); ++i)
    if (c.needs[i]) {
      Value *hit = c.b.emit(OpKind::Equal, {c.in(i), c.out()});
      c.dX[i] = c.b.sumTo(c.b.emit(OpKind::Where, {hit, c.dY[0], zero}),
                          shapeOf(c.in(i)));
    }
  return llvm::Error::success();
}

static llvm::Error ruleWhere(RuleContext &c) {
  Value *zero = c.b.scalar(0.0, c.dY[0]->type().dtype);
  if (c.needs[1])
    c.dX[1] = c.b.sumTo(c.b.emit(OpKind::Where, {c.in(0), c.dY[0], zero}),
                        shapeOf(c.in(1)));
  if (c.needs[2])
    c.dX[2] = c.b.sumTo(c.b.emit(OpKind::Where, {c.in(0), zero, c.dY[0]}),
                        shapeOf(c.in(2)));
  return llvm::Error::success();
}

// Ops whose data and weight gradients come from one combined op (split
// later by split-backward) or, when only one is needed, from its part: the
// part is what split-backward would make of the combined op (its operands
// and `shape` attribute from the op record's split, ir/Ops.def).
static void emitPair(RuleContext &c, OpKind combined,
                     std::vector<Value *> combinedOperands,
                     const AttrMap &attrs) {
  if (c.needs[0] && c.needs[1]) {
    auto r = c.b.emitN(combined, combinedOperands, attrs, 2);
    c.dX[0] = r[0];
    c.dX[1] = r[1];
    return;
  }
  const ir::GradientSplit *split = ir::gradientSplit(combined);
  assert(split && "emitPair on an op without a gradient split");
  for (unsigned i = 0; i < 2; ++i) {
    if (!c.needs[i])
      continue;
    const ir::GradientPart &p = split->part(i);
    std::vector<Value *> operands;
    for (unsigned k : p.operands)
      operands.push_back(combinedOperands[k]);
    AttrMap a = attrs;
    if (p.shapeOf >= 0)
      a = with(std::move(a), "shape", shapeOf(combinedOperands[p.shapeOf]));
    c.dX[i] = c.b.emit(p.kind, operands, std::move(a));
    return; // only one of the two is needed here
  }
}

// A 1-D operand (torch.dot, mv, a spectral norm's power iteration) is a
// matrix of one row (A) or one column (B), the result without that dim:
// the gradients of those matrices, reshaped back.
static llvm::Error ruleMatMul(RuleContext &c) {
  Value *a = c.in(0), *b = c.in(1), *dY = c.dY[0];
  bool aVec = a->type().rank() == 1, bVec = b->type().rank() == 1;
  if (!aVec && !bVec) {
    emitPair(c, OpKind::MatMulGrad, {dY, a, b}, {});
    return llvm::Error::success();
  }
  ir::Shape dShape = dY->type().shape;
  if (aVec) {
    a = c.b.reshape(a, {1, a->type().shape[0]});
    dShape.insert(dShape.end() - (bVec ? 0 : 1), 1);
  }
  if (bVec) {
    b = c.b.reshape(b, {b->type().shape[0], 1});
    dShape.push_back(1);
  }
  emitPair(c, OpKind::MatMulGrad, {c.b.reshape(dY, dShape), a, b}, {});
  for (unsigned i = 0; i < 2; ++i)
    if (c.dX[i] && c.dX[i]->type().shape != c.in(i)->type().shape)
      c.dX[i] = c.b.reshape(c.dX[i], c.in(i)->type().shape);
  return llvm::Error::success();
}

static llvm::Error ruleGemm(RuleContext &c) {
  AttrMap attrs = copyAttrs(c.op, {"alpha", "transA", "transB"});
  emitPair(c, OpKind::GemmGrad, {c.dY[0], c.in(0), c.in(1)}, attrs);
  if (c.op.numOperands() == 3 && c.needs[2]) {
    Value *d = c.b.sumTo(c.dY[0], shapeOf(c.in(2)));
    float beta = c.op.getFloat("beta");
    if (beta != 1.0f)
      d = c.b.mul(d, c.b.scalar(beta, d->type().dtype));
    c.dX[2] = d;
  }
  return llvm::Error::success();
}

static llvm::Error ruleConv(RuleContext &c) {
  AttrMap attrs = copyAttrs(c.op, {"dilations", "group", "pads", "strides"});
  emitPair(c, OpKind::ConvGrad, {c.dY[0], c.in(0), c.in(1)}, attrs);
  if (c.op.numOperands() == 3 && c.needs[2])
    c.dX[2] = c.b.emit(OpKind::ReduceSum, {c.dY[0]},
                       {{"axes", nonChannelAxes(c.dY[0])},
                        {"keepdims", int64_t(0)}});
  return llvm::Error::success();
}

// ConvTranspose (ConvGradData's arithmetic as a forward op): Y =
// Conv_W^T(X), so dX = Conv(dY, W) and dW = ConvGradFilter(dY, X), the
// convolution's own filter gradient with dY as its input.
static llvm::Error ruleConvTranspose(RuleContext &c) {
  AttrMap attrs = copyAttrs(c.op, {"dilations", "group", "pads", "strides"});
  if (c.needs[0])
    c.dX[0] = c.b.emit(OpKind::Conv, {c.dY[0], c.in(1)}, attrs);
  if (c.needs[1])
    c.dX[1] = c.b.emit(OpKind::ConvGradFilter, {c.dY[0], c.in(0)},
                       with(attrs, "shape", shapeOf(c.in(1))));
  return llvm::Error::success();
}

static llvm::Error ruleLayerNorm(RuleContext &c) {
  AttrMap attrs = copyAttrs(c.op, {"axis", "epsilon"});
  emitPair(c, OpKind::LayerNormalizationGrad, {c.dY[0], c.in(0), c.in(1)},
           attrs);
  if (c.dX[1]) // the scale may broadcast to the normalized shape
    c.dX[1] = c.b.sumTo(c.dX[1], shapeOf(c.in(1)));
  if (c.op.numOperands() == 3 && c.needs[2])
    c.dX[2] = c.b.sumTo(c.dY[0], shapeOf(c.in(2)));
  return llvm::Error::success();
}

static llvm::Error ruleRMSNorm(RuleContext &c) {
  AttrMap attrs = copyAttrs(c.op, {"axis", "epsilon"});
  emitPair(c, OpKind::RMSNormalizationGrad, {c.dY[0], c.in(0), c.in(1)},
           attrs);
  if (c.dX[1]) // the scale may broadcast to the normalized shape
    c.dX[1] = c.b.sumTo(c.dX[1], shapeOf(c.in(1)));
  return llvm::Error::success();
}

static llvm::Error ruleBatchNorm(RuleContext &c) {
  AttrMap attrs = copyAttrs(c.op, {"epsilon", "training_mode"});
  Value *mean = c.in(3), *var = c.in(4);
  emitPair(c, OpKind::BatchNormalizationGrad,
           {c.dY[0], c.in(0), c.in(1), mean, var}, attrs);
  if (c.needs[2])
    c.dX[2] = c.b.emit(OpKind::ReduceSum, {c.dY[0]},
                       {{"axes", nonChannelAxes(c.dY[0])},
                        {"keepdims", int64_t(0)}});
  return llvm::Error::success();
}

static llvm::Error ruleSoftmax(RuleContext &c) {
  OpKind k = c.op.kind() == OpKind::Softmax ? OpKind::SoftmaxGrad
                                            : OpKind::LogSoftmaxGrad;
  c.dX[0] = c.b.emit(k, {c.dY[0], c.out()}, copyAttrs(c.op, {"axis"}));
  return llvm::Error::success();
}

// One gradient op for Q, K and V (all input gradients: B work). The mask
// is declared differentiable only so that a mask that needs a gradient (a
// learned bias) is refused here rather than silently left untrained;
// recognize-attention never fuses one.
static llvm::Error ruleFusedAttention(RuleContext &c) {
  if (c.op.numOperands() == 4 && c.needs[3])
    return noRule(c.op, "its mask depends on a trainable parameter");
  std::vector<Value *> ops{c.dY[0], c.in(0), c.in(1), c.in(2), c.out(0),
                           c.out(1)};
  if (c.op.numOperands() == 4)
    ops.push_back(c.in(3));
  AttrMap attrs = copyAttrs(c.op, {"causal", "scale"});
  // The layout of Q, K, V, dQ..., and their packing.
  for (const char *layout : {"seq_major", "time_major", "packed_kv_heads"})
    if (c.op.hasAttr(layout))
      attrs.emplace(layout, c.op.attr(layout));
  if (ir::attentionPackedKvHeads(c.op) > 0) {
    // Q, K and V are one tensor (operands 0 to 2): one gradient, given
    // once (the other two uses add nothing to it).
    c.dX[0] = c.b.emitN(OpKind::FusedAttentionGrad, ops, std::move(attrs),
                        1)[0];
    return llvm::Error::success();
  }
  auto d = c.b.emitN(OpKind::FusedAttentionGrad, ops, std::move(attrs), 3);
  for (unsigned i = 0; i < 3; ++i)
    if (c.needs[i])
      c.dX[i] = d[i];
  return llvm::Error::success();
}

static llvm::Error ruleSoftmaxCrossEntropy(RuleContext &c) {
  Value *d = nullptr;
  if (c.dY[0]) {
    std::vector<Value *> ops{c.dY[0], c.in(0), c.in(1)};
    if (c.op.numOperands() == 3)
      ops.push_back(c.in(2));
    AttrMap attrs = copyAttrs(c.op, {"reduction"});
    if (c.op.hasAttr("ignore_index"))
      attrs.emplace("ignore_index", c.op.attr("ignore_index"));
    d = c.b.emit(OpKind::SoftmaxCrossEntropyLossGrad, ops, attrs);
  }
  if (c.op.numResults() > 1 && c.dY[1]) { // log_prob used downstream
    Value *lp = c.b.emit(OpKind::LogSoftmaxGrad, {c.dY[1], c.out(1)},
                         {{"axis", int64_t(1)}});
    d = d ? c.b.emit(OpKind::Add, {d, lp}) : lp;
  }
  c.dX[0] = d;
  return llvm::Error::success();
}

static llvm::Error ruleDropout(RuleContext &c) {
  if (!c.op.getInt("training_mode") || c.op.getFloat("ratio") == 0.0f) {
    c.dX[0] = c.dY[0];
    return llvm::Error::success();
  }
  Value *mask = c.op.numResults() > 1
                    ? c.out(1)
                    : c.b.graph().appendResult(
                          &c.op,
                          ir::TensorType(ir::DType::Bool, c.out()->type().shape),
                          c.out()->name() + ".mask");
  c.dX[0] = c.b.emit(OpKind::DropoutGrad, {c.dY[0], mask},
                     copyAttrs(c.op, {"ratio"}));
  return llvm::Error::success();
}

static llvm::Error ruleReduce(RuleContext &c) {
  const auto &axes = c.op.getInts("axes");
  std::vector<int64_t> kept = keptShape(c.in(0), axes);
  Value *dy = c.b.reshape(c.dY[0], kept);
  std::vector<int64_t> full = shapeOf(c.in(0));
  switch (c.op.kind()) {
  case OpKind::ReduceSum:
    break;
  case OpKind::ReduceMean: {
    int64_t n = c.in(0)->type().numElements() /
                std::max<int64_t>(1, c.out()->type().numElements());
    dy = c.b.mul(dy, c.b.scalar(1.0 / double(std::max<int64_t>(n, 1)),
                                dy->type().dtype));
    break;
  }
  default: { // ReduceMax: to every element equal to the maximum
    Value *hit = c.b.emit(OpKind::Equal,
                          {c.in(0), c.b.reshape(c.out(), kept)});
    c.dX[0] = c.b.emit(OpKind::Where,
                       {hit, dy, c.b.scalar(0.0, dy->type().dtype)});
    return llvm::Error::success();
  }
  }
  c.dX[0] = c.b.emit(OpKind::Expand, {dy}, {{"shape", full}});
  return llvm::Error::success();
}

static llvm::Error ruleGlobalAveragePool(RuleContext &c) {
  int64_t n = c.in(0)->type().numElements() /
              std::max<int64_t>(1, c.out()->type().numElements());
  Value *dy = c.b.mul(c.dY[0], c.b.scalar(1.0 / double(std::max<int64_t>(n, 1)),
                                          c.dY[0]->type().dtype));
  c.dX[0] = c.b.emit(OpKind::Expand, {dy}, {{"shape", shapeOf(c.in(0))}});
  return llvm::Error::success();
}

static llvm::Error ruleReshapeLike(RuleContext &c) {
  c.dX[0] = c.b.reshape(c.dY[0], shapeOf(c.in(0)));
  return llvm::Error::success();
}

static llvm::Error ruleExpand(RuleContext &c) {
  c.dX[0] = c.b.sumTo(c.dY[0], shapeOf(c.in(0)));
  return llvm::Error::success();
}

static llvm::Error ruleTranspose(RuleContext &c) {
  const auto &perm = c.op.getInts("perm");
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i)
    inv[perm[i]] = i;
  c.dX[0] = c.b.emit(OpKind::Transpose, {c.dY[0]}, {{"perm", inv}});
  return llvm::Error::success();
}

// Trilu keeps a fixed set of elements: its gradient keeps the same ones.
static llvm::Error ruleTrilu(RuleContext &c) {
  c.dX[0] = c.b.emit(OpKind::Trilu, {c.dY[0]}, copyAttrs(c.op, {"k", "upper"}));
  return llvm::Error::success();
}

static llvm::Error ruleConcat(RuleContext &c) {
  int64_t r = c.out()->type().rank();
  int64_t axis = c.op.getInt("axis");
  axis = axis < 0 ? axis + r : axis;
  std::vector<int64_t> sizes;
  for (Value *v : c.op.operands())
    sizes.push_back(v->type().shape[axis]);
  auto parts = c.b.emitN(OpKind::Split, {c.dY[0]},
                         {{"axis", axis}, {"split", sizes}}, sizes.size());
  for (unsigned i = 0; i < parts.size(); ++i)
    if (c.needs[i])
      c.dX[i] = parts[i];
  return llvm::Error::success();
}

static llvm::Error ruleSplit(RuleContext &c) {
  std::vector<Value *> parts;
  for (unsigned i = 0; i < c.op.numResults(); ++i)
    parts.push_back(c.dY[i] ? c.dY[i] : c.b.zeros(c.out(i)->type()));
  int64_t r = c.in(0)->type().rank(), axis = c.op.getInt("axis");
  c.dX[0] = c.b.emit(OpKind::Concat, parts, {{"axis", axis < 0 ? axis + r : axis}});
  return llvm::Error::success();
}

static llvm::Error ruleSlice(RuleContext &c) {
  c.dX[0] = c.b.emit(
      OpKind::SliceGrad, {c.dY[0]},
      with(copyAttrs(c.op, {"axes", "ends", "starts", "steps"}), "shape",
           shapeOf(c.in(0))));
  return llvm::Error::success();
}

// dX is dY with the padding taken off: a Slice of dY, or where some pad is
// negative (that side of X was cropped, as RWKV's time shift does) a Pad of
// dY by the negated pads, which crops what was added and puts zeros back
// where X was cropped.
// Pad in reflect, edge or wrap mode: each output element reads one input
// element, axis by axis (ir/PadIndex.h), so the padding is one Gather per
// padded axis at a constant index vector, and its gradient a GatherGrad
// per axis (the rows that several outputs read summed), the last axis
// first.
static llvm::Error rulePadSource(RuleContext &c) {
  const std::string &mode = c.op.getString("mode");
  const auto &pads = c.op.getInts("pads");
  const ir::TensorType &x = c.in(0)->type();
  size_t r = x.rank();
  Value *d = c.dY[0];
  for (size_t k = r; k-- > 0;) {
    int64_t n = x.shape[k], outLen = d->type().shape[k];
    if (pads[k] == 0 && pads[r + k] == 0)
      continue;
    if (n == 0)
      return noRule(c.op, "padding an empty axis");
    std::vector<int64_t> source(static_cast<size_t>(outLen));
    for (int64_t o = 0; o < outLen; ++o)
      source[size_t(o)] = ir::padSourceIndex(mode, o - pads[k], n);
    Value *at = c.b.graph().addConst(
        c.b.graph().uniqueName("grad.pad_source"),
        ir::TensorData::fromInts(ir::DType::I64, {outLen}, source));
    ir::Shape shape = d->type().shape;
    shape[k] = n;
    d = c.b.emit(OpKind::GatherGrad, {d, at},
                 {{"axis", int64_t(k)},
                  {"shape", std::vector<int64_t>(shape.begin(), shape.end())}});
  }
  c.dX[0] = d;
  return llvm::Error::success();
}

static llvm::Error rulePad(RuleContext &c) {
  const std::string &mode = c.op.getString("mode");
  if (mode == "reflect" || mode == "edge" || mode == "wrap")
    return rulePadSource(c);
  if (mode != "constant")
    return noRule(c.op, "mode \"" + mode + "\" is not differentiable");
  const auto &pads = c.op.getInts("pads");
  if (llvm::any_of(pads, [](int64_t p) { return p < 0; })) {
    std::vector<int64_t> negated;
    for (int64_t p : pads)
      negated.push_back(-p);
    c.dX[0] = c.b.emit(OpKind::Pad, {c.dY[0]},
                       {{"mode", std::string("constant")},
                        {"pads", negated},
                        {"value", 0.0f}});
    return llvm::Error::success();
  }
  size_t r = c.in(0)->type().rank();
  std::vector<int64_t> starts, ends, axes, steps;
  for (size_t i = 0; i < r; ++i) {
    starts.push_back(pads[i]);
    ends.push_back(pads[i] + c.in(0)->type().shape[i]);
    axes.push_back(i);
    steps.push_back(1);
  }
  c.dX[0] = c.b.emit(OpKind::Slice, {c.dY[0]},
                     {{"axes", axes},
                      {"ends", ends},
                      {"starts", starts},
                      {"steps", steps}});
  return llvm::Error::success();
}

static llvm::Error ruleGather(RuleContext &c) {
  AttrMap attrs = with(copyAttrs(c.op, {"axis"}), "shape", shapeOf(c.in(0)));
  if (c.op.hasAttr("padding_idx")) // an embedding's row that never trains
    attrs.emplace("padding_idx", c.op.attr("padding_idx"));
  c.dX[0] = c.b.emit(OpKind::GatherGrad, {c.dY[0], c.in(1)}, std::move(attrs));
  return llvm::Error::success();
}

static llvm::Error ruleGatherElements(RuleContext &c) {
  c.dX[0] = c.b.emit(OpKind::GatherElementsGrad, {c.dY[0], c.in(1)},
                     with(copyAttrs(c.op, {"axis"}), "shape", shapeOf(c.in(0))));
  return llvm::Error::success();
}

static llvm::Error ruleScatterND(RuleContext &c) {
  if (c.op.getString("reduction") != "none")
    return noRule(c.op, "only reduction none has a gradient");
  // The updates' gradient first: then the data's is dY's last reader and
  // may zero the written slices in dY's own bytes (MemoryPlan.h).
  if (c.needs[2])
    c.dX[2] = c.b.emit(OpKind::ScatterNDGradUpdates, {c.dY[0], c.in(1)},
                       {{"shape", shapeOf(c.in(2))}});
  if (c.needs[0])
    c.dX[0] = c.b.emit(OpKind::ScatterNDGradData, {c.dY[0], c.in(1)}, {});
  return llvm::Error::success();
}

// Reduction none: the written elements of data get no gradient, each update
// its element's where it wrote last. Add: data's gradient is dY and each
// update's the element of dY it was added to.
static llvm::Error ruleScatterElements(RuleContext &c) {
  const std::string &red = c.op.getString("reduction");
  if (red != "none" && red != "add")
    return noRule(c.op, "only reductions none and add have a gradient");
  AttrMap axis = copyAttrs(c.op, {"axis"});
  bool add = red == "add";
  // The updates' gradient first, as ScatterND's.
  if (c.needs[2])
    c.dX[2] = c.b.emit(add ? OpKind::GatherElements
                           : OpKind::ScatterElementsGradUpdates,
                       {c.dY[0], c.in(1)}, axis);
  if (c.needs[0])
    c.dX[0] = add ? c.dY[0]
                  : c.b.emit(OpKind::ScatterElementsGradData,
                             {c.dY[0], c.in(1)}, axis);
  return llvm::Error::success();
}

// y_j sums x_i over i <= j (or i < j, or from the end): dx_i sums dy_j over
// the same relation turned around, the running sum the other way.
static llvm::Error ruleCumSum(RuleContext &c) {
  c.dX[0] = c.b.emit(OpKind::CumSum, {c.dY[0]},
                     with(copyAttrs(c.op, {"axis", "exclusive"}), "reverse",
                          int64_t(c.op.getInt("reverse") == 0)));
  return llvm::Error::success();
}

// The transform is linear with a symmetric matrix; its adjoint (as a real
// map of the real and imaginary parts) conjugates it: the opposite sign,
// the same scale.
static llvm::Error ruleDFT(RuleContext &c) {
  c.dX[0] = c.b.emit(OpKind::DFT, {c.dY[0]},
                     with(copyAttrs(c.op, {"axis", "normalized"}), "inverse",
                          int64_t(c.op.getInt("inverse") == 0)));
  return llvm::Error::success();
}

static llvm::Error ruleResize(RuleContext &c) {
  AttrMap attrs = copyAttrs(c.op, {"coordinate_transformation_mode",
                                   "cubic_coeff_a", "mode", "nearest_mode"});
  if (c.op.hasAttr("scales"))
    attrs.emplace("scales", c.op.attr("scales"));
  c.dX[0] = c.b.emit(OpKind::ResizeGrad, {c.dY[0]},
                     with(std::move(attrs), "shape", shapeOf(c.in(0))));
  return llvm::Error::success();
}

// dX adds each output gradient into the pixels it read; dGrid is the
// derivative of the interpolation (zero for nearest: the values are flat
// in the coordinates almost everywhere, as PyTorch's).
static llvm::Error ruleGridSample(RuleContext &c) {
  AttrMap attrs = copyAttrs(c.op, {"align_corners", "mode", "padding_mode"});
  if (c.needs[0])
    c.dX[0] = c.b.emit(OpKind::GridSampleGradData, {c.dY[0], c.in(1)},
                       with(attrs, "shape", shapeOf(c.in(0))));
  if (c.needs[1])
    c.dX[1] = c.b.emit(OpKind::GridSampleGradGrid,
                       {c.dY[0], c.in(0), c.in(1)}, attrs);
  return llvm::Error::success();
}

// dY viewed as [r0, d0, r1, d1, ...] (tile index, then position in the
// tile, per dim) and summed over the tile indices.
static llvm::Error ruleTile(RuleContext &c) {
  const auto &repeats = c.op.getInts("repeats");
  std::vector<int64_t> in = shapeOf(c.in(0)), split, axes;
  for (size_t d = 0; d < in.size(); ++d) {
    split.push_back(repeats[d]);
    split.push_back(in[d]);
    if (repeats[d] != 1)
      axes.push_back(int64_t(2 * d));
  }
  if (axes.empty()) {
    c.dX[0] = c.dY[0];
    return llvm::Error::success();
  }
  Value *sum = c.b.emit(OpKind::ReduceSum, {c.b.reshape(c.dY[0], split)},
                        {{"axes", axes}, {"keepdims", int64_t(1)}});
  c.dX[0] = c.b.reshape(sum, in);
  return llvm::Error::success();
}

static llvm::Error ruleMaxPool(RuleContext &c) {
  c.dX[0] = c.b.emit(OpKind::MaxPoolGrad, {c.dY[0], c.in(0)},
                     copyAttrs(c.op, {"ceil_mode", "dilations", "kernel_shape",
                                      "pads", "strides"}));
  return llvm::Error::success();
}

static llvm::Error ruleAveragePool(RuleContext &c) {
  c.dX[0] = c.b.emit(
      OpKind::AveragePoolGrad, {c.dY[0]},
      with(copyAttrs(c.op, {"ceil_mode", "count_include_pad", "kernel_shape",
                            "pads", "strides"}),
           "shape", shapeOf(c.in(0))));
  return llvm::Error::success();
}

Rule findRule(OpKind kind) {
  switch (kind) {
  case OpKind::Abs: return ruleAbs;
  case OpKind::Cos: return ruleCos;
  case OpKind::Sin: return ruleSin;
  case OpKind::Tan: return ruleTan;
  case OpKind::Asin: return ruleAsin;
  case OpKind::Acos: return ruleAcos;
  case OpKind::Atan: return ruleAtan;
  case OpKind::Sinh: return ruleSinh;
  case OpKind::Cosh: return ruleCosh;
  case OpKind::Asinh: return ruleAsinh;
  case OpKind::Acosh: return ruleAcosh;
  case OpKind::Atanh: return ruleAtanh;
  case OpKind::Gelu: return ruleGelu;
  case OpKind::Trilu: return ruleTrilu;
  case OpKind::Erf: return ruleErf;
  case OpKind::Exp: return ruleExp;
  case OpKind::Log: return ruleLog;
  case OpKind::Reciprocal: return ruleReciprocal;
  case OpKind::Relu: return ruleRelu;
  case OpKind::Sigmoid: return ruleSigmoid;
  case OpKind::Silu: return ruleSilu;
  case OpKind::Sqrt: return ruleSqrt;
  case OpKind::Tanh: return ruleTanh;
  case OpKind::LeakyRelu: return ruleLeakyRelu;
  case OpKind::HardSigmoid: return ruleHardSigmoid;
  case OpKind::HardSwish: return ruleHardSwish;
  case OpKind::Clip: return ruleClip;
  case OpKind::DFT: return ruleDFT;
  case OpKind::Identity: return ruleIdentity;
  case OpKind::Neg: return ruleNeg;
  case OpKind::Cast: return ruleCast;
  case OpKind::Add: return ruleAdd;
  case OpKind::Sub: return ruleSub;
  case OpKind::Mul: return ruleMul;
  case OpKind::Div: return ruleDiv;
  case OpKind::Pow: return rulePow;
  case OpKind::Max:
  case OpKind::Min: return ruleMaxMin;
  case OpKind::Where: return ruleWhere;
  case OpKind::MatMul: return ruleMatMul;
  case OpKind::Gemm: return ruleGemm;
  case OpKind::Conv: return ruleConv;
  case OpKind::ConvTranspose: return ruleConvTranspose;
  case OpKind::LayerNormalization: return ruleLayerNorm;
  case OpKind::RMSNormalization: return ruleRMSNorm;
  case OpKind::BatchNormalization: return ruleBatchNorm;
  case OpKind::Softmax:
  case OpKind::LogSoftmax: return ruleSoftmax;
  case OpKind::FusedAttention: return ruleFusedAttention;
  case OpKind::SoftmaxCrossEntropyLoss: return ruleSoftmaxCrossEntropy;
  case OpKind::Dropout: return ruleDropout;
  case OpKind::ReduceMax:
  case OpKind::ReduceMean:
  case OpKind::ReduceSum: return ruleReduce;
  case OpKind::GlobalAveragePool: return ruleGlobalAveragePool;
  case OpKind::Flatten:
  case OpKind::Reshape:
  case OpKind::Squeeze:
  case OpKind::Unsqueeze: return ruleReshapeLike;
  case OpKind::Expand: return ruleExpand;
  case OpKind::Transpose: return ruleTranspose;
  case OpKind::Concat: return ruleConcat;
  case OpKind::Split: return ruleSplit;
  case OpKind::Slice: return ruleSlice;
  case OpKind::Pad: return rulePad;
  case OpKind::Gather: return ruleGather;
  case OpKind::GatherElements: return ruleGatherElements;
  case OpKind::ScatterND: return ruleScatterND;
  case OpKind::ScatterElements: return ruleScatterElements;
  case OpKind::CumSum: return ruleCumSum;
  case OpKind::Resize: return ruleResize;
  case OpKind::GridSample: return ruleGridSample;
  case OpKind::Tile: return ruleTile;
  case OpKind::MaxPool: return ruleMaxPool;
  case OpKind::AveragePool: return ruleAveragePool;
  default: return nullptr;
  }
}

bool isDifferentiableResult(const ir::Op &op, unsigned i) {
  // Past the first, statistics, masks or indices (Ops.def's AuxResults).
  if (op.info().has(ir::optrait::AuxResults))
    return i == 0;
  return ir::isFloat(op.result(i)->type().dtype);
}

} // namespace cleave::passes::grad
