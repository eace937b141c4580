// merge-slices: a Slice of a Slice that nothing else reads, over other axes,
// is one Slice of the first's operand. The exporters write x[..., :i, :j]
// as two Slices (one per indexed axis), each a copy, and autodiff then
// gives each a SliceGrad: the inner one a tensor of the middle shape, zeros
// around the outer's rows. The gated delta rule's chunk loop (Qwen3.5,
// OLMo-Hybrid) takes x[..., :i, :i] of its 64 x 64 matrix for every row i.
// One Slice copies only what the pair kept, and its one SliceGrad adds
// into the gradient it is summed with (AccumulateSparseGradients.cpp).
//
// Merged where the outer Slice's axes (made non-negative by the rank both
// share) are none of the inner one's, and the inner result has no other
// use and is not an output: the
// outer's starts and ends then index the inner's operand unchanged, since
// the inner Slice left those axes whole.
#include "passes/Pass.h"
#include "passes/ScalarConstant.h"

#include <set>

namespace cleave::passes {

llvm::Expected<bool> mergeSlices(ir::Graph &g, const PassContext &) {
  using ir::Op;
  using ir::OpKind;
  auto axesOf = [](const Op &op, int64_t rank) {
    std::vector<int64_t> axes = op.getInts("axes");
    for (int64_t &a : axes)
      if (a < 0)
        a += rank;
    return axes;
  };
  auto innerOf = [&](Op *outer) -> Op * {
    if (outer->kind() != OpKind::Slice)
      return nullptr;
    Op *inner = interior(g, outer->operand(0), OpKind::Slice);
    if (!inner)
      return nullptr;
    int64_t rank = int64_t(outer->result()->type().rank());
    std::vector<int64_t> a = axesOf(*inner, rank), b = axesOf(*outer, rank);
    std::set<int64_t> seen(a.begin(), a.end());
    for (int64_t x : b)
      if (x < 0 || x >= rank || !seen.insert(x).second)
        return nullptr;
    return inner;
  };
  std::vector<Op *> outers;
  for (const auto &op : g.ops())
    if (innerOf(op.get()))
      outers.push_back(op.get());
  bool changed = false;
  // In program order: a chain of three merges into its first Slice, each
  // outer taking the merged Slice before it as its inner one.
  for (Op *outer : outers) {
    Op *inner = innerOf(outer);
    if (!inner)
      continue;
    // Slice's four attributes are required (Ops.def): the inner's lists,
    // then the outer's.
    auto joined = [&](std::vector<int64_t> v, const std::vector<int64_t> &w) {
      v.insert(v.end(), w.begin(), w.end());
      return v;
    };
    int64_t rank = int64_t(outer->result()->type().rank());
    ir::AttrMap attrs;
    attrs.insert_or_assign("axes", joined(axesOf(*inner, rank),
                                          axesOf(*outer, rank)));
    for (const char *name : {"starts", "ends", "steps"})
      attrs.insert_or_assign(name, joined(inner->getInts(name),
                                          outer->getInts(name)));
    ir::Value *out = outer->result();
    std::string name = out->name();
    Op *merged = g.insertOpBefore(outer, OpKind::Slice, {inner->operand(0)},
                                  {out->type()}, {}, std::move(attrs),
                                  outer->loc());
    merged->setPhase(outer->phase());
    g.replaceAllUsesWith(out, merged->result());
    g.eraseOp(outer);
    g.eraseOp(inner);
    g.rename(merged->result(), name);
    changed = true;
  }
  return changed;
}

} // namespace cleave::passes
