// mixed-precision: with `--precision bf16`, the matrix products and
// convolutions (MatMul, Gemm, Conv) of the forward graph read bf16 operands
// and write a bf16 result, which is cast back to f32 for the ops after it.
// Everything else (normalizations, softmax, the loss, the optimizer) stays
// f32, and so do the parameters: the master weights are f32 and each GEMM
// reads a bf16 cast of them. The pass runs before autodiff, which
// differentiates the casts like any op: the B and W products then run in
// bf16 too, and a parameter's gradient comes back through the cast's
// gradient (a cast to f32), so gradients are summed over microbatches and
// applied in f32.
//
// Each f32 value a product reads is cast once, however many products read
// it (the input of the Q, K and V projections, a weight used twice): the
// cast sits right before the first product that reads it, tagged with the
// location of the op that made the value (or of that first product, for
// inputs and declared tensors), so it stays in the producer's layer and a
// value that crosses a stage boundary crosses it in bf16.
// docs/design/precision.md has the whole design.
#include "passes/Pass.h"

#include "llvm/ADT/DenseMap.h"

namespace cleave::passes {

using ir::DType;
using ir::OpKind;

// The ops whose float operands become bf16.
static bool runsInBf16(OpKind k) {
  return k == OpKind::MatMul || k == OpKind::Gemm || k == OpKind::Conv;
}

llvm::Expected<bool> mixedPrecision(ir::Graph &g, const PassContext &ctx) {
  const std::string &precision = ctx.training.precision;
  if (precision == "f32")
    return false;
  if (precision != "bf16")
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "unknown precision '" + precision +
                                       "' (f32 or bf16)");
  if (g.isTraining())
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        "mixed-precision runs on the forward graph, before autodiff");

  // The op that made each value, for the casts' locations.
  llvm::DenseMap<const ir::Value *, const ir::Op *> producer;
  for (const auto &op : g.ops())
    for (ir::Value *r : op->results())
      producer[r] = op.get();

  std::vector<ir::Op *> products;
  for (const auto &op : g.ops())
    if (runsInBf16(op->kind()) && op->numResults() == 1 &&
        op->result()->type().dtype == DType::F32)
      products.push_back(op.get());

  llvm::DenseMap<ir::Value *, ir::Value *> castOf; // f32 value -> its bf16
  auto toBf16 = [&](ir::Value *v, ir::Op *firstUser) -> ir::Value * {
    auto [it, fresh] = castOf.try_emplace(v, nullptr);
    if (!fresh)
      return it->second;
    auto p = producer.find(v);
    std::string loc =
        p != producer.end() ? p->second->loc() : firstUser->loc();
    it->second = g.insertOpBefore(firstUser, OpKind::Cast, {v},
                                  {ir::TensorType(DType::BF16, v->type().shape)},
                                  {g.uniqueName(v->name() + ".bf16")},
                                  {{"to", std::string("bf16")}}, loc)
                     ->result();
    return it->second;
  };

  for (ir::Op *op : products) {
    std::vector<ir::Value *> operands;
    for (ir::Value *v : op->operands())
      operands.push_back(v && v->type().dtype == DType::F32 ? toBf16(v, op)
                                                            : v);
    ir::Value *old = op->result();
    ir::Op *product = g.insertOpBefore(
        op, op->kind(), operands, {ir::TensorType(DType::BF16, old->type().shape)},
        {g.uniqueName(old->name() + ".bf16")}, op->attrs(), op->loc());
    ir::Value *back =
        g.insertOpBefore(op, OpKind::Cast, {product->result()},
                         {old->type()}, {g.uniqueName(old->name() + ".f32")},
                         {{"to", std::string("f32")}}, op->loc())
            ->result();
    std::string name = old->name();
    g.replaceAllUsesWith(old, back);
    g.eraseOp(op);
    g.rename(back, name);
  }
  return !products.empty();
}

} // namespace cleave::passes
