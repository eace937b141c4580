// batch-major-attention: nn.MultiheadAttention with batch_first=True
// (torchvision's ViT, most encoders built on it) transposes its [B, T, E]
// input to [T, B, E], runs the projections on the T B rows and the
// attention sequence-first (time_major), and transposes the result back:
//
//   X [B, T, E] -> Transpose(1, 0, 2) -> reshapes and Gemms on the rows
//     -> FusedAttention {time_major} -> reshapes and Gemms on the rows
//     -> Transpose(1, 0, 2) -> Y [B, T, E]
//
// Two copies of the activations forward and two backward, and an attention
// whose rows sit B E apart (a page or more: copied into its tiles). Rows
// in either order give the same rows out of every op between (a Gemm on
// rows, a reshape that keeps the rows and regroups the columns), and the
// attention reads [B, T, H, D] as seq_major as well as [T, B, H, D] as
// time_major; so the chain runs on X's own [B, T] row order: the
// Transposes go, the reshapes' [T, B, ...] become [B, T, ...], the
// attention seq_major. Every op computes the same rows in another order
// (the W products add them in that order, and a row may fall in another
// of a GEMM's tiles: the last bits may move).
//
// The match: each value of the chain has one user (the packed attention's
// three operands are one value), the chain is made of Reshapes whose
// operand and result both keep the rows ([T, B, ...] or [T B, ...], the
// columns' count unchanged), Gemms that take the chain's [T B, K] value as
// A (not transposed) with a C broadcast over the rows, and one packed
// time_major FusedAttention, and it ends at the Transpose back.
#include "passes/Pass.h"

#include "ir/TypeRules.h"

#include <map>

