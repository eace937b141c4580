// --add-loss: gives an inference graph a scalar loss so it can be trained.
#include "passes/Pass.h"
#include "support/Errors.h"

#include "ir/Printer.h"

namespace cleave::passes {

llvm::Error addLoss(ir::Graph &g, llvm::StringRef kind, llvm::StringRef output,
                    llvm::StringRef target) {
  ir::Value *out = nullptr;
  for (ir::Value *v : g.outputs())
    if (v->name() == output)
      out = v;
  if (!out) {
    std::string names;
    for (ir::Value *v : g.outputs())
      names += (names.empty() ? "" : ", ") + ir::valueRef(v->name());
    return fail("--add-loss: the graph has no output named '" + output +
                "' (outputs: " + names + ")");
  }
  if (g.lookup(target))
    return fail("--add-loss: the name '" + target +
                "' for the new input is already used in the graph");
  const ir::TensorType &t = out->type();
  if (!ir::isFloat(t.dtype))
    return fail("--add-loss: output '" + output + "' is " + t.str() +
                ", not a float tensor");
  ir::TensorType scalar(t.dtype, {});
  ir::Value *loss;
  if (kind == "cross-entropy") {
    if (t.rank() < 2)
      return fail("--add-loss cross-entropy: logits '" + output +
                  "' must be [N, C] or [N, C, ...], got " + t.str());
    ir::Shape labels(t.shape.begin(), t.shape.end());
    labels.erase(labels.begin() + 1);
    ir::Value *y = g.addInput(target.str(), ir::TensorType(ir::DType::I64, labels));
    loss = g.appendOp(ir::OpKind::SoftmaxCrossEntropyLoss, {out, y}, {scalar},
                      {g.uniqueName("loss")}, {{"reduction", "mean"}},
                      "add-loss/cross-entropy")
               ->result();
  } else if (kind == "mse") {
    ir::Value *y = g.addInput(target.str(), t);
    ir::Value *d = g.appendOp(ir::OpKind::Sub, {out, y}, {t}, {"mse.diff"}, {},
                              "add-loss/mse")
                       ->result();
    ir::Value *sq = g.appendOp(ir::OpKind::Mul, {d, d}, {t}, {"mse.square"},
                               {}, "add-loss/mse")
                        ->result();
    loss = g.appendOp(ir::OpKind::ReduceMean, {sq}, {scalar},
                      {g.uniqueName("loss")},
                      {{"axes", std::vector<int64_t>{}},
                       {"keepdims", int64_t(0)}},
                      "add-loss/mse")
               ->result();
  } else {
    return fail("--add-loss: unknown loss '" + kind +
                "' (cross-entropy:LOGITS,LABELS or mse:OUTPUT,TARGET)");
  }
  g.setOutputs({loss});
  return llvm::Error::success();
}

} // namespace cleave::passes
