// pack-attention: a FusedAttention whose Q, K and V are the three parts of
// one Split along the last axis (a packed in-projection: GPT-2's c_attn,
// nn.MultiheadAttention's in_proj after slice-packed-views), each viewed
// as [B, T, H, D] or [T, B, H, D], reads them out of the Split's operand
// in place: that operand viewed as [B, T, Hq + 2 Hkv, D] (or [T, B, ...])
// is its Q, K and V at once (packed_kv_heads, ir/Ops.def). The Split goes,
// and with it its gradient's Concat: the backward writes dQ, dK and dV
// into one gradient of the packed tensor. Same bits: the kernels read and
// write the same elements, only where they find them changes.
//
// The match, for S [..., N] split into [Hq D, Hkv D, Hkv D] (Hkv = Hq for
// multi-head attention): Q = views(Split_0), K = views(Split_1),
// V = views(Split_2), every view a reshape (row-major order kept), each
// Split result and view used once; Q, K, V in the seq_major or time_major
// layout (their heads next to D, so H and D are S's last axis cut in
// head-sized runs) with the same two leading axes, whose product is S's
// row count. Then Q[a, b, h, d] = S[a B + b, h D + d], K is the same at
// column Hq D + h D + d, V at (Hq + Hkv) D + h D + d: the packed view's
// heads Hq + h and Hq + Hkv + h.
#include "passes/Pass.h"

#include "ir/OpInfo.h"
#include "ir/TypeRules.h"

namespace cleave::passes {
namespace {

using ir::Op;
using ir::OpKind;
using ir::Value;

// The Split result `v` is read from through single-use reshapes, or null.
Value *splitPartUnder(const ir::Graph &g, Value *v) {
  while (Op *def = v->definingOp()) {
    if (def->kind() == OpKind::Split)
      return v->uses().size() == 1 && !g.isPinned(v) ? v : nullptr;
    if (def->numOperands() != 1 || def->numResults() != 1 ||
        !ir::opInfo(def->kind()).has(ir::optrait::LayoutOnly) ||
        v->uses().size() != 1 || g.isPinned(v))
      return nullptr;
    v = def->operand(0);
  }
  return nullptr;
}

} // namespace

llvm::Expected<bool> packAttention(ir::Graph &g, const PassContext &ctx) {
  // recognize-attention leaves the unfused chain to dce, and it still reads
  // Q, K and V: gone first, so that their one use is the attention's.
  auto dead = eliminateDeadCode(g, ctx);
  if (!dead)
    return dead.takeError();
  std::vector<Op *> attentions;
  for (const auto &op : g.ops())
    if (op->kind() == OpKind::FusedAttention &&
        ir::attentionPackedKvHeads(*op) == 0)
      attentions.push_back(op.get());
  bool changed = false;
  for (Op *op : attentions) {
    const ir::AttentionLayout layout = ir::attentionLayout(*op);
    if (layout == ir::AttentionLayout::Heads)
      continue; // the heads apart from D: not a cut of S's last axis
    Value *parts[3];
    for (unsigned i = 0; i < 3; ++i)
      parts[i] = splitPartUnder(g, op->operand(i));
    if (!parts[0] || !parts[1] || !parts[2])
      continue;
    Op *split = parts[0]->definingOp();
    if (split->numResults() != 3 || parts[1]->definingOp() != split ||
        parts[2]->definingOp() != split || parts[0]->resultIndex() != 0 ||
        parts[1]->resultIndex() != 1 || parts[2]->resultIndex() != 2)
      continue;
    Value *source = split->operand(0);
    const ir::TensorType &st = source->type();
    auto axis = ir::normalizeAxis(split->getInt("axis"), int64_t(st.rank()));
    if (!axis) {
      llvm::consumeError(axis.takeError());
      continue;
    }
    if (st.rank() < 1 || *axis != int64_t(st.rank()) - 1)
      continue;
    const ir::Shape &q = op->operand(0)->type().shape,
                    &k = op->operand(1)->type().shape,
                    &v = op->operand(2)->type().shape;
    const ir::AttentionDims d = ir::attentionDims(q, k, layout);
    const int64_t width = st.shape.back(),
                  rows = width ? st.numElements() / width : 0;
    if (k != v || q[0] != k[0] || q[1] != k[1] || q[0] * q[1] != rows ||
        d.headDim < 1 ||
        width != (d.queryHeads + 2 * d.kvHeads) * d.headDim ||
        parts[0]->type().shape.back() != d.queryHeads * d.headDim ||
        parts[1]->type().shape.back() != d.kvHeads * d.headDim)
      continue;
    // S as [A, B, Hq + 2 Hkv, D]: Q's heads, K's, V's.
    const int64_t heads = d.queryHeads + 2 * d.kvHeads;
    std::vector<int64_t> shape{q[0], q[1], heads, d.headDim};
    Value *packed = g.insertOpBefore(
                         op, OpKind::Reshape, {source},
                         {ir::TensorType(st.dtype, ir::Shape(shape.begin(), shape.end()))},
                         {g.uniqueName(source->name() + ".qkv")},
                         {{"shape", shape}}, op->loc())
                        ->result();
    std::vector<Value *> operands{packed, packed, packed};
    if (op->numOperands() == 4)
      operands.push_back(op->operand(3));
    ir::AttrMap attrs = op->attrs();
    attrs.insert_or_assign("packed_kv_heads", ir::Attribute(int64_t(d.kvHeads)));
    std::vector<ir::TensorType> in;
    for (Value *x : operands)
      in.push_back(x->type());
    auto types = ir::inferResultTypes(OpKind::FusedAttention, in, attrs, 2);
    if (!types)
      return types.takeError(); // the match checked what the rule checks
    std::vector<std::string> names{op->result(0)->name(),
                                   op->result(1)->name()};
    Op *fused = g.insertOpBefore(
        op, OpKind::FusedAttention, operands, *types,
        {g.uniqueName(names[0] + ".packed"), g.uniqueName(names[1] + ".packed")},
        std::move(attrs), op->loc());
    for (unsigned i = 0; i < 2; ++i)
      g.replaceAllUsesWith(op->result(i), fused->result(i));
    g.eraseOp(op);
    for (unsigned i = 0; i < 2; ++i)
      g.rename(fused->result(i), names[i]);
    changed = true;
  }
  return changed || *dead; // the Split and its views are left to dce
}

} // namespace cleave::passes
