// Ops cleave has no IR op for that ONNX defines by a function body: the
// node is replaced by its body's nodes, imported by the usual steps
// (ImportContext::importFunctionBody). The ones listed here are tested
// against onnxruntime (tests/models/opset23, tests/lit/cleavec/
// function-ops.test); any other op without a table entry takes the same
// path, so it imports when every op of its body does.
#include "frontend/Decompose.h"
#include "frontend/translate/Translation.h"

namespace cleave::frontend {

llvm::Error translateThroughFunctionBody(ImportContext &ctx,
                                         const onnx::NodeProto &n, int index) {
  // Where ONNX's body overflows, cleave's own spelling at every opset.
  if (n.op_type() == "ReduceLogSumExp")
    return decomposeReduceLogSumExp(ctx, n, index);
  if (n.op_type() == "Softplus")
    return decomposeSoftplus(ctx, n, index);
  if (n.op_type() == "Elu" || n.op_type() == "Celu" || n.op_type() == "Selu")
    return decomposeExponentialUnit(ctx, n, index);
  auto expanded = ctx.importFunctionBody(n, index);
  if (!expanded)
    return expanded.takeError();
  if (*expanded)
    return llvm::Error::success();
  // Before the opset that gave it a body (18), cleave spells it itself
  // (frontend/Decompose.cpp).
  llvm::StringRef op(n.op_type());
  if (op == "ReduceL1" || op == "ReduceL2" || op == "ReduceSumSquare" ||
      op == "ReduceLogSum")
    return decomposeReduceNorm(ctx, n, index);
  // Ops whose result's shape depends on the data: what an exporter writes
  // for a data-dependent loop or mask it traced.
  if (op == "NonZero" || op == "Unique" || op == "Compress")
    return importError(
        "unsupported op '{0}' at node '{1}'{2}: its result's shape depends on "
        "the data, and cleave needs static shapes (an exporter's trace of a "
        "data-dependent loop or mask, such as transformers' default "
        "mixture-of-experts loop: the README's \"Mixture-of-experts models\" "
        "says how to export one without it)",
        n.op_type(), n.name(), modulePathOf(n));
  return importError("unsupported op '{0}' (domain 'ai.onnx', opset {1}) at "
                     "node '{2}'{3}{4}; `cleavec --list-ops` lists the "
                     "supported ops",
                     n.op_type(), ctx.opset(), n.name(), modulePathOf(n),
                     ctx.bodyContext());
}

std::vector<OpTranslation> functionOpTranslations() {
  std::vector<OpTranslation> t;
  for (const char *op :
       {"Attention", "Celu", "Elu", "Mish", "PRelu",
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
        "RotaryEmbedding", "Selu", "Shrink", "Softplus", "Softsign", "Swish",
        "ThresholdedRelu"})
    t.push_back({op, kOpsetFirst, kOpsetLast, translateThroughFunctionBody,
                 TranslationKind::FunctionBody});
  return t;
}

} // namespace cleave::frontend
