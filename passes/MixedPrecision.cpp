// mixed-precision: with `--precision bf16`, the matrix products and
// convolutions (MatMul, Gemm, Conv) and fused attention (its Q, K, V) of
// the forward graph read bf16 operands
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

// The ops whose float operands become bf16: the products, and fused
// attention (its Q, K and V; the mask stays f32, as the unfused attention
// adds it to f32 scores).
static bool runsInBf16(OpKind k) {
  return k == OpKind::MatMul || k == OpKind::Gemm || k == OpKind::Conv ||
         k == OpKind::FusedAttention;
}

static bool castsOperand(const ir::Op &op, unsigned i) {
  return op.kind() != OpKind::FusedAttention || i < 3;
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
    if (runsInBf16(op->kind()) && op->result()->type().dtype == DType::F32)
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
    std::vector<ir::TensorType> types;
    for (unsigned i = 0; i < op->numOperands(); ++i) {
      ir::Value *v = op->operand(i);
      operands.push_back(v && v->type().dtype == DType::F32 &&
                                 castsOperand(*op, i)
                             ? toBf16(v, op)
                             : v);
      types.push_back(operands.back()->type());
    }
    ir::Value *old = op->result();
    // Result 0 in bf16; the others (fused attention's logsumexp) as the
    // type rule gives them for bf16 operands.
    auto resultTypes = ir::inferResultTypes(op->kind(), types, op->attrs(),
                                            op->numResults());
    if (!resultTypes)
      return resultTypes.takeError();
    std::vector<std::string> names{g.uniqueName(old->name() + ".bf16")};
    for (unsigned i = 1; i < op->numResults(); ++i)
      names.push_back(g.uniqueName(op->result(i)->name() + ".bf16"));
    ir::Op *product = g.insertOpBefore(op, op->kind(), operands, *resultTypes,
                                       names, op->attrs(), op->loc());
    std::vector<std::string> others;
    for (unsigned i = 1; i < op->numResults(); ++i) {
      if (product->result(i)->type() != op->result(i)->type())
        return llvm::createStringError(
            llvm::inconvertibleErrorCode(),
            "mixed-precision: %s's result %u changes type in bf16",
            std::string(op->info().name).c_str(), i);
      others.push_back(op->result(i)->name());
      g.replaceAllUsesWith(op->result(i), product->result(i));
    }
    ir::Value *back =
        g.insertOpBefore(op, OpKind::Cast, {product->result()},
                         {old->type()}, {g.uniqueName(old->name() + ".f32")},
                         {{"to", std::string("f32")}}, op->loc())
            ->result();
    std::string name = old->name();
    g.replaceAllUsesWith(old, back);
    g.eraseOp(op);
    g.rename(back, name);
    for (unsigned i = 1; i < product->numResults(); ++i)
      g.rename(product->result(i), others[i - 1]);
  }
  return !products.empty();
}

} // namespace cleave::passes
