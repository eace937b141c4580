// matmul-to-gemm: PyTorch's exporters write nn.Linear as
// MatMul(x, Transpose(W)) and, with a bias, Add(b, that): the Transpose
// copies W every step, its gradient is made transposed and copied back,
// and the bias is one more pass over the activations. Gemm takes W as it
// is (transB = 1) and the bias as its C operand, and its gradient gives
// dW in W's layout. So this pass rewrites
//
//   MatMul(x, Transpose(W, perm [1, 0])) [+ b]   (x: [..., K], W: [N, K])
//
// into Reshape(x, [M, K]), Gemm(., W[, b]) {transB = 1}, Reshape back to
// [..., N] (the reshapes share their operand's bytes in a plan: codegen).
// The bias folds when it is a [N] or [1, N] operand of an Add whose other
// operand is the product with no other use. Values are unchanged up to the
// order of float additions inside the product (the same GEMM either way),
// and the bias is added before the products instead of after.
#include "passes/Pass.h"

namespace cleave::passes {
namespace {

using ir::Op;
using ir::OpKind;
using ir::Value;

// W when v is Transpose(W) with perm [1, 0] and no other use of v.
Value *transposedMatrix(const ir::Graph &g, Value *v) {
  Op *t = v->definingOp();
  if (!t || t->kind() != OpKind::Transpose || v->uses().size() != 1 ||
      g.isPinned(v) || t->operand(0)->type().rank() != 2)
    return nullptr;
  const std::vector<int64_t> &perm = t->getInts("perm");
  if (perm != std::vector<int64_t>{1, 0})
    return nullptr;
  return t->operand(0);
}

// The Add that adds a bias of N elements to `product`, and that bias.
std::pair<Op *, Value *> biasAdd(const ir::Graph &g, Value *product,
                                 int64_t n) {
  if (product->uses().size() != 1 || g.isPinned(product))
    return {nullptr, nullptr};
  Op *add = product->uses()[0].user;
  if (add->kind() != OpKind::Add || add->result()->type() != product->type())
    return {nullptr, nullptr};
  Value *b = add->operand(add->operand(0) == product ? 1 : 0);
  if (b == product || b->type().dtype != product->type().dtype)
    return {nullptr, nullptr};
  const ir::Shape &s = b->type().shape;
  bool row =
      (s.size() == 1 && s[0] == n) || (s.size() == 2 && s[0] == 1 && s[1] == n);
  return row ? std::pair<Op *, Value *>{add, b}
             : std::pair<Op *, Value *>{nullptr, nullptr};
}

} // namespace

llvm::Expected<bool> matMulToGemm(ir::Graph &g, const PassContext &) {
  std::vector<Op *> matmuls;
  for (const auto &op : g.ops())
    if (op->kind() == OpKind::MatMul && ir::isFloat(op->result()->type().dtype))
      matmuls.push_back(op.get());
  bool changed = false;
  for (Op *mm : matmuls) {
    Value *x = mm->operand(0);
    Value *w = transposedMatrix(g, mm->operand(1));
    if (!w || x->type().rank() < 2)
      continue;
    const ir::Shape &xs = x->type().shape;
    int64_t k = xs.back(), n = w->type().shape[0], m = 1;
    for (size_t d = 0; d + 1 < xs.size(); ++d)
      m *= xs[d];
    auto [add, bias] = biasAdd(g, mm->result(), n);
    Op *last = add ? add : mm;
    Value *out = last->result();
    std::string name = out->name();
    ir::DType dt = out->type().dtype;

    Value *rows = x;
    if (xs.size() != 2)
      rows = g.insertOpBefore(
                  last, OpKind::Reshape, {x}, {ir::TensorType{dt, {m, k}}},
                  {g.uniqueName(name + ".rows")},
                  {{"shape", std::vector<int64_t>{m, k}}}, mm->loc())
                 ->result();
    std::vector<Value *> operands = {rows, w};
    if (bias)
      operands.push_back(bias);
    Value *gemm = g.insertOpBefore(last, OpKind::Gemm, operands,
                                   {ir::TensorType{dt, {m, n}}},
                                   {g.uniqueName(name + ".gemm")},
                                   {{"transB", int64_t(1)}}, mm->loc())
                      ->result();
    Value *result = gemm;
    if (xs.size() != 2)
      result = g.insertOpBefore(
                    last, OpKind::Reshape, {gemm}, {out->type()}, {},
                    {{"shape", std::vector<int64_t>(out->type().shape.begin(),
                                                    out->type().shape.end())}},
                    mm->loc())
                   ->result();
    g.replaceAllUsesWith(out, result);
    Op *transpose = mm->operand(1)->definingOp();
    if (add)
      g.eraseOp(add);
    g.eraseOp(mm);
    g.eraseOp(transpose);
    g.rename(result, name); // the layer's output keeps its name
    changed = true;
  }
  return changed;
}

} // namespace cleave::passes