namespace cleave::passes {
namespace {

using ir::Op;
using ir::OpKind;
using ir::Value;

bool swapsLeadingAxes(const Op &op) {
  return op.kind() == OpKind::Transpose && op.numOperands() == 1 &&
         op.getInts("perm") == std::vector<int64_t>{1, 0, 2};
}

// How a chain value holds the rows: [T, B, ...] (Split) or [T B, ...]
// (Merged), and the columns after them; or not at all.
enum class Rows { None, Split, Merged };
Rows rowsOf(const ir::Shape &s, int64_t t, int64_t b, int64_t &columns) {
  columns = 1;
  if (s.size() >= 2 && s[0] == t && s[1] == b) {
    for (size_t d = 2; d < s.size(); ++d)
      columns *= s[d];
    return Rows::Split;
  }
  if (s.size() >= 1 && s[0] == t * b) {
    for (size_t d = 1; d < s.size(); ++d)
      columns *= s[d];
    return Rows::Merged;
  }
  return Rows::None;
}

// The one op that reads `v` (any number of times), or null.
Op *soleUser(const ir::Graph &g, const Value *v) {
  if (g.isPinned(v) || v->uses().empty())
    return nullptr;
  Op *user = v->uses()[0].user;
  for (const ir::Use &u : v->uses())
    if (u.user != user)
      return nullptr;
  return user;
}

// The chain from the first Transpose's result to the Transpose back, or
// empty when the ops between are not all row-wise.
std::vector<Op *> chainFrom(const ir::Graph &g, Op *first, int64_t t,
                            int64_t b) {
  std::vector<Op *> chain;
  bool attention = false;
  Value *v = first->result();
  for (;;) {
    Op *u = soleUser(g, v);
    if (!u)
      return {};
    int64_t in = 0, out = 0;
    switch (u->kind()) {
    case OpKind::Reshape:
      if (rowsOf(v->type().shape, t, b, in) == Rows::None ||
          rowsOf(u->result()->type().shape, t, b, out) == Rows::None ||
          in != out)
        return {};
      break;
    case OpKind::Gemm:
      // As A alone: the check after the switch leaves v one use.
      if (u->operand(0) != v || u->getInt("transA") != 0 ||
          v->type().rank() != 2 || v->type().shape[0] != t * b)
        return {};
      // A C with a row of its own for each row would need its rows moved
      // too: only a C broadcast over the rows (a bias) is taken.
      if (u->numOperands() > 2 && u->operand(2)->type().rank() == 2 &&
          u->operand(2)->type().shape[0] != 1)
        return {};
      break;
    case OpKind::FusedAttention:
      // Packed (one value, all three operands), time_major, once.
      if (attention || u->getInt("time_major") == 0 ||
          ir::attentionPackedKvHeads(*u) == 0 || v->uses().size() != 3 ||
          u->operand(0) != v || u->operand(1) != v || u->operand(2) != v)
        return {};
      attention = true;
      break;
    case OpKind::Transpose:
      if (!swapsLeadingAxes(*u) || g.isPinned(u->result()) ||
          rowsOf(v->type().shape, t, b, in) != Rows::Split || !attention)
        return {};
      chain.push_back(u);
      return chain;
    default:
      return {};
    }
    if (u->kind() != OpKind::FusedAttention && v->uses().size() != 1)
      return {};
    chain.push_back(u);
    v = u->result(0);
  }
}

// `s` ([T, B, ...]) as [B, T, ...].
ir::Shape batchFirst(const ir::Shape &s) {
  ir::Shape out = s;
  std::swap(out[0], out[1]);
  return out;
}

} // namespace

llvm::Expected<bool> batchMajorAttention(ir::Graph &g,
                                         const PassContext &ctx) {
  auto dead = eliminateDeadCode(g, ctx);
  if (!dead)
    return dead.takeError();
  std::vector<std::pair<Op *, std::vector<Op *>>> found;
  for (const auto &op : g.ops()) {
    if (!swapsLeadingAxes(*op))
      continue;
    const ir::Shape &x = op->operand(0)->type().shape; // [B, T, E]
    if (x.size() != 3 || x[0] == 1 || x[1] == 1 || x[0] == x[1])
      continue; // rows that read the same either way round, or ambiguous
    std::vector<Op *> chain = chainFrom(g, op.get(), x[1], x[0]);
    if (!chain.empty())
      found.push_back({op.get(), std::move(chain)});
  }
  for (auto &[first, chain] : found) {
    const int64_t t = first->operand(0)->type().shape[1],
                  b = first->operand(0)->type().shape[0];
    // The chain again on X itself (old value -> new value), but for the
    // Transpose back, which the new chain's end replaces.
    std::map<Value *, Value *> now{{first->result(), first->operand(0)}};
    Op *back = chain.back();
    chain.pop_back();
    for (Op *op : chain) {
      std::vector<Value *> operands;
      for (unsigned i = 0; i < op->numOperands(); ++i) {
        auto it = now.find(op->operand(i));
        operands.push_back(it == now.end() ? op->operand(i) : it->second);
      }
      ir::AttrMap attrs = op->attrs();
      std::vector<ir::TensorType> types;
      for (unsigned i = 0; i < op->numResults(); ++i)
        types.push_back(op->result(i)->type());
      int64_t columns = 0;
      if (op->kind() == OpKind::Reshape &&
          rowsOf(types[0].shape, t, b, columns) == Rows::Split) {
        types[0].shape = batchFirst(types[0].shape);
        attrs.insert_or_assign(
            "shape", ir::Attribute(std::vector<int64_t>(
                         types[0].shape.begin(), types[0].shape.end())));
      } else if (op->kind() == OpKind::FusedAttention) {
        attrs.erase("time_major");
        attrs.insert_or_assign("seq_major", ir::Attribute(int64_t(1)));
        types[0].shape = batchFirst(types[0].shape); // O; L keeps [B, H, T]
      }
      std::vector<std::string> names;
      for (unsigned i = 0; i < op->numResults(); ++i)
        names.push_back(g.uniqueName(op->result(i)->name() + ".bt"));
      Op *made = g.insertOpBefore(op, op->kind(), operands, types, names,
                                  std::move(attrs), op->loc());
      for (unsigned i = 0; i < op->numResults(); ++i)
        now[op->result(i)] = made->result(i);
    }
    g.replaceAllUsesWith(back->result(), now.at(back->operand(0)));
    g.eraseOp(back);
    // The old chain, unread now, from its end back; the new ops take its
    // names.
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      Op *op = *it;
      std::vector<std::pair<Value *, std::string>> renames;
      for (unsigned i = 0; i < op->numResults(); ++i) {
        Value *old = op->result(i), *made = now.at(old);
        g.replaceAllUsesWith(old, made); // (the attention's L)
        renames.push_back({made, old->name()});
      }
      g.eraseOp(op);
      for (auto &[v, name] : renames)
        g.rename(v, name);
    }
    g.eraseOp(first);
  }
  return !found.empty() || *dead;
}

} // namespace cleave::passes
