// Reductions. The axes are an attribute before opset 18 (ReduceSum: 13)
// and a constant input since; either way they become the IR op's `axes`
// attribute, and no axes with `noop_with_empty_axes` is an Identity.
#include "frontend/translate/Translation.h"

#include "frontend/OnnxNode.h"

namespace cleave::frontend {

using namespace cleave::ir;

static llvm::Error translateReduce(ImportContext &ctx, const onnx::NodeProto &n,
                                   int index) {
  OpKind kind = irOpOf(n);
  auto operands = ctx.tensorOperands(n, index, kind);
  if (!operands)
    return operands.takeError();
  auto given = ctx.reductionAxesOf(n, index);
  if (!given)
    return given.takeError();
  if (!*given)
    return ctx.emit(n, index, OpKind::Identity, std::move(*operands), {},
                    false);
  std::vector<int64_t> axes = std::move(**given);
  AttrMap attrs;
  if (!axes.empty())
    attrs.emplace("axes", Attribute(axes));
  return ctx.emit(n, index, kind, std::move(*operands), std::move(attrs));
}

// ReduceMin as -ReduceMax(-x) (its gradient through ReduceMax's: shared
// evenly between tied minima, as PyTorch's amin shares it); bool as 0/1
// bytes, min being "all".
static llvm::Error translateReduceMin(ImportContext &ctx,
                                      const onnx::NodeProto &n, int index) {
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  auto given = ctx.reductionAxesOf(n, index);
  if (!given)
    return given.takeError();
  if (!*given)
    return ctx.emit(n, index, OpKind::Identity, {*x}, {}, false);
  DType dt = (*x)->type().dtype;
  bool boolean = dt == DType::Bool;
  if (dt == DType::U8)
    return importError("{0}: ReduceMin of {1} is not supported",
                       describeNode(n, index), (*x)->type().str());
  AttrMap attrs{{"keepdims", Attribute(attrInt(n, "keepdims", 1))}};
  if (!(*given)->empty())
    attrs.emplace("axes", Attribute(**given));
  Value *v = *x;
  auto step = [&](OpKind kind, AttrMap a = {}) -> llvm::Error {
    auto r = ctx.append(n, index, kind, {v}, std::move(a));
    if (!r)
      return r.takeError();
    v = *r;
    return llvm::Error::success();
  };
  if (boolean)
    if (auto e = step(OpKind::Cast, {{"to", Attribute(std::string("i8"))}}))
      return e;
  if (auto e = step(OpKind::Neg))
    return e;
  if (auto e = step(OpKind::ReduceMax, std::move(attrs)))
    return e;
  if (!boolean)
    return ctx.emit(n, index, OpKind::Neg, {v}, {}, false);
  if (auto e = step(OpKind::Neg))
    return e;
  return ctx.emit(n, index, OpKind::Cast, {v},
                  {{"to", Attribute(std::string("bool"))}}, false);
}

// TopK: the indices of the k largest or smallest (TopKIndices), and the
// values picked from X at them (GatherElements: its gradient scatters dY
// back to those elements). K is an attribute before opset 10, a constant
// input since; `sorted` 0 leaves the order to the implementation, which
// sorts.
static llvm::Error translateTopK(ImportContext &ctx, const onnx::NodeProto &n,
                                 int index) {
  auto x = ctx.operand(n, index, 0);
  if (!x)
    return x.takeError();
  int64_t k = attrInt(n, "k", -1);
  if (ctx.opset() >= 10) {
    auto given = ctx.staticInts(n, index, 1, "K");
    if (!given)
      return given.takeError();
    if (given->size() != 1)
      return importError("{0}: K must hold one value, not {1}",
                         describeNode(n, index), given->size());
    k = (*given)[0];
  }
  AttrMap attrs{{"axis", Attribute(attrInt(n, "axis", -1))},
                {"k", Attribute(k)},
                {"largest", Attribute(attrInt(n, "largest", 1))}};
  auto indices = ctx.append(n, index, OpKind::TopKIndices, {*x}, attrs);
  if (!indices)
    return indices.takeError();
  auto values = ctx.append(n, index, OpKind::GatherElements, {*x, *indices},
                           {{"axis", Attribute(attrInt(n, "axis", -1))}});
  if (!values)
    return values.takeError();
  if (auto e = ctx.define(n, index, n.output(0), *values))
    return e;
  if (n.output_size() > 1 && !n.output(1).empty())
    return ctx.define(n, index, n.output(1), *indices);
  return llvm::Error::success();
}

std::vector<OpTranslation> reduceTranslations() {
  std::vector<OpTranslation> t;
  for (const char *op : {"ReduceMax", "ReduceMean", "ReduceSum"})
    t.push_back({op,
                 kOpsetFirst,
                 kOpsetLast,
                 translateReduce,
                 TranslationKind::Op,
                 {"noop_with_empty_axes"}});
  t.push_back({"ReduceMin", kOpsetFirst, kOpsetLast, translateReduceMin,
               TranslationKind::Op, {"keepdims", "noop_with_empty_axes"}});
  t.push_back(sameNamedOp("ArgMax"));
  t.push_back(sameNamedOp("ArgMin"));
  t.push_back({"TopK", kOpsetFirst, kOpsetLast, translateTopK,
               TranslationKind::Op, {"axis", "k", "largest", "sorted"}});
  return t;
}

} // namespace cleave::frontend
