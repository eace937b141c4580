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

std::vector<OpTranslation> reduceTranslations() {
  std::vector<OpTranslation> t;
  for (const char *op : {"ReduceMax", "ReduceMean", "ReduceSum"})
    t.push_back({op,
                 kOpsetFirst,
                 kOpsetLast,
                 translateReduce,
                 TranslationKind::Op,
                 {"noop_with_empty_axes"}});
  t.push_back(sameNamedOp("ArgMax"));
  t.push_back(sameNamedOp("ArgMin"));
  return t;
}

} // namespace cleave::frontend
